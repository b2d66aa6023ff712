"""What ``batch_too_small`` and ``batch_too_large`` share: both compare the batch the optimizer steps
with against the gradient noise scale B_simple (``Context.noise``, from ``..noise_scale``: the
gradient seen at two batch sizes per step, ``run.noise``). A run recorded without two batch sizes
(one backward per step, one process) has neither.

The bound: the estimate ``Thresholds.batch_noise_far`` times (10) beyond the batch, and its
one-sided 95% bound (``noise_scale.Z_ONE``) ``Thresholds.batch_noise_sure`` times (3) beyond it (why
both, and why those, is written there), decided on what is resolved, for the last
``noise_series.NOISE_MIN_ROWS`` measured rows or more (``first_step`` is where that stretch began):

- ``batch_too_large``: B_simple and its upper bound below the batch / 10 and / 3. It needs |G|²
  resolved (above 0 with its bound), else B_simple has no upper bound.
- ``batch_too_small``: B_simple above 10x the batch and its lower bound above 3x. Where |G|² is
  resolved that is the ratio's bound; where it is not but tr(Σ) is, it is the bound from |G|²'s
  upper bound (one-sided), and the finding says what that is: "the critical batch is at least
  N". Where the average |G|² is not above 0, B_simple's estimate is beyond any batch and the bound
  decides. A batch far below the noise scale is exactly where |G|² is hard to resolve, so this
  side must not wait for it.

Information (Low priority), never a fault: both train.
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


def _evidence(ns: NoiseScale, far: float, direction: str, floor: float | None) -> str:
    b, lo, hi = ns.last
    if floor is not None:  # |G|² not resolved: what the one-sided bound says, then the estimate
        best = f"; estimate ≈ {b:,.0f}" if np.isfinite(b) else ""
        what = (
            f"at least {floor:,.0f} examples (the critical batch is at least {floor:,.0f}: |G|² is not resolved, "
            f"so this is tr(Σ)'s lower bound over |G|²'s upper bound, one-sided 95%{best})"
        )
    else:
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
    B, far_bound, sure = ns.b_big, c.t.batch_noise_far, c.t.batch_noise_sure
    floor = ns.floor if ns.floor is not None else ns.lo
    ceiling = ns.ceiling if ns.ceiling is not None else ns.hi
    with np.errstate(invalid="ignore", divide="ignore"):
        if small:  # the average |G|² not above 0: the estimate is beyond any batch, the bound decides
            est = np.where(np.isfinite(ns.b_simple), ns.b_simple, np.inf)
            cond = (floor > sure * B) & (est > far_bound * B)
        else:
            cond = (sure * ceiling < B) & (far_bound * ns.b_simple < B)
    first = _since(ns.steps, np.nan_to_num(cond, nan=0).astype(bool))
    if first is None:
        return None
    b = ns.last[0]
    bound = None
    if small and not np.isfinite(ceiling[-1]):  # |G|² not resolved: the lower bound is what is known
        bound = float(floor[-1])
    far = (b if np.isfinite(b) else float(floor[-1])) / B if small else B / b
    return Diagnosis(
        "batch_too_small" if small else "batch_too_large",
        "Low",
        [],
        first,
        _evidence(ns, far, "below it" if small else "above it", bound),
        float(np.clip(np.log10(far / far_bound), 0, 1) * 0.5 + 0.5),
    )


def batch_action(template: str) -> Callable[[Diagnosis, Context], str]:
    """The action of a batch cause: ``template`` with ``{span}``, the batch sizes to try (half the
    noise scale to the noise scale)."""

    def action(d: Diagnosis, c: Context) -> str:
        ns = c.noise
        if ns is None:
            return "compare the batch size with the gradient noise scale"
        b, floor, hi_ = ns.last
        if not np.isfinite(hi_) and ns.floor is not None:  # only a lower bound: start from it
            floor = float(ns.floor[-1])
        lo, hi = suggested_range(b if np.isfinite(b) and np.isfinite(hi_) else floor)
        return template.format(span=f"{lo:,.0f}–{hi:,.0f}")

    return action
