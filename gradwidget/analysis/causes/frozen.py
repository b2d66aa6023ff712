"""``frozen``: parameters with requires_grad=False. Information (Low): freezing is how fine-tuning
and LoRA work."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._shared import names_of, start_step, tensors


def find(c: Context) -> Diagnosis | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "frozen"]
    if not idx:
        return None
    return Diagnosis(
        "frozen",
        "Low",
        names_of(run, idx),
        start_step(run),
        f"{tensors(run, idx)} have requires_grad=False and never train",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    return "if they should train, call requires_grad_(True) on them and add them to the optimizer"


RULE = CauseRule("frozen", "frozen parameters", find, action, kind="observation")
