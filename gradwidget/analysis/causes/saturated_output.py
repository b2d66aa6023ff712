"""``saturated_output``: a squashing op fed to a loss that applies it itself (softmax before
``cross_entropy``, sigmoid before ``binary_cross_entropy_with_logits``). Read off the loss's
autograd graph when the loss was logged as a tensor (certain: a cause of its own, never another's
symptom); without it, from the loss trajectory: a cross entropy of probabilities starts at
ln(classes) but can never fall below ln(1 + (classes - 1)/e)."""

from __future__ import annotations

import numpy as np

from ...collect.loss_graph import LossGraph
from ..trend import theil_sen
from ._base import CauseRule, Context, Diagnosis, Fold
from ._shared import output_classes, output_layer, start_step

#: without the graph: the lowest loss at or above this share of the softmax floor, and the end
#: within this share above it (the zoo's softmax cases sit 1-8% above the floor, its healthy runs
#: far below it), the last third flat within that band for certain (``trend.flat_within``: its
#: Theil-Sen slope's 99% interval, so a short or noisy tail claims nothing).
FLOOR_TOLERANCE = 0.98
SATURATED_NEAR_FLOOR = 0.15


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
    return _by_loss(c)


def _by_loss(c: Context) -> Diagnosis | None:
    """Without the loss's graph: a loss that started at ln(C), never went below the softmax floor
    ln(1 + (C - 1)/e), and flattened just above it."""
    run, L = c.run, c.loss
    C = output_classes(run)
    if C is None or not L.logged or run.n_steps < 20:
        return None
    chance = float(np.log(C))
    floor = float(np.log1p((C - 1) / np.e))
    if not (abs(L.start - chance) <= c.t.chance_tolerance * chance and L.lowest >= FLOOR_TOLERANCE * floor):
        return None
    if not L.end <= (1 + SATURATED_NEAR_FLOOR) * floor:
        return None
    y, steps = run.scalar("loss").astype(np.float64), run.steps.astype(np.float64)
    tail = theil_sen(y[-run.n_steps // 3 :], steps[-run.n_steps // 3 :])
    if tail is None or not tail.flat_within(0.0, SATURATED_NEAR_FLOOR * floor):
        return None
    return Diagnosis(
        "saturated_output",
        "High",
        [run.layer_names[i] for i in range(run.n_layers) if run.layers[i].backward_index in (0, 1)][:2],
        start_step(run),
        f"the loss started at {L.start:.3g} = ln({C}) like a {C}-class cross entropy but flattened at "
        f"{L.end:.3g}, never below {floor:.3g} = ln(1 + {C - 1}/e): the lowest a cross entropy of "
        "softmax outputs (probabilities, not logits) can reach",
        0.7,
    )


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
    explains=("vanishing", "plateau", "lr_too_low"),
    explains_when=_explains_when,
    folded_as=_folded_as,
)
