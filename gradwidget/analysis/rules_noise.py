"""The batch-size causes, read off the gradient noise scale (``noise_scale``): the batch the
optimizer steps with is far below it (``batch_too_small``: larger batches would train in
proportionally fewer steps) or far above it (``batch_too_large``: most of each step's examples buy
nothing). Information (Low priority), never a fault: both train. A run recorded without the
gradient at two batch sizes (one backward per step, one process) has no such cause.

The bound: ``BATCH_FAR`` times, on the side the whole 95% interval of B_simple is on, for the last
``noise_scale.MIN_ROWS`` rows or more (``first_step`` is where that stretch began). Why 10: the
critical batch size only marks where the trade-off between steps and examples turns (McCandlish et
al. 2018: a batch of B_crit takes twice the minimum steps and twice the minimum examples); within a
factor of a few either way the trade is mild, beyond 10x one side costs 10x.
"""

from __future__ import annotations

import numpy as np

from .noise_scale import MIN_ROWS, noise_scale
from .vocabulary import Cause, Context

#: how many times the batch must be from B_simple (beyond its 95% interval) to be named
BATCH_FAR = 10.0


def suggested_range(b_simple: float) -> tuple[float, float]:
    """The batch sizes to try: half the noise scale to the noise scale (around the critical batch)."""
    return b_simple / 2, b_simple


def _since(steps: np.ndarray, cond: np.ndarray) -> int | None:
    """The step where the final stretch of ``cond`` (True at the last row) began, if it is long enough."""
    if not len(cond) or not cond[-1]:
        return None
    off = np.flatnonzero(~cond)
    start = off[-1] + 1 if len(off) else 0
    return int(steps[start]) if len(cond) - start >= MIN_ROWS else None


def _evidence(ns, far: float, direction: str) -> str:
    b, lo, hi = ns.last
    span = f"{lo:,.0f}–{hi:,.0f}" if np.isfinite(hi) else f"at least {lo:,.0f}"
    what = f"≈ {b:,.0f} examples" if np.isfinite(b) else f"at least {lo:,.0f} examples (|G|² barely resolved)"
    groups = ""
    if ns.groups:
        g = {k: v[0] for k, v in ns.groups.items() if np.isfinite(v[0])}
        if len(g) > 1:
            lo_k, hi_k = min(g, key=lambda k: g[k]), max(g, key=lambda k: g[k])
            groups = f"; by module: {hi_k} {g[hi_k]:,.0f}, {lo_k} {g[lo_k]:,.0f}"
    return (
        f"gradient noise scale B_simple {what} (95% interval {span}; EMA over {ns.ema_steps} "
        f"steps, {ns.rows} measured) against a batch of {ns.b_big:,.0f} per step: {far:.0f}x {direction}"
        f"{groups}; measured from gradients of {ns.b_small:,.0f} and {ns.b_big:,.0f} examples"
        + (f" ({ns.how})" if ns.how else "")
    )


def _batch(c: Context, small: bool) -> Cause | None:
    ns = noise_scale(c.run)
    if ns is None or ns.rows < MIN_ROWS:
        return None
    B = ns.b_big
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = (ns.lo > BATCH_FAR * B) if small else (BATCH_FAR * ns.hi < B)
    first = _since(ns.steps, np.nan_to_num(cond, nan=0).astype(bool))
    if first is None:
        return None
    b, lo, _ = ns.last
    far = (b if np.isfinite(b) else lo) / B if small else B / b
    return Cause(
        "batch_too_small" if small else "batch_too_large",
        "Low",
        [],
        first,
        _evidence(ns, far, "below it" if small else "above it"),
        float(np.clip(np.log10(far / BATCH_FAR), 0, 1) * 0.5 + 0.5),
    )


def _batch_too_small(c: Context) -> Cause | None:
    return _batch(c, small=True)


def _batch_too_large(c: Context) -> Cause | None:
    return _batch(c, small=False)


def action(c: Cause, run) -> str:
    """The change to make: a batch in the suggested range, with the learning rate to match."""
    ns = noise_scale(run)
    if ns is None:
        return "compare the batch size with the gradient noise scale"
    b, floor, _ = ns.last
    lo, hi = suggested_range(b if np.isfinite(b) else floor)
    if c.cause == "batch_too_small":
        return (
            f"if the hardware has room, raise the batch towards {lo:,.0f}–{hi:,.0f} examples per step (gradient "
            "accumulation works) and scale the learning rate up with it (about linearly for SGD, by the square "
            "root for Adam): the same examples then train in far fewer steps"
        )
    return (
        f"lower the batch to about {lo:,.0f}–{hi:,.0f} examples per step (with the learning rate scaled down to "
        "match): beyond the noise scale each step's extra examples buy little, so the same number of steps "
        "needs far fewer examples"
    )


#: the rules of this module, by cause
RULES = {"batch_too_small": _batch_too_small, "batch_too_large": _batch_too_large}
