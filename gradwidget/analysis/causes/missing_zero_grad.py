"""``missing_zero_grad``: each step's gradient added to the last. Seen directly by the Recorder
when it holds the optimizer (``run.meta["grad_reset"]``, ``collect/_grad_reset``); otherwise (no
optimizer given, torch.distributed, a run recorded before the check) read from the global norm's
growth over the first steps (``evidence.early_growth``) and every layer's smoothing over the first
40 (``evidence.accumulation_smoothing``), bounds set on the zoo's calibration cases (healthy runs
sit well inside every one)."""

from __future__ import annotations

import numpy as np

from ..evidence import SMOOTH_STEPS, accumulation_smoothing, early_growth, never_updated
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
#: the running-sum fingerprint over the first SMOOTH_STEPS (40) steps. A sum S_k of k fresh
#: gradients of similar norm changes, at step k, by about 1/(2 sqrt(k)) in log norm when they are
#: independent and 1/k when they are aligned: at the late part's median step (~25) at most ~0.1,
#: the late per-layer change allowed. Its norm grows at least like sqrt(k) (independent) and at most
#: like k (aligned): sqrt(SMOOTH_STEPS) is the growth asked. It rises on nearly every step, where
#: batch noise around a trend rises about half the time: SMOOTH_RISING is the sign test's 99%
#: one-sided bound for 39 steps, 1/2 + 2.33 * 0.5 / sqrt(39) ~ 0.69 (0.7). The early change must be
#: this many times the late one (the 1/step shrinking). Healthy zoo runs: late change 0.096 and up
#: with the norm rising on at most 51% of the steps there, and on at most 68% anywhere.
SMOOTH_LATE_CHANGE = 0.1
SMOOTH_EARLY_FACTOR = 2.0
SMOOTH_GROWTH = float(np.sqrt(SMOOTH_STEPS))
SMOOTH_RISING = 0.7


#: the Recorder's direct check (``run.meta["grad_reset"]``) decides once it has compared this many
#: steps: two steps carrying the last one's gradient are a finding (one could be a hand-run extra
#: step in a notebook), none of them clears the run.
RESET_MIN_STEPS = 2
#: ... and only when they are at least this share of the steps it compared: a forgotten zero_grad()
#: carries the gradient on every step (zeroing every 2nd or 4th step only, on 1/2 or 3/4 of them),
#: where a fit degenerate on a few steps (the watched gradient near zero on the step before, so any
#: share of it "fits") carries on a handful of thousands.
RESET_MIN_SHARE = 0.25


def find(c: Context) -> Diagnosis | None:
    """The Recorder's direct check when the run has it (an optimizer, one process); else two
    fingerprints of gradients summed over steps, read from the norms."""
    seen = c.run.meta.get("grad_reset")
    if isinstance(seen, dict) and seen.get("checked", 0) >= RESET_MIN_STEPS:
        return _seen(c, seen)
    return _fingerprint(c)


def _seen(c: Context, seen: dict) -> Diagnosis | None:
    """Found by ``collect/_grad_reset``: the gradient the optimizer stepped with was the last
    step's plus this step's backwards, exactly."""
    n, of = int(seen.get("carried", 0)), int(seen["checked"])
    if n < max(RESET_MIN_STEPS, RESET_MIN_SHARE * of):
        return None
    first = seen.get("first_step")
    run = c.run
    return Diagnosis(
        "missing_zero_grad",
        "High",
        growing_first(run),
        int(first) if first is not None else start_step(run),
        f"the gradient optimizer.step() used still held the previous step's gradient on {n} of {of} steps "
        f"checked, from step {first} (watched on {seen.get('layer')}: what the step's backward passes added, "
        "plus the last step's gradient): each step's gradient is added to the last",
        1.0,
    )


def _fingerprint(c: Context) -> Diagnosis | None:
    """Two fingerprints of gradients summed over steps: at the very start the norm doubles at the
    second step and grows like the step count (consecutive gradients still point the same way);
    over the first 40 steps every layer's norm grows smoothly, its step-to-step change shrinking
    like 1/step, while batch noise keeps a healthy layer changing by 10-50% a step."""
    run = c.run
    gr = early_growth(run)
    # a parameter the optimizer does not hold is never zeroed by optimizer.zero_grad(): its gradient
    # is a running sum in correct code too (not_in_optimizer's symptom), so only the layers the
    # optimizer moves are read
    held = ~never_updated(run)
    sm = accumulation_smoothing(run, held if held.any() else None)
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
        inferred=True,
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
    kind="observation",
    explains=("lr_too_high", "exploding", "nonfinite", "plateau", "lr_too_low", "dead_units"),
    whole_run=True,
)
