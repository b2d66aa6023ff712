"""``exploding``: gradients far above ``Thresholds.exploding`` (the health risk factors), or, at
initialisation, a classifier's cross entropy many times ln(classes) with a batch-mean output bias
gradient (``Thresholds.mean_loss_bias_grad``): outputs huge before any update, weights initialised
too large. At initialisation it is the root of the too-large steps, NaN and dead units that follow.

The loss at the first step, before any update, against the chance level its graph gives is an
observation; large gradients during training are a symptom (``inferred``: Low without damage)."""

from __future__ import annotations

import numpy as np

from ...rules import over_threshold_mask
from ..evidence import is_embedding
from ._base import CauseRule, Context, Diagnosis
from ._shared import clip_text, factors_of, first_flagged_step, names_of, output_bias_grad, start_step

#: a first cross entropy this many times ln(classes), averaged over the batch: outputs exploded at init.
EXPLODING_LOSS_FACTOR = 5.0
#: ... this many times when the loss's graph shows it is a cross entropy of the model's output (not an
#: MSE over several outputs, whose start says nothing of ln(classes)): healthy zoo runs start at
#: 0.86-1.01 x ln(classes), an unnormalised input at 1.45.
EXPLODING_LOSS_FACTOR_CE = 2.0


def _at_init(c: Context) -> Diagnosis | None:
    """A classifier whose cross entropy starts many times above ln(classes) while its output bias
    gradient stays within a batch mean's bound: its outputs are huge before the first update, so
    the weights were initialised too large (no learning rate is involved yet)."""
    run, L, t = c.run, c.loss, c.t
    chance, C = c.task.chance, c.task.classes
    if chance is None or C is None or not L.logged or not np.isfinite(L.start):
        return None
    first = run.scalar("loss")[0]
    ob = output_bias_grad(run)
    factor = EXPLODING_LOSS_FACTOR_CE if c.task.kind == "cross_entropy" else EXPLODING_LOSS_FACTOR
    if not (first > factor * chance and (not np.isfinite(ob) or ob <= t.mean_loss_bias_grad)):
        return None
    if not np.isfinite(ob) and first > t.summed_loss_start:  # no bias to tell a sum from huge outputs
        return None
    mods = {
        info.module
        for info in run.layers
        if info.name.endswith("weight") and len(info.shape) >= 2 and not is_embedding(info.module_type)
    }
    ws = [i for i, info in enumerate(run.layers) if info.module in mods and info.backward_index >= 0]
    ws.sort(key=lambda i: -run.layers[i].backward_index)  # input side first: where the product is largest
    return Diagnosis(
        "exploding",
        "High",
        names_of(run, ws),
        start_step(run),
        f"the loss starts at {first:.3g}, {first / chance:.0f}x the ln({C}) = {chance:.2f} of a {C}-class "
        "classifier at initialisation, with the output bias gradient within its bound of 1: the "
        "outputs are huge before any update, so the weights are initialised too large",
        0.8,
        at_init=True,
    )


def find(c: Context) -> Diagnosis | None:
    init = _at_init(c)
    if init is not None:
        return init
    fs = factors_of(c.factors, "exploding")
    if not fs:
        return None
    run, t = c.run, c.t
    idx = [run.layer_index(f.layer) for f in fs]
    flags = over_threshold_mask(run.metric("max_abs")[:, idx], t)
    return Diagnosis(
        "exploding",
        "High",
        [f.layer for f in fs],
        first_flagged_step(run, flags),
        f"{fs[0].layer}: {fs[0].evidence}" + (f"; {len(fs) - 1} more layers" if len(fs) > 1 else ""),
        max(f.severity for f in fs),
        inferred=True,
    )


def action(d: Diagnosis, c: Context) -> str:
    if c.arch.has_recurrent:
        return (
            "clip the gradient norm (clip_grad_norm_) and initialise the recurrent weights smaller "
            "(orthogonal, or PyTorch's default uniform ±1/sqrt(hidden_size))"
        )
    if not c.arch.has_norm:
        return (
            "re-initialise with the default (Kaiming/Xavier) scale, and add normalisation "
            "(BatchNorm/LayerNorm) between the layers; clip the gradient norm meanwhile"
        )
    return f"check the initialisation scale of these layers; {clip_text(c.run)}"


def _explains_when(cause: Diagnosis, symptom: Diagnosis) -> bool:
    """Only outputs that were huge before any update explain what the steps did next."""
    return cause.at_init


RULE = CauseRule(
    "exploding",
    "exploding gradients",
    find,
    action,
    kind="observation",
    contradicts=("learns_nothing",),
    explains=("lr_too_high", "nonfinite", "dead_units"),
    explains_when=_explains_when,
)
