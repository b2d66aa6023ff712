"""``not_in_optimizer``: parameters that get gradients the optimizer never applies. Reads whether
the optimizer moved each parameter while it moved others (``evidence.never_updated``), for the
parameters it does not hold (no update norm was measured) and whose weights stayed as they were:
weights that moved were stepped by another optimizer (``evidence.weights_moved``), and a
parameter it holds that never moved lost its updates some other way (below a bfloat16 weight's
precision, a learning rate of 0), which adding it to the optimizer would not change."""

from __future__ import annotations

import numpy as np

from ..evidence import never_updated, weights_moved
from ._base import CauseRule, Context, Diagnosis
from ._shared import names_of, start_step, tensors


def find(c: Context) -> Diagnosis | None:
    run = c.run
    ex, t = c.s.exact, c.t
    # a vanishing or dead gradient moves a weight by less than float32 can show: not this cause
    starved = (ex["vanishing_share"] >= t.minor_issue_ratio) | (ex["dead_share"] >= t.minor_issue_ratio)
    with np.errstate(invalid="ignore"):
        held = np.isfinite(run.metric("update_norm")).any(axis=0)
    m = never_updated(run) & ~held & ~weights_moved(run) & ~starved
    if not m.any():
        return None
    idx = np.flatnonzero(m)
    return Diagnosis(
        "not_in_optimizer",
        "High",
        names_of(run, idx),
        start_step(run),
        f"{tensors(run, idx, 'trainable ')} received gradients but the optimizer never changed them, "
        "while it updated the others",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "add these parameters to the optimizer: create it from model.parameters() after every module "
        "exists (or add them with optimizer.add_param_group)"
    )


RULE = CauseRule("not_in_optimizer", "parameters not in the optimizer", find, action, kind="observation")
