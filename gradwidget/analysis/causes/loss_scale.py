"""``loss_scale``: a loss summed over the batch instead of averaged. Reads the loss's start, the
output bias gradient (``Thresholds.mean_loss_bias_grad``: a batch mean of (p - y) stays within 1)
and, when recorded, the loss's autograd graph, which settles it. Low on its own (the step size
depends on the batch size); High once it explains a symptom (it blew the steps up)."""

from __future__ import annotations

import numpy as np

from ...collect.loss_graph import LossGraph
from ._base import CauseRule, Context, Diagnosis
from ._shared import growing_first, output_bias_grad, start_step


def find(c: Context) -> Diagnosis | None:
    """A loss summed over the batch: it starts far above a per-sample loss and the output bias
    gradient exceeds a batch mean's bound; the loss's graph, when recorded, settles it (a
    ``reduction="mean"`` loss is never this, whatever its size)."""
    L, t = c.loss, c.t
    if not L.logged or not (L.start > t.summed_loss_start):
        return None
    graph = LossGraph.of_run(c.run)
    summed = None if graph is None else graph.summed
    if summed is False:  # a mean over the batch: the large loss is large outputs or targets
        return None
    ob = output_bias_grad(c.run)
    if np.isfinite(ob) and ob <= t.mean_loss_bias_grad:  # a large loss from huge logits, averaged all the same
        return None
    return Diagnosis(
        "loss_scale",
        "Low",
        growing_first(c.run),
        start_step(c.run),
        f"the loss starts at {L.start:.3g}, far above a per-sample loss (a cross entropy starts near "
        f"ln(classes), under 12)"
        + (
            f", and the output bias gradient reaches {ob:.3g} where a batch mean of (p - y) stays within 1"
            if np.isfinite(ob)
            else ""
        )
        + (f"; the loss's graph shows {graph.reducer}(reduction='sum')" if summed and graph else "")
        + ": it looks summed over the batch, which multiplies every gradient by the batch size",
        1.0 if summed else float(np.clip(np.log10(L.start / t.summed_loss_start) + 0.5, 0, 1)),
        inferred=not summed,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "average the loss over the batch (reduction='mean', the default) or divide the summed loss by "
        "the batch size, so the step size does not depend on the batch size"
    )


RULE = CauseRule(
    "loss_scale",
    "loss summed instead of averaged",
    find,
    action,
    kind="observation",
    explains=("lr_too_high", "exploding", "nonfinite", "dead_units"),
    whole_run=True,
    priority_explaining="High",
)
