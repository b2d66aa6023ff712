"""The rules every view of a Run applies, written once: which layer-steps are flagged (the Run's
``vanishing()/exploding()/nonfinite()`` and the panel's flag bits), which parameters the loss
cannot move (``cannot_move``: never flagged vanishing or dead), how steps fold into one
(``Run.downsample_by``, the folded history, the panel's columns) and which recorded step is
nearest a step the user names.
"""

from __future__ import annotations

import math

import numpy as np

from .thresholds import Thresholds

#: how each metric is combined when several steps fold into one (downsampling, history, columns).
_REDUCE = {"max_abs": "max", "nonfinite": "max"}


def fold_of(metric: str) -> str:
    """How ``metric`` is combined when several steps fold into one: ``max`` for max |g| and
    non-finite counts (a spike must survive the fold), ``mean`` otherwise."""
    return _REDUCE.get(metric, "mean")


def reduce_blocks(a: np.ndarray, k: int, how: str = "mean", starts: np.ndarray | None = None) -> np.ndarray:
    """Fold consecutive groups of ``k`` rows of ``a`` (the last may be shorter), or the groups
    beginning at the row indices ``starts`` (increasing, the first 0: a comparison's columns).

    ``mean`` averages the finite values (NaN when a block has none; +Inf when it has only +Inf):
    NaN is "not recorded", so one missing step must not blank a block, and an Inf is kept by the
    non-finite counts (folded by ``max``) and the flags. ``max`` takes the largest value ignoring
    NaN, ``first`` the block's first row (steps), ``or`` ORs integer bit flags.
    """
    if how not in ("mean", "max", "first", "or"):
        raise ValueError(f"how must be 'mean', 'max', 'first' or 'or', not {how!r}")
    n = a.shape[0]
    if n == 0:
        return a[:0].copy()
    uniform = starts is None
    starts = np.arange(0, n, max(1, int(k))) if starts is None else np.asarray(starts, np.intp)
    if how == "or":
        return np.bitwise_or.reduceat(a, starts, axis=0)
    if uniform and k <= 1:
        return a.copy()
    if how == "first":
        return a[starts].copy()
    if how == "max":
        nan = np.isnan(a)
        out = np.maximum.reduceat(np.where(nan, -np.inf, a), starts, axis=0)
        return np.where(np.logical_and.reduceat(nan, starts, axis=0), np.nan, out).astype(a.dtype)
    finite = np.isfinite(a)
    sums = np.add.reduceat(np.where(finite, a, 0).astype(np.float64), starts, axis=0)
    cnt = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
    posinf = np.logical_or.reduceat(np.isposinf(a), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums / cnt
    out = np.where(cnt > 0, out, np.where(posinf, np.inf, np.nan))
    return out.astype(a.dtype)


# The flag rules work on metric arrays, so that the panel's folded arrays (history + window) get
# the very rules ``Run.vanishing()/exploding()/nonfinite()`` apply to a run.
def vanishing_flags(mean_abs: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    """The vanishing rule: mean |g| below the vanishing threshold (NaN, no data, is not flagged)."""
    with np.errstate(invalid="ignore"):
        return mean_abs < thresholds.vanishing


def vanishing_mask(mean_abs: np.ndarray, thresholds: Thresholds, trainable: np.ndarray) -> np.ndarray:
    """``vanishing_flags`` on trainable layers only (a frozen layer's zero is no problem)."""
    return vanishing_flags(mean_abs, thresholds) & trainable[None, :]


#: machine epsilon of each floating dtype a parameter may have (numpy knows no bfloat16).
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
#: evenly spaced recorded steps (the first among them) ``Run.cannot_move`` judges a run on: the
#: shares it reads are then known to about 1%, at a cost bounded whatever the run's length.
CANNOT_MOVE_ROWS = 256
#: the state of a parameter the loss cannot move, in every health table: normal, not a finding.
CANNOT_MOVE = "Cannot move"
#: the text that says why a parameter "cannot move", wherever its state is shown.
CANNOT_MOVE_WHY = (
    "the loss cannot move it (zero by construction): its gradient stays at float rounding next to its "
    "module's other parameters on nearly every step, e.g. an attention key bias (softmax ignores a shift shared "
    "by all keys) or a bias right before BatchNorm (the norm subtracts it again)"
)


def rounding_ratio(dtype: str) -> float:
    """How far below its module's gradient a parameter's gradient is float rounding, not signal:
    sqrt(eps) of its dtype, the midpoint in orders of magnitude between rounding (eps, where a sum
    that cancels exactly by the model's symmetry ends up) and a gradient as large as its module's
    (1). float32: 3.5e-4, bfloat16: 0.088, float16: 0.031; 0 (never) for a dtype without an entry."""
    return math.sqrt(EPS.get(str(dtype), 0.0))


def cannot_move(
    mean_abs: np.ndarray,
    zero_frac: np.ndarray,
    nonfinite: np.ndarray,
    module: np.ndarray,
    limit: np.ndarray,
    trainable: np.ndarray,
    thresholds: Thresholds,
) -> np.ndarray:
    """Per layer: a parameter the loss cannot move, its gradient zero up to float rounding by the
    model's symmetry (an attention key bias, a bias before BatchNorm), whatever its name.

    ``mean_abs``, ``zero_frac``, ``nonfinite``: ``(rows, layers)`` from the first recorded step on
    (evenly spaced steps of a long run; a step with a NaN/Inf gradient counts, as one that is not
    rounding); ``module``: ``(layers,)`` ids, equal for the tensors of one module;
    ``limit``: ``(layers,)`` ``rounding_ratio`` of each one's dtype. A step's *reference* is the
    largest mean |g| among the module's trainable tensors with a gradient that is not (all) exact
    zeros. A trainable layer cannot move when its mean |g| is at most ``limit`` times the reference,
    and not exact zeros, on its first step with a gradient and on all but ``minor_issue_ratio`` of
    its steps, and the reference itself is below ``vanishing`` on fewer than ``critical_issue_ratio``
    of them (a module starved on most steps is the module's problem; a small random-init
    transformer's key weight dips below ``vanishing`` on 10-20% of steps while its bias is
    rounding). What this tells apart: a vanishing region of a deep sigmoid net fades weight and
    bias together (ratio about 1, and the reference vanishes too); a dead ReLU layer's module is
    exact zeros (no reference), and the next layer's weight, fed only zeros, is exact zeros beside
    its live bias; a starved layer whatever its name shares its module's fate."""
    L = mean_abs.shape[1] if mean_abs.ndim == 2 else 0
    out = np.zeros(L, bool)
    if not L or not mean_abs.shape[0]:
        return out
    module = np.asarray(module)
    order = np.argsort(module, kind="stable")
    m = module[order]
    starts = np.flatnonzero(np.r_[True, m[1:] != m[:-1]])
    sizes = np.diff(np.r_[starts, L])
    if not (sizes > 1).any():  # no module with two tensors: nothing to compare with
        return out
    # layers as rows (contiguous), in module order: the per-module reductions run along axis 0
    a = np.asarray(mean_abs, np.float32).T[order]
    tr = np.asarray(trainable, bool)[order]
    with np.errstate(invalid="ignore"):
        usable = (a > 0) & (np.asarray(zero_frac).T[order] < thresholds.dead_zero_fraction) & tr[:, None]
        v = np.where(usable, a, np.float32(-np.inf))
        ref = v[starts]  # each module's largest usable mean |g| (one pass per member position:
        for j in range(1, int(sizes.max())):  # numpy's reduceat is 30x slower over many small modules)
            g = np.flatnonzero(sizes > j)
            ref[g] = np.maximum(ref[g], v[starts[g] + j])
        ref = np.repeat(ref, sizes, axis=0)
        known = ~np.isnan(a) | (np.asarray(nonfinite).T[order] > 0)  # a gradient, finite or not
        # rounding noise is not exact zeros: a tensor all zeros beside a live one is dead (a weight
        # whose input is all zeros), not invariant; NaN/Inf is not rounding either
        low = usable & np.isfinite(a) & (ref > 0) & (a <= np.asarray(limit, np.float32)[order][:, None] * ref)
        n_known = np.maximum(known.sum(axis=1), 1)
        at_first = low[np.arange(L), np.argmax(known, axis=1)]  # on the first step with a gradient
        share_low = low.sum(axis=1) / n_known
        weak_ref = (known & ~(ref >= thresholds.vanishing)).sum(axis=1) / n_known
    out[order] = (
        tr
        & known.any(axis=1)
        & at_first
        & (share_low >= 1 - thresholds.minor_issue_ratio)
        & (weak_ref < thresholds.critical_issue_ratio)
    )
    return out


def over_threshold_mask(max_abs: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    """The exploding rule's threshold: max |g| above it (``exploding_flags`` adds the non-finite steps)."""
    with np.errstate(invalid="ignore"):
        return max_abs > thresholds.exploding


def exploding_flags(max_abs: np.ndarray, nonfinite: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    """The exploding rule: max |g| above the exploding threshold, or a NaN/Inf in the gradient."""
    return over_threshold_mask(max_abs, thresholds) | nonfinite_mask(nonfinite)


def nonfinite_mask(nonfinite: np.ndarray) -> np.ndarray:
    """The step's gradient had at least one NaN or Inf."""
    return nonfinite > 0


def nearest_index(steps: np.ndarray, step: int) -> int:
    """Position in the sorted, non-empty ``steps`` of the one nearest ``step`` (ties to the earlier)."""
    if len(steps) == 0:
        raise ValueError("no steps to search")
    i = int(np.searchsorted(steps, step))
    if i >= len(steps):
        return len(steps) - 1
    if i > 0 and step - steps[i - 1] <= steps[i] - step:
        return i - 1
    return i


#: how each metric is combined when several layers merge into one row (a figure or the panel
#: showing 10,000 tensors in groups), each group measured as if its tensors were one: L2 norms in
#: quadrature, mean |g| and the zero fraction weighted by size, max |g| the largest, std from the
#: members' variances weighted by size (their signed means are not recorded), non-finite counts summed.
_MERGE = {
    "grad_norm": "l2",
    "weight_norm": "l2",
    "update_norm": "l2",
    "mean_abs": "weighted",
    "zero_frac": "weighted",
    "max_abs": "max",
    "nonfinite": "sum",
    "std": "pooled",
}


def merge_of(metric: str) -> str:
    """How ``metric`` combines over a group of layers: ``l2``, ``weighted``, ``max``, ``sum`` or ``pooled``."""
    if metric not in _MERGE:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(_MERGE)}")
    return _MERGE[metric]


def merge_layers_at(a: np.ndarray, metric: str, starts: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """Columns (layers) of ``a`` (rows x layers, float32) merged into the groups of consecutive
    layers beginning at ``starts`` (increasing, the first 0), by ``merge_of(metric)``; ``numel``:
    each layer's size (weights). A member with no value (NaN: no gradient that step, an unused
    parameter) is left out, so one unused tensor does not blank its group; NaN when no member has
    a value. Accumulated in float64; float32 out, except a sum (the non-finite counts): float64, exact."""
    starts = np.asarray(starts, np.intp)
    a = np.asarray(a)
    how = merge_of(metric)
    if how == "max":  # fmax skips NaN, and is NaN where every member is
        return np.fmax.reduceat(a, starts, axis=1).astype(np.float32)
    f64 = np.float64
    has = ~np.isnan(a)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if how == "sum":
            out = np.add.reduceat(np.where(has, a, 0), starts, axis=1, dtype=f64)
        elif how == "l2":
            out = np.sqrt(np.add.reduceat(np.where(has, np.square(a, dtype=f64), 0.0), starts, axis=1))
        else:
            w = np.where(has, np.asarray(numel, f64)[None, :], 0.0)
            v = np.where(has, np.square(a, dtype=f64) if how == "pooled" else a, 0.0)
            out = np.add.reduceat(v * w, starts, axis=1) / np.add.reduceat(w, starts, axis=1)
            out = np.sqrt(out) if how == "pooled" else out
        out[~np.logical_or.reduceat(has, starts, axis=1)] = np.nan
    return out if how == "sum" else out.astype(np.float32)
