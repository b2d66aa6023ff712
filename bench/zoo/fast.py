"""The fast subset (tests/test_zoo.py, ``diagnosis.py --fast``): each architecture healthy once and
each cause once, on the cheapest cases that show them."""

from __future__ import annotations

from .cases import CASES, RECIPES

#: each healthy architecture once and each mistake once, on the cheapest case that shows it
FAST_IDS: tuple[str, ...] = (
    "mlp-sgd-s0-healthy",
    "cnn-sgd-s0-healthy",
    "lstm-sgd-s0-healthy",
    "gpt2-adamw-s0-healthy",
    "bert-adamw-s0-healthy",
    "resnet-sgd-s0-healthy",
    "vit-adamw-s0-healthy",
    "gru-adamw-s0-healthy",
    "rnn-adamw-s0-healthy",
    "llama-adamw-s0-healthy",
    "moe-adamw-s0-healthy",
    "t5-adamw-s0-healthy",
    "distilbert-adamw-s0-healthy",
    "convnext-sgd-s0-healthy",
    "tabular-adamw-s0-healthy-wine",
    "mlp-sgd-s0-lr_too_high",
    "mlp-adamw-s0-lr_too_low",
    "tabular-adamw-s0-missing_zero_grad-cancer",
    "mlp-adamw-s0-not_in_optimizer",
    "resnet-adamw-s0-no_grad_backbone-digits",
    "mlp-adamw-s0-frozen",
    "mlp-sgd-s0-dead_units",
    "mlp-sgd-s0-vanishing_sigmoid",
    "mlp-sgd-s0-exploding",
    "mlp-sgd-s0-nonfinite_loss",
    "mlp-adamw-s0-nonfinite_module",
    "tabular-adamw-s0-nll_on_softmax-wine",
    "cnn-sgd-s0-raw_pixels-digits",
    "mlp-sgd-s0-loss_scale",
    "mlp-sgd-s0-cleared_before_step",
    "mlp-adamw-s0-half_weights",
    "mlp-adamw-s0-labels_apart",
    "tabular-adamw-s0-eval_left_on-wine",
)
_unknown = set(FAST_IDS) - set(RECIPES)
assert not _unknown, f"FAST_IDS names no case: {sorted(_unknown)}"

#: the FAST cases themselves, in CASES order
FAST = [c for c in CASES if c.id in FAST_IDS]

#: architectures by training cost, cheapest first (measured: tabular ~0.5 s, T5 ~6 s per 120 steps)
_COST_ORDER = (
    "tabular",
    "mlp",
    "rnn",
    "cnn",
    "lstm",
    "llama",
    "moe",
    "resnet",
    "convnext",
    "gpt2",
    "gru",
    "bert",
    "distilbert",
    "vit",
    "t5",
)


def first_per_cause(cases) -> list:
    """One case per cause (and one healthy), the cheapest architecture's, in ``cases`` order."""
    best: dict = {}
    for c in cases:
        key = c.cause or "healthy"
        if key not in best or _COST_ORDER.index(c.arch) < _COST_ORDER.index(best[key].arch):
            best[key] = c
    chosen = set(id(c) for c in best.values())
    return [c for c in cases if id(c) in chosen]
