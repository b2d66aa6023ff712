"""``batch_too_large``: the batch the optimizer steps with is far above the gradient noise scale
B_simple: most of each step's examples buy nothing. Reads the noise scale (the gradient at two batch
sizes per step); the bound and what it shares with ``batch_too_small`` are in ``_batch_size``.
Information (Low), explains nothing. Its action: the batch range to try, with the learning rate
scaled down to match.
"""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._batch_size import batch_action, find_batch

#: the change to make ({span}: the batch sizes to try, half the noise scale to the noise scale)
ACTION = (
    "lower the batch to about {span} examples per step (with the learning rate scaled down to match): beyond "
    "the noise scale each step's extra examples buy little, so the same number of steps needs far fewer examples"
)


def find(c: Context) -> Diagnosis | None:
    return find_batch(c, small=False)


RULE = CauseRule(
    "batch_too_large", "batch far above the gradient noise scale", find, batch_action(ACTION), kind="symptom"
)
