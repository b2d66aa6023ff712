"""``no_gradient``: trainable parameters the optimizer holds that never receive a gradient (the
recorder marks them "unused": cut off from the loss). A trainable parameter the optimizer does not
hold either (``run.meta["not_in_optimizer"]``) is neither trained nor reached: a copy kept beside
the model and moved by hand (DQN's target network, an EMA teacher, a momentum encoder), said as
information only. Runs recorded without that list, or without an optimizer, count every unused
parameter as held."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._shared import names_of, start_step, tensors


def find(c: Context) -> Diagnosis | None:
    run = c.run
    if run.n_steps == 0:
        return None
    idx = [i for i, info in enumerate(run.layers) if info.status == "unused"]
    outside = run.meta.get("not_in_optimizer") if isinstance(run.meta, dict) else None
    outside = set(outside) if isinstance(outside, list) else set()
    held = [i for i in idx if run.layers[i].name not in outside]
    if held:
        return Diagnosis(
            "no_gradient",
            "High",
            names_of(run, held),
            start_step(run),
            f"{tensors(run, held, 'trainable ')} that the optimizer holds never received a gradient in "
            f"{run.n_steps} recorded steps: they are cut off from the loss (a .detach(), a branch not used in "
            "the loss, or torch.no_grad() around part of the forward)",
            1.0,
        )
    if not idx:
        return None
    return Diagnosis(
        "no_gradient",
        "Low",
        names_of(run, idx),
        start_step(run),
        f"{tensors(run, idx, 'trainable ')} never received a gradient in {run.n_steps} recorded steps and the "
        "optimizer does not hold them: neither trained nor reached by the loss, likely a target or EMA copy of "
        "the model (moved by hand, not by the optimizer)",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    if d.priority == "Low":
        return (
            "if they are a target or EMA copy, freeze them with requires_grad_(False) to say so; if they should "
            "train, add them to the optimizer and find where they are cut off from the loss"
        )
    return (
        "find where they are cut off from the loss (a .detach(), .item()/.numpy() round trip, a "
        "torch.no_grad() block or an output that is not used); if that is on purpose, freeze them "
        "with requires_grad_(False) so the optimizer and DDP skip them"
    )


RULE = CauseRule("no_gradient", "parameters that never get a gradient", find, action, kind="observation")
