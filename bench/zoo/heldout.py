"""Held-out cases: every mistake again on other seeds, and mostly other architectures, optimizers,
magnitudes or places, to check that what is calibrated on CASES generalises. Never tune on these.
HELDOUT is filled here (the first zoo's mistakes), by healthy.py (held-out healthy runs) and by
field.py (held-out mistakes on the new architectures and data): about a third of the corpus.

Labels follow the same rules as in cases.py; the vanishing and exploding ones were measured the
same way (below 1% of the largest weight gradient; over 100x the same healthy run, first 10 steps).
"""

from __future__ import annotations

from . import mistakes as mk
from .case import Case
from .cases import _add, _first_module, _modules
from .models import DIGITS_HF

HELDOUT: list[Case] = []


def _h(*args, **kw) -> Case:
    return _add(*args, seed=kw.pop("seed", 1), into=HELDOUT, **kw)


# lr 10-100x (other archs/optimizers than CASES) and 1e-3..1e-4x. The ResNet needs 100x: its
# BatchNorms make the weights' scale free, and 30x SGD (or 100x AdamW) still trained to ~0 loss.
_h("mlp", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(30)])
_h("gpt2", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(10)])
_h("resnet", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])
# slow: see cases.py
_h("cnn", "sgd", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_h("vit", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-4)], slow=True)
_h("bert", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)

_h("mlp", "adamw", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])
_h("vit", "sgd", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])

# a middle conv block, and a whole recurrent module, left out of the optimizer
_h(
    "cnn",
    "sgd",
    "not_in_optimizer",
    "not_in_optimizer",
    apply=[mk.leave_out_of_optimizer("features.3")],
    faults=("features.3",),
)
_h("lstm", "adamw", "not_in_optimizer", "not_in_optimizer", apply=[mk.leave_out_of_optimizer("rnn")], faults=("rnn",))

# detached after the first conv block; ViT's whole embedding detached (patches, cls, positions)
_h("cnn", "adamw", "no_gradient", "no_gradient", apply=[mk.detach_output("features.2")], faults=("features.0",))
_h("vit", "adamw", "no_gradient", "no_gradient", apply=[mk.detach_output("vit.embeddings")], faults=("vit.embeddings",))

_h("gpt2", "adamw", "frozen", "frozen", apply=[mk.freeze("transformer.h.0.attn")], faults=("transformer.h.0.attn",))
_h("lstm", "sgd", "frozen", "frozen", apply=[mk.freeze("emb")], faults=("emb",))

_h(
    "mlp",
    "sgd",
    "vanishing_sigmoid",
    "vanishing",
    variant={"act": "sigmoid", "depth": 8},
    faults=tuple(f"net.{2 * i}" for i in range(6)),
)
_h(
    "cnn",
    "adamw",
    "vanishing_small_init",
    "vanishing",
    apply=[mk.scale_weights(0.1)],
    faults=("features.0", "features.3"),
)

_h(
    "mlp",
    "sgd",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(3.0)],
    faults=("net.0", "net.2.weight", "net.4.weight", "net.6.weight", "net.8.weight"),
)
_h(
    "cnn",
    "adamw",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(4.0)],
    faults=("features.0", "features.3.weight", "features.6.weight", "head.weight"),
)

# dead deeper in the MLP (three layers upstream) and at the CNN's first conv
_h(
    "mlp",
    "adamw",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("net.4", -10.0)],
    faults=("net.4", "net.2", "net.0", "net.6.weight"),
)
_h(
    "cnn",
    "sgd",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("features.0", -10.0)],
    faults=("features.0", "features.3.weight"),
)

# slow: the NaN is injected at step 60, past the 50 steps a detection is expected within
_h("cnn", "sgd", "nonfinite_loss", "nonfinite", apply=[mk.nan_from_loss(60)], slow=True)
_h(
    "bert",
    "adamw",
    "nonfinite_module",
    "nonfinite",
    apply=[mk.nan_in_module(_bert_act := _first_module("bert", "GELUActivation"), 45)],
    origin=_bert_act,
)

_h("lstm", "adamw", "saturated_output", "saturated_output", apply=[mk.softmax_before_cross_entropy], faults=("head",))
_h(
    "vit",
    "adamw",
    "saturated_output",
    "saturated_output",
    apply=[mk.softmax_before_cross_entropy],
    faults=("classifier",),
)

# raw pixel-like scale x255, and x100
_h("cnn", "sgd", "input_scale", "input_scale", apply=[mk.scale_inputs(255.0)], faults=("features.0",))
_h("mlp", "adamw", "input_scale", "input_scale", apply=[mk.scale_inputs(100.0)], faults=("net.0",))

_h("lstm", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(64)])
_h("resnet", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(128)])

# gradients cleared between backward and step, and float16 weights, on architectures CASES does not
# use for them
_h("resnet", "sgd", "cleared_before_step", "cleared_before_step", apply=[mk.clear_before_step])
_h("gru", "adamw", "half_weights", "half_weights", apply=[mk.half_weights])
_h("resnet", "adamw", "labels_apart", "learns_nothing", apply=[mk.shuffle_labels_apart])
# model.eval() left on after an evaluation: ViT with dropout (SGD), the ResNet's BatchNorms (AdamW, on
# the digits), their statistics estimated for 30 steps before they froze
_h("vit", "sgd", "eval_left_on", "eval_mode", variant={"dropout": 0.1}, apply=[mk.eval_left_on(30)], style="dropout")
_h(
    "resnet",
    "adamw",
    "eval_left_on",
    "eval_mode",
    variant=DIGITS_HF,
    task="digits",
    style="digits",
    apply=[mk.eval_left_on(30)],
    faults=_modules("resnet", "BatchNorm2d"),
)
