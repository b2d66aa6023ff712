"""Following a model and an optimizer that change while training, for the Recorder.

- **Lazy modules** (``nn.LazyLinear``): their parameters have no shape until the first forward;
  their gradient hooks are put on at the end of it (``watch_lazy``).
- **Unfreezing** (``requires_grad_(True)`` and ``optimizer.add_param_group`` at step N): a column
  marked frozen that now has a gradient becomes trainable, and the update norms are planned again
  whenever the optimizer's parameters change.
- **A layer replaced** (``model.fc = nn.Linear(...)``, a parameter re-created): module and parameter
  registration hooks (torch's global ones, filtered to this model's modules) mark the model as
  changed; at the next step the Recorder follows a parameter re-created under the same name with the
  same shape and dtype, and says once, naming them, which it cannot follow (new names, new shapes,
  parameters gone): a run's columns are fixed when it starts.
- **A new optimizer** (a second fine-tuning phase): torch's global optimizer step pre-hook sees an
  optimizer stepping this model's parameters that is not the Recorder's; the Recorder moves its hooks
  to it when it holds every trainable parameter the old one held, or when it steps twice with no
  step of the old one between (two optimizers over parts of one model, stepped alike, stay as they
  are).
- **No gradient at all** (``torch.func.functional_call`` on copies of the parameters, a model
  swapped for a copy): the steps have nothing to record; said once instead of recording nothing
  silently.

Private to ``gradwidget.collect``. The watch owns its hooks and what it has seen; it changes
nothing of the Recorder's: it reads the recorded parameters and asks the Recorder, through the
callbacks of a ``WatchHost``, to follow what it found.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import numpy as np
import torch
from torch import nn

from .._warnings import GradwidgetWarning
from ._hooks import Hook
from ._inputs import _clean_compiled
from ._probe import Probe


def _weak(method) -> Hook:
    """A hook calling ``method`` while its object lives (a no-op after)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        f = ref()
        return None if f is None else f(*args, **kwargs)

    return Hook(call)


def _names_list(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@dataclass(frozen=True)
class WatchHost:
    """What a ``ModelWatch`` sees of its Recorder and may ask of it (the Recorder changes its own
    state: the watch calls these)."""

    model: nn.Module
    #: the recorded parameters by index (read only: the Recorder replaces one when ``rebind`` asks)
    params: Sequence[torch.Tensor]
    names: Sequence[str]
    #: names that are not recorded on purpose (tied to a recorded one, skipped by the user)
    unrecorded: Collection[str]
    optimizer: Callable[[], Any]
    attached: Callable[[], bool]
    #: parameters re-created under their names with the same shape and dtype: ``[(index, new)]``
    rebind: Callable[[list], None]
    #: a lazy parameter got its shape: ``(index, tensor)``
    lazy_ready: Callable[[int, torch.Tensor], None]
    #: the optimizer's parameters changed (``add_param_group``)
    optimizer_changed: Callable[[], None]
    #: another optimizer steps this model in place of the Recorder's
    adopt_optimizer: Callable[[Any], None]


class ModelWatch(Probe):
    """Watches a Recorder's model and optimizer for the changes above (composition: the Recorder
    owns one and calls it at each step; ``close`` takes its hooks off)."""

    def __init__(self, host: WatchHost) -> None:
        self.host = host
        self.changed = False  # a module or parameter of the model was (re)assigned since the last look
        self._modules = {id(m) for m in host.model.modules()}
        self._opt_sig = self._signature(host.optimizer())
        self._told_nograd = self._told_change = False
        self._candidate: tuple[int, int] | None = None  # (id of a foreign optimizer, our steps when it stepped)
        self._own_steps = 0
        self._gone: list[int] = []  # parameter indices no longer in the model (removed, reshaped)
        self._frozen: np.ndarray | None = None  # columns still marked frozen (after the first step)
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim

        # torch's global hooks (every module, every optimizer) hold this watch weakly: a Recorder
        # never detached lives as long as its model, as before, not as long as the process
        self._handles = [
            nn_module.register_module_module_registration_hook(_weak(self._registered)),
            nn_module.register_module_parameter_registration_hook(_weak(self._registered)),
        ]
        if host.optimizer() is not None:
            self._handles.append(optim.register_optimizer_step_pre_hook(_weak(self._any_step)))
        self._lazy_handle: Any = None

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._lazy_handle is not None:
            self._lazy_handle.remove()
            self._lazy_handle = None

    # ------------------------------------------------------------------ lazy modules
    def watch_lazy(self, lazy: list[int]) -> None:
        """Put the gradient hooks of lazy parameters ``lazy`` (indices) on once a forward has given
        them a shape."""
        self._lazy_handle = self.host.model.register_forward_hook(Hook(functools.partial(self._lazy_ready, lazy)))

    def _lazy_ready(self, lazy: list[int], module, args, output) -> None:
        left = []
        for i in lazy:
            p = self.host.params[i]
            if nn.parameter.is_lazy(p):
                left.append(i)
            else:
                self.host.lazy_ready(i, p)
        lazy[:] = left
        if not left and self._lazy_handle is not None:
            self._lazy_handle.remove()
            self._lazy_handle = None

    # ------------------------------------------------------------------ modules and parameters reassigned
    def _registered(self, module, name, value):
        if id(module) in self._modules:
            self.changed = True
            if isinstance(value, nn.Module):
                self._modules.update(id(m) for m in value.modules())
        return None

    def before_step(self) -> None:
        """At the start of a step: follow reassigned parameters, and an optimizer whose parameters
        changed (``add_param_group``)."""
        if self.changed:
            self.changed = False
            self._follow_parameters()
        sig = self._signature(self.host.optimizer())
        if sig != self._opt_sig:
            self._opt_sig = sig
            self.host.optimizer_changed()

    @staticmethod
    def _signature(opt) -> tuple:
        """What changes when parameters are added to the optimizer (``add_param_group``, a group's
        list extended): read every step, so O(groups), not O(parameters)."""
        if opt is None:
            return ()
        return (id(opt.param_groups), len(opt.param_groups), *(len(g["params"]) for g in opt.param_groups))

    def _follow_parameters(self) -> None:
        host = self.host
        named = {_clean_compiled(n): p for n, p in host.model.named_parameters()}
        ours = set(host.names)
        rebound, reshaped, gone = [], [], []
        for i, name in enumerate(host.names):
            old, new = host.params[i], named.get(name)
            if new is None:
                gone.append(name)
                self._gone.append(i)
            elif new is not old:
                if nn.parameter.is_lazy(new) or new.shape != old.shape or new.dtype != old.dtype:
                    reshaped.append(name)
                    self._gone.append(i)
                else:
                    rebound.append((i, new))
        added = [n for n in named if n not in ours and n not in host.unrecorded]
        if rebound:
            host.rebind(rebound)
        if (added or reshaped or gone) and not self._told_change:
            self._told_change = True
            parts = [
                f"{what}: {_names_list(names)}"
                for what, names in (("new", added), ("reshaped", reshaped), ("removed", gone))
                if names
            ]
            warnings.warn(
                f"gradwidget: the {type(host.model).__name__} changed while training ({'; '.join(parts)}). "
                "The Recorder keeps the layers it started with (re-created ones of the same name and "
                "shape are followed); a reshaped or removed one records no gradient from now on and a "
                "new one is not recorded. Build a new Recorder (with a new log_dir) to record the model "
                "as it is now",
                GradwidgetWarning,
                stacklevel=4,
            )

    def mask_gone(self, values: np.ndarray, order: Sequence[int]) -> None:
        """No values for the columns (parameter indices ``order``) of parameters no longer in the
        model: the old tensor's last gradient and weight are not the layer's."""
        if self._gone:
            gone = set(self._gone)
            values[:, [c for c, i in enumerate(order) if i in gone]] = np.nan

    # ------------------------------------------------------------------ columns that start training
    def woken(self, values: np.ndarray, nonfinite_row: int, run, columns: Sequence[torch.Tensor]) -> list[int]:
        """The columns marked frozen in ``run`` that require and have a gradient now (unfrozen;
        ``columns``: the parameter of each column): the Recorder makes them trainable."""
        if self._frozen is None:  # the frozen columns, kept: this runs every step
            self._frozen = np.array([c for c, info in enumerate(run.layers) if info.status == "frozen"], np.intp)
        if not self._frozen.size:
            return []
        has = ~np.isnan(values[nonfinite_row, self._frozen])
        if not has.any():
            return []
        # a ``.grad`` left on a parameter frozen since (peft freezes a trained base without clearing
        # it) is read at every step too: unfrozen means it requires a gradient again
        woke = [c for c in self._frozen[has].tolist() if columns[c].requires_grad]
        if woke:
            self._frozen = np.setdiff1d(self._frozen, woke).astype(np.intp)
        return woke

    # ------------------------------------------------------------------ steps with nothing to record
    def no_gradient(self, step: int, check) -> None:
        """A step at which no recorded parameter had a gradient: said once (``check``: the
        Recorder's zero_grad check, or None)."""
        model = self.host.model
        if self._told_nograd or (check is not None and check.steps < 2):
            return  # the gradient check has not watched a whole step yet: said at the next one
        self._told_nograd = True
        if check is not None and check.cleared:  # this step's backward brought one: cleared before the step
            warnings.warn(
                f"gradwidget: step {step} of {type(model).__name__}: the gradients this step's backward "
                "brought were gone when optimizer.step() ran, so the optimizer moves no weight: is "
                "optimizer.zero_grad() called between loss.backward() and optimizer.step()?",
                GradwidgetWarning,
                stacklevel=5,
            )
            return
        warnings.warn(
            f"gradwidget: step {step} of {type(model).__name__}: none of its parameters has a gradient, "
            "so there is nothing to record. Is the loss computed from copies of them "
            "(torch.func.functional_call with copied parameters, a copy of the model)? The Recorder "
            "records the gradients of the model it was given",
            GradwidgetWarning,
            stacklevel=5,
        )

    # ------------------------------------------------------------------ a new optimizer
    def own_step(self) -> None:
        self._own_steps += 1

    def _any_step(self, optimizer, args, kwargs):
        host = self.host
        if optimizer is host.optimizer() or not host.attached():
            return None
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if not any(id(p) in held for p in host.params):
            return None  # another model's optimizer (a GAN's other half)
        if self.changed:  # a layer replaced with the optimizer: follow it first
            self.changed = False
            self._follow_parameters()
        current = {id(p) for p in host.model.parameters()}
        need = {id(p) for p in host.params if p.requires_grad and id(p) in current}
        again = self._candidate == (id(optimizer), self._own_steps)
        if need <= held or again:  # it replaces ours, or ours has stopped stepping
            self._candidate = None
            host.adopt_optimizer(optimizer)
            self._opt_sig = self._signature(optimizer)
        else:
            self._candidate = (id(optimizer), self._own_steps)
        return None
