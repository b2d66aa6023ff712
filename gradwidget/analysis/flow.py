"""How gradient moves over time: per-layer flow characteristics, temporal direction, and vanishing /
exploding / dead regions (the original crate's enhanced analysis and flow visualisation).

Fixed from the original crate: characteristics are scale-free (relative changes, coefficient of variation),
and regions are contiguous runs of layers in backward order with their real parameter counts and
durations (the original crate made one region per layer with 1000 parameters).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..rules import exploding_flags, vanishing_flags
from ..run import Run
from .stats import Series, _quiet, dead_flags, lstsq_slope, runs_of_true, trailing_median

#: a norm oscillates only when its detrended lag-1 autocorrelation is below minus this: the
#: alternating part carries more of the variance than the noise (noise alone gives about 0).
ALTERNATION = 0.5


#: steps of the trailing median a layer's norm is compared with for its stability (its trend); even,
#: so a norm that alternates every step cannot be its own trend.
STABILITY_TREND_STEPS = 8


# --------------------------------------------------------------------------- per-layer characteristics
def flow_characteristics(s: Series) -> pd.DataFrame:
    """One row per layer, over the recent window of gradient norms (``Series.recent``):

    - ``consistency`` 1/(1 + mean |Δx|/x_prev) (as the original crate), 1 for a constant series;
    - ``smoothness`` 1/(1 + mean |Δ²x| / mean x) (the original crate's was not scale-free);
    - ``oscillation`` share of consecutive differences that flip sign (1 for an alternating series,
      about 2/3 for plain noise);
    - ``autocorr_lag1`` lag-1 autocorrelation of the linearly detrended log norm: about 0 (within
      1/sqrt(n)) for batch noise, -1 for a norm that alternates up and down;
    - ``oscillating`` when the sign flips on more than ``thresholds.oscillation`` of steps, the
      alternation dominates the noise (``autocorr_lag1`` below -``ALTERNATION`` and 4 standard
      errors from 0) and the norm moves by ``oscillation_amplitude`` of its level per step;
    - ``stability`` 1/(1 + CV) (the original crate's form), with the CV of the norm around its own
      trailing median over ``STABILITY_TREND_STEPS`` steps: a gradient that shrinks tenfold as
      the loss falls is not unstable, one that jumps between steps is; NaN without a gradient;
    - ``bottleneck_score`` 1 - min/mean (as the original crate): how deep the norm dips below its usual level;
    - ``flow_rate`` mean |Δx| / mean x: relative change per step (information flow rate);
    - ``trend_slope`` least-squares slope of log10 norm per user step over the whole run (block-averaged
      copy), ``trend_decades`` the change it implies across the run, ``trend_r2`` its fit;
    - ``direction`` / ``direction_stability`` at the current step (last 3 / 5 recorded steps).
    """
    run, t = s.run, s.run.thresholds
    x = s.recent
    n, L = x.shape
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(x, axis=0)
        d = np.diff(x, axis=0)
        prev = x[:-1]
        rel = np.where(prev > 0, np.abs(d) / np.where(prev > 0, prev, 1.0), np.nan)
        consistency = 1.0 / (1.0 + np.nanmean(rel, axis=0)) if n >= 2 else np.ones(L)
        consistency = np.where(np.isfinite(consistency), consistency, np.where(mean == 0, 1.0, np.nan))
        d2 = np.abs(np.diff(x, n=2, axis=0)) if n >= 3 else np.zeros((0, L))
        smooth = (
            np.where(mean > 0, 1.0 / (1.0 + np.nanmean(d2, axis=0) / mean), np.where(mean == 0, 1.0, np.nan))
            if n >= 3
            else np.ones(L)
        )
        sg = np.sign(d)
        prod = sg[1:] * sg[:-1]
        valid = np.sum(np.isfinite(prod), axis=0)
        osc = np.where(valid > 0, np.sum(prod < 0, axis=0) / np.maximum(valid, 1), 0.0) if n >= 4 else np.zeros(L)
        flow_rate = np.where(mean > 0, np.nanmean(np.abs(d), axis=0) / mean, 0.0) if n >= 2 else np.zeros(L)
        around = x / trailing_median(x, STABILITY_TREND_STEPS)
        cv = np.nanstd(around, axis=0) / np.nanmean(around, axis=0)
        stability = np.where(mean > 0, 1.0 / (1.0 + cv), np.nan)
        bottleneck = (
            np.where(mean > 0, 1.0 - np.minimum(np.nanmin(x, axis=0) / mean, 1.0), np.where(mean == 0, 1.0, np.nan))
            if n
            else np.full(L, np.nan)
        )
    slope, r2 = lstsq_slope(s.coarse, s.coarse_steps)
    span = float(run.steps[-1] - run.steps[0]) if run.n_steps > 1 else 0.0
    decades = slope * span
    r1, pairs = lag1_autocorrelation(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        alternates = r1 < -np.maximum(ALTERNATION, 4 / np.sqrt(np.maximum(pairs, 1)))
    oscillating = (osc > t.oscillation) & alternates & (flow_rate > t.oscillation_amplitude) & (valid > 0)
    trend = np.where(
        ~np.isfinite(decades),
        "n/a",
        np.where(
            oscillating,
            "oscillating",
            np.where(decades > t.trend_decades, "rising", np.where(decades < -t.trend_decades, "falling", "flat")),
        ),
    )
    direction, dstab = temporal_direction(x, t.plateau_rel_change)
    return pd.DataFrame(
        {
            "layer": run.layer_names,
            "consistency": consistency,
            "smoothness": smooth,
            "oscillation": osc,
            "autocorr_lag1": r1,
            "oscillating": oscillating,
            "stability": stability,
            "bottleneck_score": bottleneck,
            "flow_rate": flow_rate,
            "trend_slope": slope,
            "trend_decades": decades,
            "trend_r2": r2,
            "trend": trend,
            "direction": direction,
            "direction_stability": dstab,
            "magnitude": x[-1] if n else np.full(L, np.nan),
        }
    )


def lag1_autocorrelation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column: the lag-1 autocorrelation of log10 of the positive values after removing their
    least-squares line, and how many consecutive pairs it is measured on (NaN with fewer than 3)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(x > 0, np.log10(np.where(x > 0, x, 1.0)), np.nan)
    slope, _ = lstsq_slope(y)
    t = np.arange(y.shape[0], dtype=np.float64)[:, None]
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        e = y - slope * t
        e = e - np.nanmean(e, axis=0)
        both = np.isfinite(e[1:]) & np.isfinite(e[:-1])
        pairs = both.sum(axis=0)
        num = np.where(both, e[1:] * e[:-1], 0.0).sum(axis=0)
        den = np.where(np.isfinite(e), e * e, 0.0).sum(axis=0)
        r1 = np.where((pairs >= 3) & (den > 0), num / np.where(den > 0, den, 1.0), np.nan)
    return r1, pairs


def directions(x: np.ndarray, stagnant_rel: float) -> np.ndarray:
    """Direction of each column's norm at every row (the original crate's per-step ``FlowDirection``), from the
    row and the two before it: Oscillating when the two differences have opposite signs (and one of
    them is above ``stagnant_rel`` of the level), else Stagnant when the net change is below
    ``stagnant_rel`` of the level, else Forward (growing) / Backward (shrinking). The first two rows
    (no history) and rows without a finite change are Stagnant."""
    n, L = x.shape
    out = np.full((n, L), "Stagnant", dtype=object)
    if n < 3:
        return out
    a, b, c = x[:-2], x[1:-1], x[2:]
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        level = np.abs(np.nanmean(np.stack([a, b, c]), axis=0))
        change = c - a
        stag = ~(np.abs(change) > stagnant_rel * level)
        swing = np.maximum(np.abs(b - a), np.abs(c - b)) > stagnant_rel * level
        osc = ((b - a) * (c - b) < 0) & swing
        d = np.where(osc, "Oscillating", np.where(stag, "Stagnant", np.where(change > 0, "Forward", "Backward")))
    out[2:] = np.where(np.isfinite(change) | stag, d, "Stagnant")
    return out


def temporal_direction(x: np.ndarray, stagnant_rel: float) -> tuple[np.ndarray, np.ndarray]:
    """Direction of each column's norm at its last row (the original crate's ``get_latest_flow_direction``, see
    ``directions``) and its stability: 1/(1 + CV) of the last 5 values (the original crate used the raw
    variance). Fewer than 3 rows: Stagnant with stability NaN."""
    n, L = x.shape
    if n < 3:
        return np.full(L, "Stagnant", dtype=object), np.full(L, np.nan)
    out = directions(x[-3:], stagnant_rel)[-1]
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        last = x[-5:]
        m = np.nanmean(last, axis=0)
        stab = np.where(m > 0, 1.0 / (1.0 + np.nanstd(last, axis=0) / np.where(m > 0, m, 1)), np.nan)
    return out, stab


def direction_series(run: Run, layer: str | int) -> pd.DataFrame:
    """One layer's per-step direction (the original crate's ``GradientDirection`` per step): step, gradient norm,
    direction (``directions``) and consistency 1 - |Δ| / (x + x_prev) (the original crate; 1 at the first step and
    for two zero norms). O(steps) for one layer, so it is computed on demand, not in every Report."""
    i = run.layer_names.index(layer) if isinstance(layer, str) else int(layer)
    x = np.asarray(run.metric("grad_norm")[:, i], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.abs(np.diff(x))
        tot = x[1:] + x[:-1]
        cons = np.concatenate(
            [[1.0], np.where(tot > 0, 1 - d / np.where(tot > 0, tot, 1), np.where(d == 0, 1.0, np.nan))]
        )
    return pd.DataFrame(
        {
            "step": run.steps,
            "magnitude": x,
            "direction": directions(x[:, None], run.thresholds.plateau_rel_change)[:, 0],
            "consistency": cons[: x.size],
        }
    )


# --------------------------------------------------------------------------- regions
@dataclass
class Region:
    kind: str  #: "vanishing", "exploding" or "dead"
    layers: list[str]  #: in backward order (loss side first)
    start_layer: str  #: first layer in backward order
    end_layer: str  #: last layer in backward order
    parameters: int  #: sum of the layers' numel
    duration_steps: int  #: recorded steps in which at least one of its layers was flagged
    first_step: int
    last_step: int
    active_now: bool  #: flagged at the last recorded step
    share: float  #: mean share of steps its layers were flagged
    severity: str  #: "Critical" or "Moderate"
    recovery: str = ""  #: dead zones: "Low" / "Medium" / "High" (the original crate's RecoveryPotential)
    intervention_required: bool = False
    mitigation_suggestions: list[str] = field(default_factory=list)  #: what to do, with its numbers


def mitigation(r: Region, s: Series, cols: np.ndarray) -> list[str]:
    """The original crate's (flow visualisation) mitigation suggestions for one region, naming its layers and the measured values
    that put it there (the original crate gave every region the same three strings)."""
    t, span = s.run.thresholds, f"{r.start_layer} … {r.end_layer}" if len(r.layers) > 1 else r.start_layer
    if r.kind == "vanishing":
        with _quiet():
            m = float(np.nanmedian(s.stat("mean_abs", "median")[cols]))
        out = [
            f"re-initialise {span} with a gain that matches the activation: median mean |g| {m:.3g} "
            f"is below {t.vanishing:g}"
        ]
        if len(r.layers) > 1:
            out.append(f"add residual (skip) connections or normalisation across the {len(r.layers)} layers {span}")
        return out
    if r.kind == "exploding":
        ex = s.exact
        mx = (
            float(np.nanmax(ex["max_abs_finite"][cols]))
            if np.isfinite(ex["max_abs_finite"][cols]).any()
            else float("nan")
        )
        nf = int(ex["nonfinite_total"][cols].sum())
        return [
            f"clip gradients (torch.nn.utils.clip_grad_norm_): |g| reached {mx:.3g} in {span} (> {t.exploding:g})"
            + (f", and {nf} entries were NaN/Inf" if nf else ""),
            f"lower the learning rate: the region was flagged on {r.duration_steps} steps "
            f"({r.first_step}–{r.last_step})",
        ]
    return [
        f"units in {span} are dead ({r.share:.0%} of steps with at least {t.dead_zero_fraction:.0%} exact "
        "zeros): use LeakyReLU/GELU or re-initialise the biases feeding them",
        "lower the learning rate: large updates can push units permanently off"
        if r.active_now
        else "the zone has recovered: watch it, no change needed yet",
    ]


def _step_flags(run: Run, kind: str, cols) -> np.ndarray:
    t = run.thresholds
    with np.errstate(invalid="ignore"):
        if kind == "vanishing":
            return vanishing_flags(run.metric("mean_abs")[:, cols], t)
        if kind == "exploding":
            return exploding_flags(run.metric("max_abs")[:, cols], run.metric("nonfinite")[:, cols], t)
        return dead_flags(run.metric("zero_frac")[:, cols], run.metric("grad_norm")[:, cols], t)


def regions(s: Series) -> list[Region]:
    """Vanishing regions, exploding regions and dead zones: maximal runs of adjacent trainable layers
    (depth order, reported in backward order) flagged on at least ``minor_issue_ratio`` of steps
    (exploding: on any step, since one explosion is enough to derail training). Dead layers are not
    also counted in vanishing regions."""
    run, t = s.run, s.run.thresholds
    ex = s.exact
    tr = s.trainable
    shares = {"vanishing": ex["vanishing_share"], "exploding": ex["exploding_share"], "dead": ex["dead_share"]}
    out = []
    for kind, share in shares.items():
        member = np.asarray((share > 0) if kind == "exploding" else (share >= max(t.minor_issue_ratio, 1e-12)))
        if kind == "vanishing":  # exact zeros belong to a dead zone, not a vanishing region
            member &= ~(ex["dead_share"] >= max(t.minor_issue_ratio, 1e-12))
        member = member & tr
        for a, b in runs_of_true(member):
            cols = np.arange(a, b)
            f = np.asarray(_step_flags(run, kind, cols).any(axis=1))
            hit = np.flatnonzero(f)
            if hit.size == 0:
                continue
            names = [run.layer_names[i] for i in cols[::-1]]
            sh = float(share[cols].mean())
            critical = sh >= t.critical_issue_ratio or (kind == "exploding" and ex["nonfinite_share"][cols].max() > 0)
            r = Region(
                kind,
                names,
                names[0],
                names[-1],
                int(sum(run.layers[i].numel for i in cols)),
                int(hit.size),
                int(run.steps[hit[0]]),
                int(run.steps[hit[-1]]),
                bool(f[-1]),
                sh,
                "Critical" if critical else "Moderate",
            )
            if kind == "dead":
                r.recovery = "High" if not f[-1] else ("Low" if sh > t.dead_recovery_share else "Medium")
                r.intervention_required = bool(f[-1] and sh >= t.critical_issue_ratio)
            r.mitigation_suggestions = mitigation(r, s, cols)
            out.append(r)
    return out
