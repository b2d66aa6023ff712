"""``plateau``: the loss (or, without one, the global gradient norm) has stopped moving: the
trailing stretch over which it is provably flat (``dynamics``: its Theil-Sen slope's confidence
interval inside the flat band of ``Thresholds.plateau_rel_change`` / ``plateau_total_change``), for
at least ``Thresholds.convergence_window`` steps or half a shorter run. Medium while the loss is
still high (above ``STUCK_LOSS_LEVEL`` of its start) in a run trained from scratch, else Low: a
converged run, or a fine-tuning run (frozen parts, or a loss that started below chance)."""

from __future__ import annotations

import numpy as np

from ._base import CauseRule, Context, Diagnosis

#: a loss that came down to no lower than this share of its start and then stayed flat is stuck.
STUCK_LOSS_LEVEL = 0.6


def find(c: Context) -> Diagnosis | None:
    p, L = c.dyn.plateau, c.loss
    if not p.is_plateau or L.converged:  # flat at a ten-thousandth of its start: converged, not stuck
        return None
    stuck = L.logged and np.isfinite(L.plateau_level) and L.plateau_level > STUCK_LOSS_LEVEL and not _fine_tuning(c)
    what = (
        f"the loss has stayed near {L.end:.3g} ({L.plateau_level:.0%} of where it started)"
        if L.logged
        else f"the {c.dyn.series} has flattened"
    )
    return Diagnosis(
        "plateau",
        "Medium" if stuck else "Low",
        [],
        p.start_step,
        f"{what} for {p.duration_steps} steps (relative change {p.rel_change_per_step:.2g} per step)",
        0.5 if stuck else 0.2,
    )


def _fine_tuning(c: Context) -> bool:
    """A run that fine-tunes: part of the model frozen (LoRA, a frozen backbone) or a classifier's
    loss starting well below chance, ln(classes) (pretrained). Its loss starts low and moves little:
    a flat stretch there is convergence, not a stuck run."""
    if any(info.status == "frozen" for info in c.run.layers):
        return True
    chance = c.task.chance
    return chance is not None and c.loss.logged and c.loss.start < (1 - c.t.chance_tolerance) * chance


def action(d: Diagnosis, c: Context) -> str:
    return (
        "lower the learning rate on the plateau (a scheduler such as ReduceLROnPlateau) or, if the loss "
        "is still high, raise it or check the data and labels"
    )


RULE = CauseRule("plateau", "training has plateaued", find, action, kind="symptom", whole_run=True)
