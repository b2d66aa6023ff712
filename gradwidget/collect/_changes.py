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

Private to ``gradwidget.collect``; the state it changes is the Recorder's (``_state``).
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any

import numpy as np
from torch import nn

from .._warnings import GradwidgetWarning
from ._hooks import Hook
from ._inputs import _clean_compiled, _module_of
from ._stats import StepStatistics


def _weak(method) -> Hook:
    """A hook calling ``method`` while its object lives (a no-op after)."""
    ref = weakref.WeakMethod(method)

    def call(*args, **kwargs):
        f = ref()
        return None if f is None else f(*args, **kwargs)

    return Hook(call)


def _names_list(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


class ModelWatch:
    """Watches ``rec``'s model and optimizer for the changes above (composition: the Recorder owns
    one and calls it at each step; ``remove`` takes its hooks off)."""

    def __init__(self, rec: Any) -> None:  # the Recorder (typed loosely: no import cycle with it)
        self.rec = rec
        self.changed = False  # a module or parameter of the model was (re)assigned since the last look
        self._modules = {id(m) for m in rec.model.modules()}
        self._opt_sig = self._signature(rec.optimizer)
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
        if rec.optimizer is not None:
            self._handles.append(optim.register_optimizer_step_pre_hook(_weak(self._any_step)))
        self._lazy_handle: Any = None

    def remove(self) -> None:
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
        self._lazy_handle = self.rec.model.register_forward_hook(Hook(functools.partial(self._lazy_ready, lazy)))

    def _lazy_ready(self, lazy: list[int], module, args, output) -> None:
        rec = self.rec
        left = []
        for i in lazy:
            p = rec._params[i]
            if nn.parameter.is_lazy(p):
                left.append(i)
            elif rec._order is None:
                rec._hook_arrival(i, p)
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
        rec = self.rec
        if self.changed:
            self.changed = False
            self._follow_parameters()
        sig = self._signature(rec.optimizer)
        if sig != self._opt_sig:
            self._opt_sig = sig
            rec._plan_updates()

    @staticmethod
    def _signature(opt) -> tuple:
        """What changes when parameters are added to the optimizer (``add_param_group``, a group's
        list extended): read every step, so O(groups), not O(parameters)."""
        if opt is None:
            return ()
        return (id(opt.param_groups), len(opt.param_groups), *(len(g["params"]) for g in opt.param_groups))

    def _follow_parameters(self) -> None:
        rec = self.rec
        named = {_clean_compiled(n): p for n, p in rec.model.named_parameters()}
        ours = set(rec._names)
        tied = {n for names in rec._tied.values() for n in names}
        rebound, reshaped, gone = [], [], []
        for i, name in enumerate(rec._names):
            old, new = rec._params[i], named.get(name)
            if new is None:
                gone.append(name)
                self._gone.append(i)
            elif new is not old:
                if nn.parameter.is_lazy(new) or new.shape != old.shape or new.dtype != old.dtype:
                    reshaped.append(name)
                    self._gone.append(i)
                else:
                    rebound.append((i, new))
        added = [n for n in named if n not in ours and n not in tied and n not in rec.skipped]
        for i, new in rebound:
            del rec._pindex[id(rec._params[i])]
            rec._params[i] = new
            rec._pindex[id(new)] = i
            if rec.optimizer is None or rec._order is None:  # arrival hooks still needed
                rec._hook_arrival(i, new)
        if rebound and rec._order is not None:
            rec._stats = StepStatistics([rec._params[i] for i in rec._order])
            rec._plan_updates()
        if (added or reshaped or gone) and not self._told_change:
            self._told_change = True
            parts = [
                f"{what}: {_names_list(names)}"
                for what, names in (("new", added), ("reshaped", reshaped), ("removed", gone))
                if names
            ]
            warnings.warn(
                f"gradwidget: the {type(rec.model).__name__} changed while training ({'; '.join(parts)}). "
                "The Recorder keeps the layers it started with (re-created ones of the same name and "
                "shape are followed); a reshaped or removed one records no gradient from now on and a "
                "new one is not recorded. Build a new Recorder (with a new log_dir) to record the model "
                "as it is now",
                GradwidgetWarning,
                stacklevel=4,
            )

    def mask_gone(self, values: np.ndarray) -> None:
        """No values for the columns of parameters no longer in the model: the old tensor's last
        gradient and weight are not the layer's."""
        rec = self.rec
        if self._gone and rec._order is not None:
            cols = [c for c, i in enumerate(rec._order) if i in set(self._gone)]
            values[:, cols] = np.nan

    # ------------------------------------------------------------------ columns that start training
    def after_collect(self, values: np.ndarray, nonfinite_row: int) -> None:
        """A column marked frozen that requires and has a gradient now (unfrozen) becomes trainable."""
        rec = self.rec
        run = rec.run
        if run is None:
            return
        if self._frozen is None:  # the frozen columns, kept: this runs every step
            self._frozen = np.array([c for c, info in enumerate(run.layers) if info.status == "frozen"], np.intp)
        if not self._frozen.size:
            return
        has = ~np.isnan(values[nonfinite_row, self._frozen])
        if not has.any():
            return
        # a ``.grad`` left on a parameter frozen since (peft freezes a trained base without clearing
        # it) is read at every step too: unfrozen means it requires a gradient again
        woke = [c for c in self._frozen[has].tolist() if rec._stats.ordered[c].requires_grad]
        if not woke:
            return
        self._frozen = np.setdiff1d(self._frozen, woke).astype(np.intp)
        assert rec._order is not None
        nxt = 1 + max(info.backward_index for info in run.layers)
        for k, c in enumerate(woke):
            run.layers[c].status, run.layers[c].backward_index = "trainable", nxt + k
            rec._graph.wanted.add(_module_of(rec.model, rec._names[rec._order[c]])[0])
        rec._plan_updates()
        if rec._writer is not None:
            rec._writer.write_meta()

    # ------------------------------------------------------------------ steps with nothing to record
    def no_gradient(self, step: int) -> None:
        """A step at which no recorded parameter had a gradient: said once."""
        rec = self.rec
        check = rec._reset_check
        if self._told_nograd or (check is not None and check.steps < 2):
            return  # the gradient check has not watched a whole step yet: said at the next one
        self._told_nograd = True
        if check is not None and check.cleared:  # this step's backward brought one: cleared before the step
            warnings.warn(
                f"gradwidget: step {step} of {type(rec.model).__name__}: the gradients this step's backward "
                "brought were gone when optimizer.step() ran, so the optimizer moves no weight: is "
                "optimizer.zero_grad() called between loss.backward() and optimizer.step()?",
                GradwidgetWarning,
                stacklevel=5,
            )
            return
        warnings.warn(
            f"gradwidget: step {step} of {type(rec.model).__name__}: none of its parameters has a gradient, "
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
        rec = self.rec
        if optimizer is rec.optimizer or not rec.attached:
            return None
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        if not any(id(p) in held for p in rec._params):
            return None  # another model's optimizer (a GAN's other half)
        if self.changed:  # a layer replaced with the optimizer: follow it first
            self.changed = False
            self._follow_parameters()
        current = {id(p) for p in rec.model.parameters()}
        need = {id(p) for p in rec._params if p.requires_grad and id(p) in current}
        again = self._candidate == (id(optimizer), self._own_steps)
        if need <= held or again:  # it replaces ours, or ours has stopped stepping
            self._candidate = None
            rec._adopt_optimizer(optimizer)
            self._opt_sig = self._signature(optimizer)
        else:
            self._candidate = (id(optimizer), self._own_steps)
        return None
