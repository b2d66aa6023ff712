"""The zoo's mistakes as they happen in real code, on the new architectures and the real data: a head
replaced after the optimizer was built, a backbone run under ``torch.no_grad()``, pixels not divided
by 255 and measurements not scaled, softmax before the loss, ``zero_grad`` forgotten with Adam as
well as SGD, rates far too high or too low, a layer frozen by mistake, dead units, NaN, a summed
loss, vanishing and exploding initialisations. With cases.py and heldout.py every cause is on at
least 4 architectures. ``_h`` cases are held out (never tuned on).

Labels follow cases.py's rules; the vanishing, exploding and dead labels were measured on these runs
(checks.py states the bounds and checks them on every run).
"""

from __future__ import annotations

from . import mistakes as mk
from . import styles as st
from .cases import _add
from .heldout import HELDOUT
from .models import DIGITS_CNN, DIGITS_HF, DIGITS_VIT, TABULAR, TEXT


def _h(*args, **kw):
    return _add(*args, seed=kw.pop("seed", 1), into=HELDOUT, **kw)


def _tab(task: str) -> dict:
    return {"task": task, "variant": TABULAR[task], "style": task}


_DIGITS = {"task": "digits", "style": "digits"}
_CNN = {**_DIGITS, "variant": DIGITS_CNN}
_RESNET = {**_DIGITS, "variant": DIGITS_HF}
_VIT = {**_DIGITS, "variant": DIGITS_VIT}

# ----------------------------------------------------------------------------- lr_too_high
# the GPT-2: 4 layers at lr 0.05 (AdamW), the loss stays at ln(vocab) for the whole run
_add(
    "gpt2",
    "adamw",
    "lr_0.05",
    "lr_too_high",
    variant={**TEXT, "layers": 4},
    task="reference",
    style="4layers-text",
    apply=[st.lr(0.05)],
)
_add("tabular", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(30)], **_tab("wine"))
_add("convnext", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])
_h("llama", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])
_h("moe", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])

# ----------------------------------------------------------------------------- lr_too_low (slow onset)
_add("llama", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_add("t5", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_add("convnext", "sgd", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_h("tabular", "sgd", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True, **_tab("cancer"))
_h("gru", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)

# ----------------------------------------------------------------------------- missing_zero_grad (Adam and SGD)
_add("llama", "adamw", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])
_add("convnext", "adamw", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])
_add("gru", "sgd", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])
_add("tabular", "adamw", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad], **_tab("cancer"))
_h("tabular", "sgd", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad], **_tab("wine"))
_h("distilbert", "adamw", "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])

# ----------------------------------------------------------------------------- not_in_optimizer
# ``model.classifier = nn.Linear(...)`` after ``AdamW(model.parameters())``: the new head is labelled
for _arch, _opt, _head, _kw in [
    ("distilbert", "adamw", "classifier", {}),
    ("bert", "adamw", "classifier", {}),
    ("resnet", "adamw", "classifier.1", _RESNET),
    ("convnext", "adamw", "classifier", {}),
]:
    _add(
        _arch,
        _opt,
        "head_replaced",
        "not_in_optimizer",
        apply=[mk.replace_head_after_optimizer(_head)],
        faults=(_head,),
        **_kw,
    )
_h(
    "tabular",
    "adamw",
    "head_replaced",
    "not_in_optimizer",
    apply=[mk.replace_head_after_optimizer("head")],
    faults=("head",),
    **_tab("cancer"),
)
_h(
    "vit",
    "adamw",
    "head_replaced",
    "not_in_optimizer",
    apply=[mk.replace_head_after_optimizer("classifier")],
    faults=("classifier",),
    **_VIT,
)

# ----------------------------------------------------------------------------- no_gradient
# the backbone under torch.no_grad() while it was meant to train: every backbone parameter
_add(
    "resnet",
    "adamw",
    "no_grad_backbone",
    "no_gradient",
    apply=[mk.no_grad_backbone("resnet")],
    faults=("resnet",),
    **_RESNET,
)
_add(
    "convnext",
    "adamw",
    "no_grad_backbone",
    "no_gradient",
    apply=[mk.no_grad_backbone("convnext")],
    faults=("convnext",),
)
_add(
    "distilbert",
    "adamw",
    "no_grad_backbone",
    "no_gradient",
    apply=[mk.no_grad_backbone("distilbert")],
    faults=("distilbert",),
)
_h("vit", "sgd", "no_grad_backbone", "no_gradient", apply=[mk.no_grad_backbone("vit")], faults=("vit",), **_VIT)
_h(
    "tabular",
    "adamw",
    "no_grad_backbone",
    "no_gradient",
    apply=[mk.no_grad_backbone("body")],
    faults=("body",),
    **_tab("wine"),
)

# ----------------------------------------------------------------------------- frozen by mistake
_add("llama", "adamw", "frozen", "frozen", apply=[mk.freeze("model.layers.1.mlp")], faults=("model.layers.1.mlp",))
_add("t5", "adamw", "frozen", "frozen", apply=[mk.freeze("encoder.block.0")], faults=("encoder.block.0",))
_add("tabular", "sgd", "frozen", "frozen", apply=[mk.freeze("body.3")], faults=("body.3",), **_tab("digits_flat"))
_h(
    "convnext",
    "adamw",
    "frozen",
    "frozen",
    apply=[mk.freeze("convnext.encoder.stages.1")],
    faults=("convnext.encoder.stages.1",),
)
_h("gru", "sgd", "frozen", "frozen", apply=[mk.freeze("emb")], faults=("emb",))

# ----------------------------------------------------------------------------- saturated_output
_add(
    "tabular",
    "adamw",
    "nll_on_softmax",
    "saturated_output",
    apply=[mk.nll_on_softmax],
    faults=("head",),
    **_tab("wine"),
)
_add("gru", "adamw", "saturated_output", "saturated_output", apply=[mk.softmax_before_cross_entropy], faults=("head",))
_add(
    "distilbert",
    "adamw",
    "saturated_output",
    "saturated_output",
    apply=[mk.softmax_before_cross_entropy],
    faults=("classifier",),
)
_h("convnext", "adamw", "nll_on_softmax", "saturated_output", apply=[mk.nll_on_softmax], faults=("classifier",))
_h("cnn", "adamw", "nll_on_softmax", "saturated_output", apply=[mk.nll_on_softmax], faults=("head",), **_CNN)

# ----------------------------------------------------------------------------- input_scale: preprocessing forgotten
_add("cnn", "sgd", "raw_pixels", "input_scale", apply=[mk.skip_preprocessing], faults=("features.0",), **_CNN)
# not on ViT: raw pixels there left the patch projection's gradient within 3x of the twin's (the
# LayerNorms after it absorb the scale; measured), so the label would not hold
_add("tabular", "adamw", "unscaled", "input_scale", apply=[mk.skip_preprocessing], faults=("body.0",), **_tab("wine"))
_add("tabular", "sgd", "unscaled", "input_scale", apply=[mk.skip_preprocessing], faults=("body.0",), **_tab("diabetes"))
_h("tabular", "adamw", "unscaled", "input_scale", apply=[mk.skip_preprocessing], faults=("body.0",), **_tab("cancer"))
_h("cnn", "adamw", "raw_pixels", "input_scale", apply=[mk.skip_preprocessing], faults=("features.0",), **_CNN)

# ----------------------------------------------------------------------------- loss_scale: reduction="sum" with SGD
_add("tabular", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(128)], **_tab("cancer"))
_add("convnext", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(128)])
_add("llama", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(32)])
_h("gru", "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(32)])

# ----------------------------------------------------------------------------- nonfinite
_add(
    "llama",
    "adamw",
    "nonfinite_module",
    "nonfinite",
    apply=[mk.nan_in_module(_LLAMA_ACT := "model.layers.0.mlp.act_fn", 30)],
    origin=_LLAMA_ACT,
)
_add(
    "convnext",
    "adamw",
    "nonfinite_module",
    "nonfinite",
    apply=[mk.nan_in_module(_CNX_ACT := "convnext.encoder.stages.0.layers.0.act", 30)],
    origin=_CNX_ACT,
)
_add("tabular", "adamw", "nonfinite_loss", "nonfinite", apply=[mk.nan_from_loss(30)], **_tab("cancer"))
_h("gru", "adamw", "nonfinite_loss", "nonfinite", apply=[mk.nan_from_loss(40)])

# ----------------------------------------------------------------------------- dead_units: a -10 bias before a ReLU
# the dead layer, then the next weight (its input is now all zeros)
_add(
    "tabular",
    "sgd",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("body.0", -10.0)],
    faults=("body.0", "body.3.weight"),
    **_tab("wine"),
)
_h(
    "tabular",
    "adamw",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("body.3", -10.0)],
    faults=("body.3", "body.0", "body.6.weight"),
    **_tab("cancer"),
)
# a BatchNorm's shift at -10 before the stem's ReLU: nothing reaches the rest of the network, so every
# backbone parameter and the head's weight get exactly zero gradients (measured)
_RESNET_STEM = "resnet.embedder.embedder"
_add(
    "resnet",
    "sgd",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias(_RESNET_STEM + ".normalization", -10.0)],
    faults=(_RESNET_STEM, "resnet", "classifier.1.weight"),
    **_RESNET,
)

# ----------------------------------------------------------------------------- vanishing / exploding
_add(
    "tabular",
    "sgd",
    "vanishing_sigmoid",
    "vanishing",
    variant={**TABULAR["cancer"], "act": "sigmoid", "depth": 10},
    task="cancer",
    style="cancer",
    faults=tuple(f"body.{3 * i}" for i in range(8)),
)
_h(
    "cnn",
    "sgd",
    "vanishing_sigmoid",
    "vanishing",
    variant={**DIGITS_CNN, "act": "sigmoid"},
    task="digits",
    style="digits",
    faults=("features.0",),
)
_add(
    "tabular",
    "sgd",
    "exploding",
    "exploding",
    variant={**TABULAR["digits_flat"], "depth": 6},
    task="digits_flat",
    style="digits",
    apply=[mk.scale_weights(4.0)],
    faults=tuple(f"body.{3 * i}.weight" for i in range(6)),
)
# the Elman RNN's recurrent weights x3: the gradient grows through time
_add(
    "rnn", "sgd", "exploding", "exploding", apply=[mk.scale_weights(3.0, "rnn", names=("weight_hh",))], faults=("rnn",)
)
_h(
    "rnn",
    "adamw",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(3.0, "rnn", names=("weight_hh",))],
    faults=("rnn",),
)
# a 4-layer Elman RNN initialised x0.2: the embedding and the first two layers' weights get under 1%
# of the head's gradient (measured: 2.5e-5 to 6.3e-3); biases go with their weights
_add(
    "rnn",
    "sgd",
    "vanishing_small_init",
    "vanishing",
    variant={"layers": 4},
    apply=[mk.scale_weights(0.2, "rnn")],
    faults=("emb",) + tuple(f"rnn.{k}_{io}_l{i}" for i in (0, 1) for k in ("weight", "bias") for io in ("ih", "hh")),
)
