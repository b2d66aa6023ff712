"""The diagnosis vocabulary, one module per cause (what it reads, its bounds and how they were
set, its title, what it explains, its action), and the registry: ``RULES`` lists them in
precedence order, a root cause before the symptoms it can produce. Adding a cause is adding a
module with a ``RULE`` and naming it here. ``diagnose`` runs, folds and ranks them (``_engine``)."""

from __future__ import annotations

from . import (
    batch_too_large,
    batch_too_small,
    cleared_before_step,
    dead_units,
    eval_mode,
    exploding,
    frozen,
    half_weights,
    input_scale,
    learns_nothing,
    loss_scale,
    lr_too_high,
    lr_too_low,
    missing_zero_grad,
    no_gradient,
    nonfinite,
    not_in_optimizer,
    plateau,
    replicas_diverged,
    saturated_output,
    vanishing,
)
from ._base import PRIORITY_ORDER, CauseRule, Context, Diagnosis
from ._engine import diagnose as _diagnose
from ._engine import layer_verdicts, verdict

#: every cause, in precedence order.
RULES: tuple[CauseRule, ...] = (
    half_weights.RULE,
    nonfinite.RULE,
    replicas_diverged.RULE,
    cleared_before_step.RULE,
    missing_zero_grad.RULE,
    eval_mode.RULE,
    loss_scale.RULE,
    input_scale.RULE,
    saturated_output.RULE,
    lr_too_high.RULE,
    not_in_optimizer.RULE,
    no_gradient.RULE,
    dead_units.RULE,
    exploding.RULE,
    vanishing.RULE,
    lr_too_low.RULE,
    plateau.RULE,
    learns_nothing.RULE,
    batch_too_small.RULE,
    batch_too_large.RULE,
    frozen.RULE,
)
#: the causes' names, in precedence order.
CAUSES = tuple(r.name for r in RULES)
#: what each cause is, in a few words.
CAUSE_TITLES = {r.name: r.title for r in RULES}


def diagnose(c: Context) -> list[Diagnosis]:
    """Every cause the evidence in ``c`` supports, folded and ranked (see ``_engine``)."""
    return _diagnose(c, RULES)


__all__ = [
    "CAUSES",
    "CAUSE_TITLES",
    "PRIORITY_ORDER",
    "RULES",
    "CauseRule",
    "Context",
    "Diagnosis",
    "diagnose",
    "layer_verdicts",
    "verdict",
]
