"""``batch_too_small``: the batch the optimizer steps with is far below the gradient noise scale
B_simple: larger batches would train in proportionally fewer steps. Reads the noise scale (the
gradient at two batch sizes per step); the bound and what it shares with ``batch_too_large`` are in
``_batch_size``. Information (Low), explains nothing. Its action: the batch range to try, with the
learning rate scaled to match.
"""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._batch_size import batch_action, find_batch

#: the change to make ({span}: the batch sizes to try, half the noise scale to the noise scale)
ACTION = (
    "if the hardware has room, raise the batch towards {span} examples per step (gradient accumulation works) "
    "and scale the learning rate up with it (about linearly for SGD, by the square root for Adam): the same "
    "examples then train in far fewer steps"
)


def find(c: Context) -> Diagnosis | None:
    return find_batch(c, small=True)


RULE = CauseRule(
    "batch_too_small", "batch far below the gradient noise scale", find, batch_action(ACTION), kind="symptom"
)
