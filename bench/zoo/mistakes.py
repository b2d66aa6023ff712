"""The zoo's injected mistakes, each a function ``apply(setup)`` that changes one thing about a
healthy training setup (``train.Setup``) the way the bug people post about does.

Module paths are dotted names as in ``model.named_modules()``; ``params_under`` gives the parameter
names a mistake at a path touches, which is how the cases get their ``fault_layers`` labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import warnings

import torch
from torch import nn

from gradwidget._warnings import GradwidgetWarning

from .train import Setup

Mistake = Callable[[Setup], None]


def under(name: str, prefix: str) -> bool:
    """Whether parameter ``name`` belongs to the module at path ``prefix``."""
    return name == prefix or name.startswith(prefix + ".")


def params_under(model: nn.Module, prefixes: Iterable[str]) -> tuple[str, ...]:
    """Names of ``model``'s parameters under ``prefixes`` (module paths, or parameter names for one
    parameter), in the order of ``prefixes`` (the most affected first), then ``named_parameters``."""
    names = [n for n, _ in model.named_parameters()]
    out: list[str] = []
    for p in prefixes:
        if p not in names:
            model.get_submodule(p)  # a path that names nothing is a typo in a case, not an empty label
        out += [n for n in names if under(n, p) and n not in out]
    return tuple(out)


def scale_lr(factor: float) -> Mistake:
    def apply(s: Setup) -> None:
        s.lr *= factor

    return apply


def no_zero_grad(s: Setup) -> None:
    """``optimizer.zero_grad()`` is never called: gradients accumulate across steps."""
    s.zero_grad = False


def leave_out_of_optimizer(*prefixes: str) -> Mistake:
    """The optimizer is built without these modules' parameters (they still get gradients)."""

    def apply(s: Setup) -> None:
        params_under(s.model, prefixes)
        s.params = [p for n, p in s.model.named_parameters() if not any(under(n, q) for q in prefixes)]

    return apply


def _detached(output):
    if isinstance(output, torch.Tensor):
        return output.detach()
    if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
        return (output[0].detach(),) + output[1:]
    raise TypeError(f"cannot detach a module output of type {type(output).__name__}")


def detach_output(prefix: str) -> Mistake:
    """The output of the module at ``prefix`` is ``.detach()``ed in forward (a forward hook): nothing
    before it gets a gradient through that path."""

    def apply(s: Setup) -> None:
        s.model.get_submodule(prefix).register_forward_hook(lambda m, args, out: _detached(out))

    return apply


def freeze(*prefixes: str) -> Mistake:
    """``requires_grad_(False)`` on modules that were meant to train (still in the optimizer)."""

    def apply(s: Setup) -> None:
        for p in prefixes:
            s.model.get_submodule(p).requires_grad_(False)

    return apply


def scale_weights(factor: float, *prefixes: str, names: tuple[str, ...] = ("weight",)) -> Mistake:
    """Multiply the initial values of the named parameters of these modules (all modules when no
    prefix is given) by ``factor``: too-small or too-large initialisation."""

    def apply(s: Setup) -> None:
        with torch.no_grad():
            for n, p in s.model.named_parameters():
                if n.rsplit(".", 1)[-1].startswith(names) and (not prefixes or any(under(n, q) for q in prefixes)):
                    p.mul_(factor)

    return apply


def set_bias(prefix: str, value: float) -> Mistake:
    """Initialise one layer's bias to ``value`` (a large negative bias kills the ReLUs after it)."""

    def apply(s: Setup) -> None:
        bias = s.model.get_submodule(prefix).bias
        if not isinstance(bias, torch.Tensor):
            raise TypeError(f"{prefix} has no bias to set")
        with torch.no_grad():
            bias.fill_(value)

    return apply


class DividingSchedule(nn.Module):
    """A parameter-free module that divides its input by a factor annealed linearly to exactly 0 at
    forward call ``at`` (a temperature or scale schedule without a floor): Inf/NaN from then on."""

    def __init__(self, inner: nn.Module, at: int):
        super().__init__()
        self.inner, self.at, self.calls = inner, at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = max(0.0, 1.0 - self.calls / self.at) if self.training else 1.0
        self.calls += self.training
        return self.inner(x) / torch.tensor(scale, dtype=x.dtype)


def nan_in_module(prefix: str, at: int) -> Mistake:
    """Wrap the parameter-free module at ``prefix`` so that it produces Inf/NaN from step ``at``."""

    def apply(s: Setup) -> None:
        parent, _, child = prefix.rpartition(".")
        owner = s.model.get_submodule(parent) if parent else s.model
        inner = owner.get_submodule(child)
        if any(True for _ in inner.parameters()):
            raise ValueError(f"{prefix} has parameters; nan_in_module wraps a parameter-free module")
        setattr(owner, child, DividingSchedule(inner, at))

    return apply


def nan_from_loss(at: int) -> Mistake:
    """A hand-written NLL on probabilities, ``-log(softmax(logits / T)[y])``, with a temperature T
    annealed so that from step ``at`` the probabilities of wrong classes underflow to exact 0 in
    float32 and the log of them is -Inf: the NaN starts in the loss, no module makes it."""

    def apply(s: Setup) -> None:
        state = {"step": 0}
        s.on_step.append(lambda step: state.update(step=step))

        def criterion(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            t = 1.0 if state["step"] < at else 1e-6
            probs = torch.softmax(logits / t, dim=-1)
            return -probs.gather(1, y[:, None]).log().mean()

        s.criterion = criterion

    return apply


def nll_on_softmax(s: Setup) -> None:
    """The model ends in ``nn.Softmax`` and is trained with ``nn.NLLLoss`` (which expects log
    probabilities): the loss is ``-p[y]``, bounded, and its gradient vanishes as p saturates."""
    s.criterion = lambda logits, y: nn.functional.nll_loss(torch.softmax(logits, -1), y)


def softmax_before_cross_entropy(s: Setup) -> None:
    """``nn.CrossEntropyLoss`` given softmax probabilities instead of logits (it applies log-softmax
    itself): the loss saturates and the output gradients shrink."""
    s.criterion = lambda logits, y: nn.functional.cross_entropy(torch.softmax(logits, -1), y)


def scale_inputs(factor: float) -> Mistake:
    """Unnormalised inputs: raw values ``factor`` times the standardised ones."""

    def apply(s: Setup) -> None:
        prepare = s.task.prepare
        s.inputs = lambda x: prepare(x) * factor

    return apply


def skip_preprocessing(s: Setup) -> None:
    """The preprocessing is forgotten: pixels go in as 0-255 (no ``/ 255``, no Normalize), tabular
    measurements without the StandardScaler (wine's proline ~1000, a tumour's area ~2000)."""
    s.inputs = s.task.raw


def replace_head_after_optimizer(path: str) -> Mistake:
    """``model.<head> = nn.Linear(...)`` after ``AdamW(model.parameters())`` was built: the new head
    trains in forward and backward, but the optimizer still holds the old head's tensors."""

    def replace(s: Setup, opt) -> None:
        parent, _, child = path.rpartition(".")
        owner = s.model.get_submodule(parent) if parent else s.model
        old = owner.get_submodule(child)
        setattr(owner, child, nn.Linear(old.in_features, old.out_features, bias=old.bias is not None))

    def apply(s: Setup) -> None:
        s.after_optimizer.append(replace)

    return apply


def no_grad_backbone(prefix: str) -> Mistake:
    """The backbone runs under ``torch.no_grad()`` (``with torch.no_grad(): h = model.backbone(x)``,
    copied from an evaluation loop or a feature-extraction recipe) while it was meant to train:
    none of its parameters gets a gradient."""

    def apply(s: Setup) -> None:
        module = s.model.get_submodule(prefix)
        module.forward = torch.no_grad()(module.forward)

    return apply


def summed_loss(batch_size: int) -> Mistake:
    """``reduction="sum"`` instead of the mean over a big batch: the gradient grows with the batch."""

    def apply(s: Setup) -> None:
        if s.task.regression:
            s.criterion = lambda out, y: nn.functional.mse_loss(out, y, reduction="sum")
        else:
            s.criterion = lambda logits, y: nn.functional.cross_entropy(logits, y, reduction="sum")
        s.batch_size = batch_size

    return apply


def clear_before_step(s: Setup) -> None:
    """``optimizer.zero_grad()`` between ``loss.backward()`` and ``optimizer.step()`` (a line moved
    in a refactor): the step finds no gradient, so no weight ever moves."""

    def wrap(s: Setup, opt: torch.optim.Optimizer) -> None:
        step = opt.step

        def cleared_step(*args, **kwargs):
            opt.zero_grad()
            with warnings.catch_warnings():  # the Recorder says it once; the zoo expects it
                warnings.filterwarnings("ignore", ".*were gone when optimizer.step", GradwidgetWarning)
                return step(*args, **kwargs)

        opt.step = cleared_step  # type: ignore[method-assign]

    s.after_optimizer.append(wrap)


def half_weights(s: Setup) -> None:
    """``model.half()`` and float16 inputs, trained with the usual optimizer and no GradScaler: the
    weights and the optimizer's state are float16 (updates under 2**-11 of a weight round away,
    Adam's eps underflows, small gradients flush to zero)."""
    s.model.half()
    prepare = s.inputs or s.task.prepare
    s.inputs = lambda x: (lambda v: v.half() if v.is_floating_point() else v)(prepare(x))


def shuffle_labels_apart(s: Setup) -> None:
    """Inputs and labels shuffled separately (two ``randperm`` calls, or two DataLoaders with
    ``shuffle=True``): each batch's labels belong to other inputs, so nothing can be learned."""
    task, batch = s.task, s.task.batch
    gen = torch.Generator().manual_seed(task.seed + 2000)

    def apart():
        x, y = batch()
        return x, task.y[torch.randint(0, len(task.y), (len(y),), generator=gen)]

    task.batch = apart  # type: ignore[method-assign]


def eval_left_on(at: int) -> Mistake:
    """``model.eval()`` for an evaluation at step ``at`` (0: before the training loop) and no
    ``model.train()`` after it: from then on BatchNorm normalises with running statistics that never
    update and dropout is off, while the optimizer goes on stepping."""

    def apply(s: Setup) -> None:
        s.on_step.append(lambda step: step == at and s.model.eval())

    return apply
