"""``missing_zero_grad``: each step's gradient added to the last. Reads the global norm's growth
over the first steps (``evidence.early_growth``) and every layer's smoothing over the first 40
(``evidence.accumulation_smoothing``). Its bounds were set on the zoo's calibration cases (healthy
runs sit well inside every one)."""

from __future__ import annotations

import numpy as np

from ..evidence import accumulation_smoothing, early_growth
from ._base import CauseRule, Context, Diagnosis
from ._shared import growing_first, start_step

#: the global norm grows like (step + 1)^p at the start; p at or above this, rising on this share of
#: the first steps, and at least GROWTH_FACTOR larger by the end of them: gradients accumulate.
ACCUMULATION_EXPONENT = 0.75
ACCUMULATION_RISING = 0.85
GROWTH_FACTOR = 3.0
#: ... and never growing more than this much in one step (a diverging run grows geometrically).
ACCUMULATION_MAX_STEP_RATIO = 2.5
#: ... with the second step's norm about twice the first's: its gradient was added to the first one
#: (a healthy network whose gradients grow as it learns grows by a steady factor, ~1.3 a step).
ACCUMULATION_FIRST_RATIO = (1.6, 2.5)
#: the running-sum fingerprint over the first 40 steps: late per-layer change at most this (healthy
#: zoo runs: 0.10 and up), early change this many times the late one, the global norm grown this
#: many times, and rising on this share of layer-steps.
SMOOTH_LATE_CHANGE = 0.07
SMOOTH_EARLY_FACTOR = 2.0
SMOOTH_GROWTH = 10.0
SMOOTH_RISING = 0.7


def find(c: Context) -> Diagnosis | None:
    """Two fingerprints of gradients summed over steps: at the very start the norm doubles at the
    second step and grows like the step count (consecutive gradients still point the same way);
    over the first 40 steps every layer's norm grows smoothly, its step-to-step change shrinking
    like 1/step, while batch noise keeps a healthy layer changing by 10-50% a step."""
    run = c.run
    gr = early_growth(run)
    sm = accumulation_smoothing(run)
    parts = []
    conf = 0.0
    if gr is not None and (
        gr.exponent >= ACCUMULATION_EXPONENT
        and gr.rising >= ACCUMULATION_RISING
        and gr.max_step_ratio <= ACCUMULATION_MAX_STEP_RATIO
        and gr.power_law
        and ACCUMULATION_FIRST_RATIO[0] <= gr.first_ratio <= ACCUMULATION_FIRST_RATIO[1]
    ):
        g = run.scalar("global_norm")[:20]
        g = g[np.isfinite(g)]
        if g.size and g[0] > 0 and g.max() / g[0] >= GROWTH_FACTOR:
            parts.append(
                f"the global gradient norm grows like the step count from the start (x{gr.first_ratio:.2f} "
                f"at the second step, ~(step+1)^{gr.exponent:.2f}, rising on {gr.rising:.0%} of the first "
                f"steps, x{g.max() / g[0]:.1f} within {g.size} steps)"
            )
            conf = float(np.clip((gr.exponent - 0.5) / 0.5, 0, 1))
    if sm is not None and (
        sm.late <= SMOOTH_LATE_CHANGE
        and sm.early >= SMOOTH_EARLY_FACTOR * sm.late
        and sm.growth >= SMOOTH_GROWTH
        and sm.rising >= SMOOTH_RISING
    ):
        parts.append(
            f"every layer's gradient norm grows smoothly (x{sm.growth:.3g} over the first steps, rising on "
            f"{sm.rising:.0%} of them) and its step-to-step change shrinks from {sm.early:.0%} to "
            f"{sm.late:.1%}, as a running sum's does (batch noise alone keeps it near 10-50%)"
        )
        conf = max(conf, float(np.clip(1 - sm.late / SMOOTH_LATE_CHANGE, 0.5, 1)))
    if not parts:
        return None
    return Diagnosis(
        "missing_zero_grad",
        "High",
        growing_first(run),
        start_step(run),
        "; ".join(parts) + ": each step's gradient is added to the last",
        conf,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "call optimizer.zero_grad() once per optimizer step, before loss.backward() (to accumulate on "
        "purpose, zero every N micro-batches and divide the loss by N)"
    )


RULE = CauseRule(
    "missing_zero_grad",
    "gradients never reset (zero_grad missing)",
    find,
    action,
    explains=("lr_too_high", "exploding", "nonfinite", "plateau", "lr_too_low", "dead_units"),
    whole_run=True,
)
