"""Training one zoo case: build the arch (from a pretrained state for fine-tuning cases), let the
case's training style and mistake change the setup, train with a ``gradwidget.Recorder`` attached,
return the Run. The loop is the one in every tutorial: zero_grad, forward, loss, backward, (clip),
step, (scheduler step)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .cache import DEFAULT_CACHE
from .data import Task
from .models import ARCHS, TASKS, build


class PendingCase(RuntimeError):
    """The case cannot be recorded yet: gradwidget refuses its setup (see the message)."""


def mean_loss(task: Task) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The task's loss, mean over the batch: cross entropy, or squared error for regression."""
    if task.regression:
        return lambda out, y: nn.functional.mse_loss(out, y)
    return lambda logits, y: nn.functional.cross_entropy(logits, y)


@dataclass
class Setup:
    """Everything about one training run that a training style or a mistake may change."""

    model: nn.Module
    task: Task
    optimizer_name: str
    lr: float
    params: list  #: what the optimizer is given
    zero_grad: bool = True  #: call optimizer.zero_grad() every step
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  #: None: mean_loss(task)
    inputs: Callable[[torch.Tensor], torch.Tensor] | None = None  #: None: the task's ``prepare``
    batch_size: int | None = None  #: override the task's batch size
    weight_decay: float | None = None  #: None: AdamW's 0.01, none for SGD
    clip: float | None = None  #: clip_grad_norm_ to this before each step
    schedule: Callable | None = None  #: (optimizer, steps) -> an LR scheduler stepped every step
    on_step: list = field(default_factory=list)  #: callables (step) run before each forward
    after_optimizer: list = field(default_factory=list)  #: callables (setup, optimizer), once, in order

    def make_optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.params, lr=self.lr, momentum=0.9, weight_decay=self.weight_decay or 0.0)
        if self.optimizer_name == "adamw":
            wd = 0.01 if self.weight_decay is None else self.weight_decay
            return torch.optim.AdamW(self.params, lr=self.lr, weight_decay=wd)
        raise ValueError(f"unknown optimizer {self.optimizer_name!r}; the zoo uses 'sgd' and 'adamw'")


def train(
    arch_name: str,
    optimizer: str,
    seed: int,
    steps: int,
    *,
    variant: dict | None = None,
    task: str | None = None,
    pretrain=None,
    styles: tuple = (),
    mistakes: tuple = (),
    histogram_every: int = 10,
    cache_dir=DEFAULT_CACHE,
):
    """Train ``arch_name`` for ``steps`` optimizer steps on ``task`` (the arch's by default), from
    ``pretrain``'s state when given, with each of ``styles`` then ``mistakes`` (``fn(setup)``)
    applied, and return the recorded ``gradwidget.Run``."""
    from gradwidget import Recorder

    from .pretrain import pretrained_state

    arch = ARCHS[arch_name]
    if optimizer not in arch.lr:
        raise ValueError(f"{arch_name} has no healthy {optimizer} learning rate; it trains with {sorted(arch.lr)}")
    state = None if pretrain is None else pretrained_state(arch_name, pretrain, cache_dir)
    torch.manual_seed(seed)
    model = build(arch_name, state, **(variant or {}))
    model.train()
    t = TASKS[task or arch.task](seed)
    trainable = [p for p in model.parameters() if p.requires_grad]
    s = Setup(model, t, optimizer, arch.lr[optimizer], trainable)
    for apply in (*styles, *mistakes):
        apply(s)
    if s.batch_size is not None:
        t.batch_size = s.batch_size
    criterion = s.criterion or mean_loss(t)
    inputs = s.inputs or t.prepare
    opt = s.make_optimizer()
    sched = None if s.schedule is None else s.schedule(opt, steps)
    for hook in s.after_optimizer:
        hook(s, opt)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest and shares the machine
    try:
        try:
            rec = Recorder(s.model, opt, histogram_every=histogram_every, max_steps=None)
        except ValueError as e:
            if not s.after_optimizer:
                raise
            raise PendingCase(f"gradwidget.Recorder refuses this setup: {e}") from e
        with rec:
            for step in range(steps):
                for hook in s.on_step:
                    hook(step)
                x, y = t.batch()
                if s.zero_grad:
                    opt.zero_grad()
                logits = arch.forward(s.model, inputs(x), y)
                loss = criterion(logits, y.reshape(-1) if arch.flat_targets else y)
                loss.backward()
                if s.clip is not None:
                    torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.clip)
                rec.log(loss=loss, lr=opt.param_groups[0]["lr"])  # with its graph: the loss_graph probe reads it
                opt.step()
                if sched is not None:
                    sched.step()
    finally:
        torch.set_num_threads(threads)
    return rec.run
