"""``saturated_output``: a squashing op fed to a loss that applies it itself (softmax before
``cross_entropy``, sigmoid before ``binary_cross_entropy_with_logits``). Read off the loss's
autograd graph when the loss was logged as a tensor: an observation, a cause of its own, never
another's symptom. A loss logged without its graph says nothing of it (its classes are unknown)."""

from __future__ import annotations


from ...collect.loss_graph import LossGraph
from ._base import CauseRule, Context, Diagnosis, Fold
from ._shared import output_layer, start_step


def find(c: Context) -> Diagnosis | None:
    run = c.run
    graph = LossGraph.of_run(run)
    if graph is not None:
        if not graph.mistakes:
            return None  # the graph shows logits going into the loss: nothing to guess from the numbers
        m = graph.mistakes[0]
        out = output_layer(run)
        layers = [info.name for info in run.layers if out is not None and info.module == out.module]
        where = f" by the model's last module {m.module or 'itself'}" if m.in_model else " in the loss code"
        return Diagnosis(
            "saturated_output",
            "High",
            layers,
            start_step(run),
            f"the loss's autograd graph shows {m.what} ({' <- '.join(m.ops)}, applied{where}): the output "
            f"saturates and its gradients shrink" + (f"; the output layer is {out.module}" if out else ""),
            1.0,
            at_init=True,
        )
    return None


def action(d: Diagnosis, c: Context) -> str:
    """Pass the logits: which squashing op to remove, and where, from the loss's graph when known."""
    graph = LossGraph.of_run(c.run)
    m = graph.mistakes[0] if graph is not None and graph.mistakes else None
    where = f" (the model's last module, {m.module or 'the model itself'})" if m is not None and m.in_model else ""
    if m is not None and m.kind == "softmax_nll":
        return (
            f"pass log-probabilities to nll_loss: use log_softmax instead of the softmax{where}, or pass the "
            "logits to cross_entropy"
        )
    if m is not None and m.kind == "sigmoid_bce_with_logits":
        return (
            f"pass the logits: remove the sigmoid{where}; binary_cross_entropy_with_logits applies it itself, "
            "more stably"
        )
    return (
        f"pass the logits to the loss: remove the softmax{where}; CrossEntropyLoss applies log-softmax itself, "
        "so a softmax before it squashes the gradient (apply softmax only to read probabilities)"
    )


def _explains_when(cause: Diagnosis, symptom: Diagnosis) -> bool:
    """Guessed from the loss alone, a softmax explains no vanishing (the reverse is likelier)."""
    return symptom.cause != "vanishing" or cause.at_init


def _folded_as(symptom: Diagnosis, cause: Diagnosis) -> Fold:
    """Read off the loss's graph it is a cause of its own, never another's symptom."""
    return "keep" if symptom.at_init else "fold"


RULE = CauseRule(
    "saturated_output",
    "saturated output (softmax before the loss?)",
    find,
    action,
    kind="observation",
    contradicts=("learns_nothing",),
    explains=("vanishing", "plateau", "lr_too_low"),
    explains_when=_explains_when,
    folded_as=_folded_as,
)
