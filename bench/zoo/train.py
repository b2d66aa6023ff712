"""Training one zoo case: build the arch, let the case's mistake change the setup, train with a
``gradwidget.Recorder`` attached, return the Run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .models import ARCHS


def mean_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, y)


@dataclass
class Setup:
    """Everything about one training run that a mistake may change."""

    model: nn.Module
    optimizer_name: str
    lr: float
    params: list  #: what the optimizer is given
    zero_grad: bool = True  #: call optimizer.zero_grad() every step
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = mean_cross_entropy
    inputs: Callable[[torch.Tensor], torch.Tensor] = lambda x: x
    batch_size: int | None = None  #: override the task's batch size
    on_step: list = field(default_factory=list)  #: callables (step) run before each forward

    def make_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.params, lr=self.lr, momentum=0.9)
        if self.optimizer_name == "adamw":
            return torch.optim.AdamW(self.params, lr=self.lr, weight_decay=0.01)
        raise ValueError(f"unknown optimizer {self.optimizer_name!r}; the zoo uses 'sgd' and 'adamw'")


def train(
    arch_name: str,
    optimizer: str,
    seed: int,
    steps: int,
    *,
    variant: dict | None = None,
    lr_factor: float = 1.0,
    mistakes: tuple = (),
    histogram_every: int = 10,
):
    """Train ``arch_name`` for ``steps`` optimizer steps with each of ``mistakes`` (``fn(setup)``)
    applied, and return the recorded ``gradwidget.Run``."""
    from gradwidget import Recorder

    arch = ARCHS[arch_name]
    if optimizer not in arch.lr:
        raise ValueError(f"{arch_name} has no healthy {optimizer} learning rate; it trains with {sorted(arch.lr)}")
    torch.manual_seed(seed)
    model = arch.build(**(variant or {}))
    model.train()
    task = arch.task(seed)
    s = Setup(model, optimizer, arch.lr[optimizer] * lr_factor, list(model.parameters()))
    for apply in mistakes:
        apply(s)
    if s.batch_size is not None:
        task.batch_size = s.batch_size
    opt = s.make_optimizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and shares the machine
    try:
        with Recorder(model, opt, histogram_every=histogram_every, max_steps=None) as rec:
            for step in range(steps):
                for hook in s.on_step:
                    hook(step)
                x, y = task.batch()
                if s.zero_grad:
                    opt.zero_grad()
                logits = arch.forward(model, s.inputs(x))
                loss = s.criterion(logits, y.reshape(-1) if arch.flat_targets else y)
                loss.backward()
                rec.log(loss=loss, lr=opt.param_groups[0]["lr"])  # with its graph: the loss_graph probe reads it
                opt.step()
    finally:
        torch.set_num_threads(threads)
    return rec.run
