"""The ways people really train, each a function ``apply(setup)`` like the mistakes: warmup then a
cosine decay, gradient clipping, weight decay, a learning rate of their own, small batches. Fine-
tuning (a pretrained state, parts frozen on purpose, LoRA) is in the case's recipe (``pretrain``,
``variant``), since it changes the model before the setup exists."""

from __future__ import annotations

import math

import torch

from .mistakes import Mistake
from .train import Setup

Style = Mistake  #: the same shape: a change to a Setup


def warmup_cosine(warmup: int = 10, floor: float = 0.1) -> Style:
    """Linear warmup over ``warmup`` steps, then a cosine decay to ``floor`` x the peak (the
    transformers ``get_cosine_schedule_with_warmup`` shape, as a LambdaLR)."""

    def schedule(opt, steps: int):
        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            done = (step - warmup) / max(1, steps - warmup)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done))

        return torch.optim.lr_scheduler.LambdaLR(opt, factor)

    def apply(s: Setup) -> None:
        s.schedule = schedule

    return apply


def step_decay(every: int = 40, gamma: float = 0.3) -> Style:
    """StepLR: the rate x ``gamma`` every ``every`` steps (the classic ImageNet recipe, shortened)."""

    def apply(s: Setup) -> None:
        s.schedule = lambda opt, steps: torch.optim.lr_scheduler.StepLR(opt, every, gamma)

    return apply


def clip(max_norm: float = 1.0) -> Style:
    """``clip_grad_norm_(model.parameters(), max_norm)`` before every step."""

    def apply(s: Setup) -> None:
        s.clip = max_norm

    return apply


def weight_decay(value: float) -> Style:
    def apply(s: Setup) -> None:
        s.weight_decay = value

    return apply


def lr(value: float) -> Style:
    """A learning rate of the user's own (not the arch's default healthy one)."""

    def apply(s: Setup) -> None:
        s.lr = value

    return apply


def batch(size: int) -> Style:
    """Small batches: noisier gradients and a noisier loss."""

    def apply(s: Setup) -> None:
        s.batch_size = size

    return apply


def reset_head(path: str) -> Style:
    """A fresh head for the fine-tuning task (``reset_parameters`` on the pretrained one)."""

    def apply(s: Setup) -> None:
        s.model.get_submodule(path).reset_parameters()

    return apply
