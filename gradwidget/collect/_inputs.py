"""What a Recorder is given, checked up front and made sense of: its arguments, the model and
optimizer behind their wrappers (``torch.compile``, accelerate, Lightning), parameter names and
ties, which parameters can be recorded, and the one Recorder attached to each model.
"""

from __future__ import annotations

import math
import os
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .._warnings import GradwidgetWarning
from ..schema import check_scalar


def _compiling() -> bool:
    return torch.compiler.is_compiling()


_COMPILED_PREFIX = "_orig_mod."


def _clean_compiled(name: str) -> str:
    """A parameter name without the ``_orig_mod.`` that ``torch.compile`` inserts for a compiled
    submodule (``block._orig_mod.weight`` is ``block.weight``, as the user wrote it)."""
    return name.replace("." + _COMPILED_PREFIX, ".").removeprefix(_COMPILED_PREFIX)


def _unwrapped(model):
    """The module a ``torch.compile`` wrapper compiles (its hooks and names are the user's)."""
    while isinstance(model, nn.Module) and isinstance(getattr(model, "_orig_mod", None), nn.Module):
        model = model._orig_mod
    return model


def _unwrapped_optimizer(optimizer):
    """The torch optimizer inside a trainer's wrapper (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``): its step hooks are the ones that run."""
    for attr in ("optimizer", "_optimizer"):
        inner = getattr(optimizer, attr, None)
        if type(optimizer).__name__ in _OPTIMIZER_WRAPPERS and isinstance(inner, torch.optim.Optimizer):
            return inner
    return optimizer


_OPTIMIZER_WRAPPERS = ("AcceleratedOptimizer", "LightningOptimizer")


def _module_of(model: nn.Module, pname: str) -> tuple[str, str]:
    path = pname.rsplit(".", 1)[0] if "." in pname else ""
    try:
        mod = model.get_submodule(path) if path else model
        return path, type(_unwrapped(mod)).__name__
    except AttributeError:
        return path, ""


def _tied_names(model: nn.Module, params: list) -> dict[int, tuple[str, ...]]:
    """For each recorded tensor that the model holds under more than one name (tied weights), its
    other names: ``named_parameters`` lists a shared tensor once, under its first name."""
    seen: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(p), []).append(_clean_compiled(name))
    ids = {id(p) for p in params}
    return {k: tuple(v[1:]) for k, v in seen.items() if k in ids and len(v) > 1}


def _bytes_arg(name: str, value) -> int:
    """A positive size in bytes (an int, or a whole float such as 1e9)."""
    ok = (
        isinstance(value, (int, np.integer, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value == int(value)
    )
    if not ok:
        raise TypeError(
            f"{name} must be a number of bytes (an int, e.g. 512 << 20 for 512 MiB), "
            f"got {type(value).__name__} {value!r}"
        )
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    return int(value)


def _skip_reason(p: torch.Tensor) -> str | None:
    """Why a parameter cannot be recorded (None if it can): the statistics are of real floating
    tensors holding data; complex, integer/bool and meta-device (no data) tensors are not."""
    if p.is_meta:
        return "on the meta device"
    if p.is_complex():
        return f"complex ({str(p.dtype).replace('torch.', '')})"
    if not p.is_floating_point():
        return f"not floating point ({str(p.dtype).replace('torch.', '')})"
    return None


def _skipped_text(skipped: dict[str, str]) -> str:
    return ", ".join(f"{n} ({why})" for n, why in skipped.items())


def _recordable(named: list) -> tuple[list, dict[str, str]]:
    """The ``(name, parameter)`` pairs that can be recorded, and ``{name: why}`` of those that cannot,
    listed in one warning (their layers are left out of the run; ``run.meta["skipped"]`` keeps them)."""
    keep, skipped = [], {}
    for n, p in named:
        why = _skip_reason(p)
        if why is None:
            keep.append((n, p))
        else:
            skipped[n] = why
    if skipped and keep:
        warnings.warn(
            f"gradwidget: {len(skipped)} parameter(s) cannot be recorded and are left out: {_skipped_text(skipped)}",
            GradwidgetWarning,
            stacklevel=3,
        )
    return keep, skipped


@dataclass(frozen=True)
class OptimizerExtra:
    """What an optimizer holds beyond the model's parameters, which the Recorder leaves out: a
    learnable loss temperature or multi-task loss weights (legitimate), or the old head of a
    ``model.classifier`` replaced after the optimizer was built (a mistake the analysis then names
    as ``not_in_optimizer`` on the new head). Said in ``repr(recorder)`` and ``run.meta``, not in a
    warning: the legitimate setups must not warn at every run."""

    tensors: int  #: how many tensors
    values: int  #: their entries in all
    held: int  #: tensors the optimizer holds in all
    shapes: tuple[tuple[int, ...], ...]  #: the first few tensors' shapes

    def text(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        more = ", ..." if self.tensors > len(self.shapes) else ""
        return (
            f"ignoring {self.tensors} of the optimizer's {self.held} tensors that are not the model's "
            f"({self.values:,} values: {shapes}{more})"
        )

    def to_dict(self) -> dict:
        return {"tensors": self.tensors, "values": self.values, "shapes": [list(s) for s in self.shapes]}


def _optimizer_extra(model: nn.Module, optimizer, named: list) -> OptimizerExtra | None:
    """The optimizer's tensors that are not parameters of ``model`` (None: there are none). An
    optimizer that holds none of the model's parameters is the wrong one: that raises, with what to do."""
    if optimizer is None:
        return None
    held = [p for g in optimizer.param_groups for p in g["params"]]
    mine = {id(p) for _, p in named}
    extra = [p for p in held if id(p) not in mine]
    if not extra:
        return None
    if len(extra) == len(held):
        raise ValueError(
            f"the optimizer holds none of this {type(model).__name__}'s parameters ({len(held)} tensor(s) of "
            "something else): pass the optimizer built from model.parameters()"
        )
    return OptimizerExtra(
        len(extra), sum(p.numel() for p in extra), len(held), tuple(tuple(p.shape) for p in extra[:_SHAPES_SHOWN])
    )


#: shapes of the ignored optimizer tensors listed in repr
_SHAPES_SHOWN = 4


def _check_number(name: str, value):
    """A loss, learning rate or global norm given to ``Recorder.log``: a number in the scalar's
    range (``schema.SCALAR_RULES``), or a real tensor read at record time (one value, except a loss,
    whose mean is taken); anything else fails here, not later inside the optimizer step."""
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a real number or a real tensor, got a {value.dtype} tensor")
        if name != "loss" and value.numel() != 1:
            raise ValueError(f"{name} must be one number, got a tensor of shape {tuple(value.shape)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number (or a torch tensor), got {type(value).__name__} {value!r:.40}")
    return check_scalar(name, value)


#: model -> weak reference to the Recorder attached to it; weak both ways, so neither is kept alive
_ATTACHED: "weakref.WeakKeyDictionary[nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()


def _shapes(names: list[str], params: list[torch.Tensor]) -> dict[str, tuple]:
    """Each parameter's shape by name; a lazy module's parameter has none until its first forward."""
    lazy = [n for n, p in zip(names, params) if nn.parameter.is_lazy(p)]
    if lazy:
        raise ValueError(
            f"{', '.join(lazy[:3])}{' ...' if len(lazy) > 3 else ''} not initialised yet (a lazy module): run one "
            "forward pass before resuming, so that the layers can be checked against the run"
        )
    return {n: tuple(p.shape) for n, p in zip(names, params)}


def _hands_over(model: nn.Module, log_dir) -> bool:
    """Does the Recorder attached to ``model`` (which a new one replaces) write ``log_dir``? Then
    the new one may take the folder over: the old one is detached, its writer closed, first."""
    ref = _ATTACHED.get(model)
    old = ref() if ref is not None else None
    if old is None or not old.attached or old.log_dir is None:
        return False
    try:
        return os.path.samefile(old.log_dir, log_dir)
    except (OSError, TypeError, ValueError):
        return False


def _replace_attached(model: nn.Module, new: object) -> None:
    """Detach the Recorder still attached to ``model`` (re-running a notebook cell that builds a
    Recorder or GradientPanel would otherwise stack recorders that all keep recording)."""
    ref = _ATTACHED.get(model)
    old = ref() if ref is not None else None
    if old is not None and old is not new and old.attached:
        old.detach()
        n = old.run.n_steps if old.run is not None else 0
        warnings.warn(
            f"gradwidget: a previous Recorder on this {type(model).__name__} was detached; "
            f"its run keeps the {n} steps it recorded",
            GradwidgetWarning,
            stacklevel=3,
        )
    _ATTACHED[model] = weakref.ref(new)
