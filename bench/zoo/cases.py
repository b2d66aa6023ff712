"""The zoo's first labelled cases (synthetic tasks): every architecture healthy (2 optimizers x 2
seeds), and each mistake on several architectures with its cause and the exact parameters at fault.
``_add`` defines a case for every module of the corpus (healthy.py, field.py, heldout.py).

Labels come from module paths: ``faults`` lists the modules whose parameters are at fault and
``params_under`` turns them into the parameter names the Run uses, from the real model, so a label
can never name a layer that does not exist (``check.check_case`` verifies it again on the Run).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from . import mistakes as mk
from .case import HEALTHY, Case
from .models import ARCHS, build
from .pretrain import Pretrain

OPTIMIZERS = ("sgd", "adamw")
SEEDS = (0, 1)


@dataclass(frozen=True)
class Recipe:
    """How to train a case: the arch's build options, its task, the model it fine-tunes from, and the
    training styles then the mistakes applied to the setup."""

    variant: tuple = ()  #: build kwargs, as sorted (key, value) pairs
    mistakes: tuple = ()  #: functions apply(setup)
    task: str | None = None  #: a models.TASKS name; None: the arch's
    pretrain: Pretrain | None = None
    styles: tuple = ()  #: functions apply(setup), before the mistakes


CASES: list[Case] = []
RECIPES: dict[str, Recipe] = {}


@functools.cache
def _model(arch: str, variant: tuple) -> nn.Module:
    return build(arch, **dict(variant))


def _modules(arch: str, type_name: str) -> tuple[str, ...]:
    """Paths of the modules of class ``type_name`` in ``arch``'s model (paths inside transformers
    models change between its releases; class names do not)."""
    paths = tuple(n for n, m in _model(arch, ()).named_modules() if type(m).__name__ == type_name)
    if not paths:
        raise LookupError(f"{arch} has no {type_name} module")
    return paths


def _first_module(arch: str, type_name: str) -> str:
    """Path of the first module of class ``type_name`` in ``arch``'s model."""
    return _modules(arch, type_name)[0]


def _add(
    arch: str,
    optimizer: str,
    mistake: str,
    cause: str | None = None,
    *,
    seed: int = 0,
    apply: Sequence[mk.Mistake] = (),
    variant: dict | None = None,
    faults: tuple[str, ...] = (),
    origin: str | None = None,
    slow: bool = False,
    steps: int = 120,
    into: list | None = None,
    style: str = "",
    task: str | None = None,
    pretrain: Pretrain | None = None,
    styles: Sequence[mk.Mistake] = (),
) -> Case:
    """Define a case (appended to ``into``, CASES by default) and its recipe. Parameters the built
    model does not train (frozen on purpose, LoRA's base) become ``intended_frozen``."""
    v = tuple(sorted((variant or {}).items()))
    model = _model(arch, v)
    case = Case(
        f"{arch}-{optimizer}-s{seed}-{mistake}" + (f"-{style}" if style else ""),
        arch,
        optimizer,
        seed,
        mistake,
        cause,
        fault_layers=mk.params_under(model, faults),
        origin_module=origin,
        slow_onset=slow,
        steps=steps,
        style=style,
        intended_frozen=tuple(n for n, p in model.named_parameters() if not p.requires_grad),
    )
    if case.id in RECIPES:
        raise ValueError(f"two zoo cases are called {case.id}")
    (CASES if into is None else into).append(case)
    RECIPES[case.id] = Recipe(v, tuple(apply), task, pretrain, tuple(styles))
    return case


# ----------------------------------------------------------------------------- healthy runs
# BERT has no SGD runs: from its standard init (std 0.02) SGD with momentum left the loss at chance
# after 250 steps at every rate tried (0.03 to 1.0, also with init std 0.1/0.2 and shorter inputs),
# as BERT is known to need Adam; its four healthy runs are AdamW on seeds 0-3.
#: the architectures of the first zoo, on their synthetic tasks (healthy.py trains the others)
FIRST_ARCHS = ("mlp", "cnn", "lstm", "gpt2", "bert", "resnet", "vit")
for _arch in FIRST_ARCHS:
    for _opt in OPTIMIZERS:
        if _opt in ARCHS[_arch].lr:
            for _seed in SEEDS if len(ARCHS[_arch].lr) > 1 else SEEDS + (2, 3):
                _add(_arch, _opt, HEALTHY, seed=_seed)

# ----------------------------------------------------------------------------- mistakes
# Learning rate 30x (SGD) to 100x (AdamW) the healthy one: the loss jumps, oscillates or diverges.
_add("mlp", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(30)])
_add("gpt2", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(30)])
_add("lstm", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])
_add("cnn", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(50)])
_add("bert", "adamw", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(100)])
_add("vit", "sgd", "lr_too_high", "lr_too_high", apply=[mk.scale_lr(30)])

# Learning rate 1e-3..1e-4 x: nothing is wrong with any gradient, the weights barely move. Slow:
# a flat loss only tells apart from a slow start after many steps.
_add("mlp", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-4)], slow=True)
_add("gpt2", "sgd", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_add("lstm", "sgd", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-3)], slow=True)
_add("resnet", "adamw", "lr_too_low", "lr_too_low", apply=[mk.scale_lr(1e-4)], slow=True)

# optimizer.zero_grad() never called: gradients are sums over all steps so far.
for _arch, _opt in [("mlp", "sgd"), ("gpt2", "adamw"), ("lstm", "sgd"), ("cnn", "sgd"), ("resnet", "sgd")]:
    _add(_arch, _opt, "missing_zero_grad", "missing_zero_grad", apply=[mk.no_zero_grad])

# One module left out of the optimizer (a new head, a block): gradients but never an update.
for _arch, _opt, _mod in [
    ("mlp", "adamw", "net.4"),
    ("gpt2", "adamw", "transformer.h.1.mlp"),
    ("lstm", "sgd", "head"),
    ("bert", "adamw", "classifier"),
    ("vit", "adamw", "classifier"),
    ("resnet", "adamw", "classifier"),
]:
    _add(_arch, _opt, "not_in_optimizer", "not_in_optimizer", apply=[mk.leave_out_of_optimizer(_mod)], faults=(_mod,))

# A .detach() in forward: everything before it gets no gradient. GPT-2's wte still gets one through
# the tied lm_head, so only wpe and block 0 are labelled.
for _arch, _opt, _at, _faults in [
    ("mlp", "sgd", "net.3", ("net.0", "net.2")),
    ("gpt2", "adamw", "transformer.h.0", ("transformer.wpe", "transformer.h.0")),
    ("lstm", "adamw", "emb", ("emb",)),
    ("bert", "adamw", "bert.encoder.layer.0", ("bert.embeddings", "bert.encoder.layer.0")),
]:
    _add(_arch, _opt, "no_gradient", "no_gradient", apply=[mk.detach_output(_at)], faults=_faults)

# A middle layer frozen by mistake (requires_grad_(False)).
for _arch, _opt, _mod in [
    ("mlp", "adamw", "net.4"),
    ("gpt2", "sgd", "transformer.h.1.attn"),
    ("cnn", "adamw", "features.3"),
    ("resnet", "sgd", "resnet.encoder.stages.0.layers.0.layer.1.convolution"),
    ("bert", "adamw", "bert.encoder.layer.0.intermediate.dense"),
]:
    _add(_arch, _opt, "frozen", "frozen", apply=[mk.freeze(_mod)], faults=(_mod,))

# Vanishing: saturating activations (a 10-layer sigmoid MLP), a deep tanh MLP or a CNN with init
# x0.3 / x0.1, no normalisation. Labelled: the input-side layers whose weight gradient is below 1% of
# the largest layer's over the first 10 steps (measured on these runs; biases go with their weight).
_SIGMOID10 = {"act": "sigmoid", "depth": 10}
for _opt in OPTIMIZERS:
    _add(
        "mlp",
        _opt,
        "vanishing_sigmoid",
        "vanishing",
        variant=_SIGMOID10,
        faults=tuple(f"net.{2 * i}" for i in range(8)),
    )
_add(
    "mlp",
    "adamw",
    "vanishing_small_init",
    "vanishing",
    variant={"act": "tanh", "depth": 8},
    apply=[mk.scale_weights(0.3)],
    faults=tuple(f"net.{2 * i}" for i in range(6)),
)
_add(
    "cnn",
    "sgd",
    "vanishing_small_init",
    "vanishing",
    apply=[mk.scale_weights(0.1)],
    faults=("features.0", "features.3"),
)

# Exploding: every weight x4 (MLP) / x6 (CNN) without normalisation. Labelled: the parameters whose
# gradient norm over the first 10 steps is over 100x that of the same healthy run (measured).
_add(
    "mlp",
    "sgd",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(4.0)],
    faults=("net.0", "net.2", "net.4", "net.6", "net.8", "net.10.weight", "net.12.weight"),
)
_add(
    "mlp",
    "adamw",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(4.0)],
    faults=("net.0", "net.2", "net.4", "net.6.weight", "net.8.weight", "net.10.weight", "net.12.weight"),
)
_add(
    "cnn",
    "sgd",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(6.0)],
    faults=("features.0", "features.3.weight", "features.6.weight", "head.weight"),
)
_add(
    "cnn",
    "adamw",
    "exploding",
    "exploding",
    apply=[mk.scale_weights(6.0)],
    faults=("features.0", "features.3.weight", "features.6.weight", "head.weight"),
)

# Dead ReLUs: a -10 bias before a ReLU (a GELU for GPT-2: its output and slope are exactly 0 there in
# float32). Labelled: the dead layer, then the layers upstream whose only path to the loss runs
# through it (every gradient exactly 0), then the next layer's weight, whose input is now all zeros.
# GPT-2's residual stream keeps feeding the other blocks, so upstream there is only ln_2 (it only
# feeds the MLP).
_add(
    "mlp",
    "sgd",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("net.2", -10.0)],
    faults=("net.2", "net.0", "net.4.weight"),
)
_add(
    "cnn",
    "adamw",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("features.3", -10.0)],
    faults=("features.3", "features.0", "features.6.weight"),
)
_add(
    "gpt2",
    "adamw",
    "dead_units",
    "dead_units",
    apply=[mk.set_bias("transformer.h.0.mlp.c_fc", -10.0)],
    faults=("transformer.h.0.mlp.c_fc", "transformer.h.0.ln_2", "transformer.h.0.mlp.c_proj.weight"),
)

# NaN from the loss: a hand-written NLL whose probabilities underflow to 0 from step 30.
for _arch, _opt in [("mlp", "sgd"), ("gpt2", "adamw"), ("lstm", "adamw")]:
    _add(_arch, _opt, "nonfinite_loss", "nonfinite", apply=[mk.nan_from_loss(30)])
# NaN made inside a parameter-free module (a scale schedule reaching exactly 0) from step 30.
for _arch, _opt, _mod in [
    ("mlp", "adamw", "net.5"),
    ("gpt2", "sgd", "transformer.h.1.mlp.act"),
    ("vit", "adamw", _first_module("vit", "GELUActivation")),
]:
    _add(_arch, _opt, "nonfinite_module", "nonfinite", apply=[mk.nan_in_module(_mod, 30)], origin=_mod)

# Softmax applied before nn.CrossEntropyLoss: the output saturates.
for _arch, _opt, _out in [("mlp", "adamw", "net.12"), ("cnn", "sgd", "head"), ("bert", "adamw", "classifier")]:
    _add(_arch, _opt, "saturated_output", "saturated_output", apply=[mk.softmax_before_cross_entropy], faults=(_out,))

# Unnormalised inputs (x1000): the first layer's gradients and updates are out of scale. Not on the
# ResNet: a BatchNorm right after its first convolution makes both its output and its weight gradient
# independent of the input's scale (measured: the same gradients as the healthy run), so no mistake.
for _arch, _opt, _first in [
    ("mlp", "sgd", "net.0"),
    ("cnn", "adamw", "features.0"),
    ("vit", "sgd", "vit.embeddings.patch_embeddings.projection"),
]:
    _add(_arch, _opt, "input_scale", "input_scale", apply=[mk.scale_inputs(1000.0)], faults=(_first,))

# reduction="sum" over a big batch with SGD (AdamW is invariant to the loss's scale, so the bug is
# harmless there and not labelled): the step is batch-size times too large.
for _arch, _batch in [("mlp", 512), ("gpt2", 64), ("cnn", 256)]:
    _add(_arch, "sgd", "loss_scale", "loss_scale", apply=[mk.summed_loss(_batch)])

# optimizer.zero_grad() between loss.backward() and optimizer.step(): the optimizer receives no
# gradient and no weight moves (whole run: no layer is at fault).
for _arch, _opt in [("mlp", "sgd"), ("cnn", "adamw"), ("lstm", "sgd"), ("gpt2", "adamw")]:
    _add(_arch, _opt, "cleared_before_step", "cleared_before_step", apply=[mk.clear_before_step])

# model.half() trained with AdamW and no loss scaling: float16 weights and optimizer state (Adam's
# eps is 0 in float16: NaN from the first update). Not the CNN: float16 convolutions on the CPU take
# minutes.
for _arch in ("mlp", "lstm", "gpt2", "llama"):
    _add(_arch, "adamw", "half_weights", "half_weights", apply=[mk.half_weights])

# Inputs and labels shuffled apart (classification tasks: a language model's shuffled targets still
# teach it the token frequencies): the loss stays at chance with healthy training.
for _arch, _opt in [("mlp", "adamw"), ("cnn", "sgd"), ("bert", "adamw"), ("vit", "adamw")]:
    _add(_arch, _opt, "labels_apart", "learns_nothing", apply=[mk.shuffle_labels_apart])

# model.eval() left on while training: called once before the loop, or for an evaluation at some step
# with no model.train() after it. Where it matters: the ResNet's BatchNorms (labelled: the cause
# names them) and dropout (the tabular MLP's, BERT's and GPT-2's at the libraries' default 0.1; no
# layer is at fault). Slow: BERT's evaluation comes at step 60, past the 50 steps a detection is
# expected within.
_add(
    "resnet",
    "sgd",
    "eval_before_loop",
    "eval_mode",
    apply=[mk.eval_left_on(0)],
    faults=_modules("resnet", "BatchNorm2d"),
)
_add("tabular", "adamw", "eval_left_on", "eval_mode", apply=[mk.eval_left_on(40)], task="wine", style="wine")
_add(
    "bert",
    "adamw",
    "eval_left_on",
    "eval_mode",
    variant={"dropout": 0.1},
    apply=[mk.eval_left_on(60)],
    style="dropout",
    slow=True,
)
_add(
    "gpt2",
    "adamw",
    "eval_before_loop",
    "eval_mode",
    variant={"dropout": 0.1},
    apply=[mk.eval_left_on(0)],
    style="dropout",
)
