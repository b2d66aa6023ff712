"""Weight drift, two kinds: ``drift_between(weights, previous)`` compares two snapshots of the weights
(||w - w_prev|| / ||w_prev||); ``drift_from_run(run)`` reads the recorded per-step update/weight
norm ratio (update_norm / weight_norm) of every step it was measured. Both grade the largest drift
against the same healthy band of update/weight ratios (``Thresholds.update_ratio_low/high``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..thresholds import Thresholds, as_thresholds


@dataclass
class Drift:
    source: str  #: "snapshots" (weights vs previous) or "recorded updates" (update/weight per step)
    mean_drift: float
    max_drift: float
    severity: str  #: Minimal / Normal / High; NonFinite when a layer's drift is NaN/Inf
    affected_layers: list[str]


def _drift_severity(x: float, t: Thresholds) -> str:
    """Minimal below ``update_ratio_low`` (updates barely move the weights), Normal inside the
    healthy band, High above ``update_ratio_high``; NonFinite for NaN/Inf (diverged weights are not a
    small drift). The original crate split the healthy band into Low and Medium, which read as a
    problem on every healthy run ("severity Medium, affected layers none")."""
    if not np.isfinite(x):
        return "NonFinite"
    if x < t.update_ratio_low:
        return "Minimal"
    return "Normal" if x <= t.update_ratio_high else "High"


def drift_between(weights: dict, previous: dict, thresholds=None) -> Drift:
    """Relative change ||w - w_prev|| / ||w_prev|| per layer between two snapshots."""
    t = as_thresholds(thresholds)
    names, vals = [], []
    for n, w in weights.items():
        if n in previous and np.shape(previous[n]) == np.shape(w):
            p = np.asarray(previous[n], np.float64)
            d = np.linalg.norm(np.asarray(w, np.float64) - p)
            base = np.linalg.norm(p)
            names.append(n)
            vals.append(d / base if base > 0 else (0.0 if d == 0 else np.inf))
    return _drift("snapshots", names, np.asarray(vals, np.float64), t)


def _drift(source: str, names: list[str], v: np.ndarray, t: Thresholds) -> Drift:
    """Mean and max over layers, severity of the max, affected layers (above ``update_ratio_high`` or
    non-finite). Any NaN/Inf drift makes the max non-finite and the severity NonFinite."""
    if not v.size:
        return Drift(source, float("nan"), float("nan"), "Minimal", [])
    bad = ~np.isfinite(v)
    mx = float("inf") if bad.any() else float(v.max())
    mean = float(v[~bad].mean()) if (~bad).any() else float("nan")
    return Drift(
        source, mean, mx, _drift_severity(mx, t), [n for n, x, b in zip(names, v, bad) if b or x > t.update_ratio_high]
    )


def drift_from_run(run, rows: np.ndarray | None = None) -> Drift | None:
    """Per-step update/weight norm ratio recorded in the run (its most recent steps, see
    ``stats.update_ratio_rows``): per layer its median, then the mean and
    max over layers; layers whose median is above ``update_ratio_high`` are affected. None when the
    run never measured updates."""
    from .stats import nanmedian, update_ratio_rows

    r = update_ratio_rows(run) if rows is None else rows
    measured = ~np.isnan(r)  # inf counts as measured: an update or weight that blew up
    ok = measured.any(axis=0)
    if not ok.any():
        return None
    r = r[:, ok]
    med = nanmedian(np.where(np.isinf(r), np.nan, r))
    med = np.where(np.isinf(r).any(axis=0), np.inf, med)
    names = [n for n, k in zip(run.layer_names, ok) if k]
    return _drift("recorded updates", names, np.asarray(med, np.float64), run.thresholds)
