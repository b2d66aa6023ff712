"""``learns_nothing``: the loss never left the task's chance level although everything the Recorder
sees of the training is healthy: gradients reach every layer at healthy sizes (no vanishing,
exploding or dead layer), the optimizer moves every layer's weights at a healthy update/weight
ratio (a cause that explains the stall instead, vanishing or exploding gradients, dead units, a
learning rate off, rules it out). What is left is the data: labels that do not go with their inputs (inputs and labels
shuffled separately), or targets that are not the task's. A symptom whose damage is its definition
(``damage``: chance level, from the loss's graph); last in precedence, so any cause the Recorder can
name comes first."""

from __future__ import annotations

import numpy as np

from ..evidence import weights_moved
from ..stats import _quiet
from ._base import CauseRule, Context, Diagnosis
from ._shared import start_step

#: share of the trainable layers whose weights must have moved
MOVED_SHARE = 0.9


def find(c: Context) -> Diagnosis | None:
    dmg, run, t = c.damage, c.run, c.t
    if dmg is None or dmg.kind != "chance" or not dmg.total:
        return None
    trainable = c.s.trainable
    if not trainable.any() or weights_moved(run)[trainable].mean() < MOVED_SHARE:
        return None
    _, ratio = c.update_ratio
    with _quiet():
        med = float(np.nanmedian(ratio)) if ratio.size and np.isfinite(ratio).any() else float("nan")
    if not (t.update_ratio_low <= med <= t.update_ratio_high):
        return None
    return Diagnosis(
        "learns_nothing",
        "Medium",
        [],
        start_step(run),
        f"{dmg.text}, while gradients reach every layer and the optimizer moves every "
        f"layer's weights (typical update {med:.2g} of the weight norm): the training works, the data "
        "teaches nothing",
        0.6,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "check that each label goes with its input: shuffle inputs and labels together (one index for "
        "both, or a DataLoader over a TensorDataset(x, y)) and check that the targets are the task's"
    )


RULE = CauseRule(
    "learns_nothing",
    "the model learns nothing from its data",
    find,
    action,
    kind="symptom",
    explains=("plateau",),
    whole_run=True,
)
