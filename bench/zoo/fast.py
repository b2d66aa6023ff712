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
    "llama-sgd-s0-healthy",
    "moe-adamw-s0-healthy",
    "t5-adamw-s0-healthy",
    "distilbert-adamw-s0-healthy",
    "convnext-sgd-s0-healthy",
    "tabular-adamw-s0-healthy-wine",
    "mlp-sgd-s0-lr_too_high",
    "mlp-adamw-s0-lr_too_low",
    "lstm-sgd-s0-missing_zero_grad",
    "mlp-adamw-s0-not_in_optimizer",
    "gpt2-adamw-s0-no_gradient",
    "mlp-adamw-s0-frozen",
    "mlp-sgd-s0-dead_units",
    "mlp-sgd-s0-vanishing_sigmoid",
    "mlp-sgd-s0-exploding",
    "mlp-sgd-s0-nonfinite_loss",
    "mlp-adamw-s0-nonfinite_module",
    "mlp-adamw-s0-saturated_output",
    "mlp-sgd-s0-input_scale",
    "mlp-sgd-s0-loss_scale",
)
_unknown = set(FAST_IDS) - set(RECIPES)
assert not _unknown, f"FAST_IDS names no case: {sorted(_unknown)}"

#: the FAST cases themselves, in CASES order
FAST = [c for c in CASES if c.id in FAST_IDS]
