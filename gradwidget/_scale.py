"""THE colour scale of gradwidget (log10, one range over every step and layer), shared by the live
panel (sent in ``meta["scale"]``), its static copy and every figure; numpy only, so the panel never
loads matplotlib for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .schema import metric_index

if TYPE_CHECKING:
    from .run import Run


#: most cells ``color_range`` reads; a larger array is read at an even stride (the 1st..99th
#: percentiles of a million evenly spread cells are the whole array's to a fraction of a percent).
SCALE_MAX_CELLS = 1 << 20


def log_levels(values: np.ndarray) -> tuple[float, float]:
    """The log10 range used for colour/intensity: 1st..99th percentile of finite positive values."""
    v = values[np.isfinite(values) & (values > 0)]
    if v.size == 0:
        return (0.0, 1.0)
    lo, hi = np.percentile(np.log10(v), [1, 99])
    return (float(lo), float(hi if hi > lo else lo + 1.0))


def color_range(values: np.ndarray) -> tuple[float, float]:
    """THE colour scale: ``(lo, hi)`` in log10, the 1st..99th percentile of log10 of the finite,
    non-zero cells of ``values`` (``log_levels``), over every step and layer at once. ``(0, 1)``
    when there is no such cell."""
    v = np.asarray(values).ravel()
    if v.size > SCALE_MAX_CELLS:
        v = v[:: -(-v.size // SCALE_MAX_CELLS)]
    return log_levels(v)


def color_scale(run: Run, metric: str = "grad_norm") -> tuple[float, float]:
    """The log10 range (lo, hi) of the colour scale of a run's metric: ``color_range`` over every
    step of the run, its folded ``history`` included (as the live panel's ``meta["scale"]``)."""
    metric_index(metric)  # a KeyError listing the metrics for any other name
    full = run.with_history()
    return color_range(full.metric(metric)) if full.n_steps else (0.0, 1.0)


def shared_scale(runs: Sequence[Run], metric: str = "grad_norm") -> tuple[float, float]:
    """One log10 colour range over every step of several runs (a comparison: equal colours mean
    equal values in every run's heatmap)."""
    metric_index(metric)
    full = [r.with_history() for r in runs]
    return color_range(np.concatenate([r.metric(metric).ravel() for r in full if r.n_steps] or [np.zeros(0)]))


def diff_limit(log_ratio: np.ndarray) -> float:
    """The difference map's symmetric range in decades: the 99th percentile of |log10 ratio| (at
    least 0.1, so noise around no change stays pale); the live panel sends it as ``meta.diff_max``."""
    v = np.abs(np.asarray(log_ratio, np.float64))
    v = v[np.isfinite(v)]
    return float(max(np.percentile(v, 99), 0.1)) if v.size else 1.0
