"""``cleared_before_step``: ``optimizer.zero_grad()`` between ``loss.backward()`` and
``optimizer.step()``: the step finds no gradient, so no weight moves. Seen directly by the Recorder
when it holds the optimizer (``run.meta["grad_reset"]["cleared"]``, ``collect/_grad_reset``: the
gradient was gone, None or zeroed, at the step although that step's backward brought one). An
observation: a fact about the program, whatever the loss does."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._shared import start_step

#: cleared on at least this share of the optimizer steps the Recorder saw (one could be a hand-run
#: extra step in a notebook; a loop that clears before its step does it every time)
CLEARED_SHARE = 0.5
#: ... and on at least this many
CLEARED_MIN_STEPS = 2


def find(c: Context) -> Diagnosis | None:
    seen = c.run.meta.get("grad_reset") if isinstance(c.run.meta, dict) else None
    if not isinstance(seen, dict):
        return None
    n, of = int(seen.get("cleared", 0)), int(seen.get("steps", 0))
    if n < CLEARED_MIN_STEPS or n < CLEARED_SHARE * of:
        return None
    run = c.run
    return Diagnosis(
        "cleared_before_step",
        "High",
        [info.name for info in run.layers if info.status == "trainable"],
        start_step(run),
        f"on {n} of {of} optimizer steps the gradient was gone when optimizer.step() ran, though that step's "
        f"backward had brought one (watched on {seen.get('layer')}): the gradients are cleared between "
        "loss.backward() and optimizer.step(), so the optimizer receives no gradient and no weight moves",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "call optimizer.zero_grad() before loss.backward() (at the start of the step, or right after "
        "optimizer.step()), never between loss.backward() and optimizer.step()"
    )


RULE = CauseRule(
    "cleared_before_step",
    "gradients cleared before the optimizer step",
    find,
    action,
    kind="observation",
    explains=("plateau", "lr_too_low", "vanishing", "lr_too_high"),
    whole_run=True,
)
