"""``no_gradient``: trainable parameters that never receive a gradient (the recorder marks them
"unused": cut off from the loss)."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._shared import names_of, start_step, tensors


def find(c: Context) -> Diagnosis | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "unused"]
    if not idx or run.n_steps == 0:
        return None
    return Diagnosis(
        "no_gradient",
        "High",
        names_of(run, idx),
        start_step(run),
        f"{tensors(run, idx, 'trainable ')} never received a gradient in {run.n_steps} recorded steps: "
        "they are cut off from the loss (a .detach(), a branch not used in the loss, or torch.no_grad() "
        "around part of the forward)",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "find where they are cut off from the loss (a .detach(), .item()/.numpy() round trip, a "
        "torch.no_grad() block or an output that is not used); if that is on purpose, freeze them "
        "with requires_grad_(False) so the optimizer and DDP skip them"
    )


RULE = CauseRule("no_gradient", "parameters that never get a gradient", find, action, kind="observation")
