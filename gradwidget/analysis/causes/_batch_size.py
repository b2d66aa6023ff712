"""What ``batch_too_small`` and ``batch_too_large`` share: both compare the batch the optimizer steps
with against the gradient noise scale B_simple (``Context.noise``, from ``..noise_scale``: the
gradient seen at two batch sizes per step, ``run.noise``). A run recorded without two batch sizes
(one backward per step, one process) has neither.

The bound: ``Thresholds.batch_noise_far`` times (10, and why, is written there), on the side the
whole 95% interval of B_simple is on, for the last ``noise_series.NOISE_MIN_ROWS`` measured rows or more
(``first_step`` is where that stretch began). Information (Low priority), never a fault: both train.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ...noise_series import NOISE_MIN_ROWS
from ..noise_scale import NoiseScale, interval_text
from ._base import Context, Diagnosis


def suggested_range(b_simple: float) -> tuple[float, float]:
    """The batch sizes to try: half the noise scale to the noise scale (around the critical batch)."""
    return b_simple / 2, b_simple


def _since(steps: np.ndarray, cond: np.ndarray) -> int | None:
    """The step where the final stretch of ``cond`` (True at the last row) began, if it is long enough."""
    if not len(cond) or not cond[-1]:
        return None
    off = np.flatnonzero(~cond)
    start = off[-1] + 1 if len(off) else 0
    return int(steps[start]) if len(cond) - start >= NOISE_MIN_ROWS else None


def _evidence(ns: NoiseScale, far: float, direction: str) -> str:
    b, lo, hi = ns.last
    what = f"≈ {b:,.0f} examples" if np.isfinite(b) else f"at least {lo:,.0f} examples (|G|² barely resolved)"
    groups = ""
    if ns.groups:
        g = {k: v[0] for k, v in ns.groups.items() if np.isfinite(v[0])}
        if len(g) > 1:
            lo_k, hi_k = min(g, key=lambda k: g[k]), max(g, key=lambda k: g[k])
            groups = f"; by module: {hi_k} {g[hi_k]:,.0f}, {lo_k} {g[lo_k]:,.0f}"
    return (
        f"gradient noise scale B_simple {what} (95% interval {interval_text(lo, hi)}; {ns.window_text}) "
        f"against a batch of {ns.b_big:,.0f} per step: {far:.0f}x {direction}"
        f"{groups}; measured from gradients of {ns.b_small:,.0f} and {ns.b_big:,.0f} examples"
        + (f" ({ns.how})" if ns.how else "")
    )


def find_batch(c: Context, small: bool) -> Diagnosis | None:
    """``batch_too_small`` (``small``) or ``batch_too_large`` when the evidence holds."""
    ns = c.noise
    if ns is None or ns.rows < NOISE_MIN_ROWS:
        return None
    B, far_bound = ns.b_big, c.t.batch_noise_far
    with np.errstate(invalid="ignore", divide="ignore"):
        cond = (ns.lo > far_bound * B) if small else (far_bound * ns.hi < B)
    first = _since(ns.steps, np.nan_to_num(cond, nan=0).astype(bool))
    if first is None:
        return None
    b, lo, _ = ns.last
    far = (b if np.isfinite(b) else lo) / B if small else B / b
    return Diagnosis(
        "batch_too_small" if small else "batch_too_large",
        "Low",
        [],
        first,
        _evidence(ns, far, "below it" if small else "above it"),
        float(np.clip(np.log10(far / far_bound), 0, 1) * 0.5 + 0.5),
    )


def batch_action(template: str) -> Callable[[Diagnosis, Context], str]:
    """The action of a batch cause: ``template`` with ``{span}``, the batch sizes to try (half the
    noise scale to the noise scale)."""

    def action(d: Diagnosis, c: Context) -> str:
        ns = c.noise
        if ns is None:
            return "compare the batch size with the gradient noise scale"
        b, floor, _ = ns.last
        lo, hi = suggested_range(b if np.isfinite(b) else floor)
        return template.format(span=f"{lo:,.0f}–{hi:,.0f}")

    return action
