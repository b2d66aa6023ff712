"""Trace where a NaN/Inf started: the first module, step and pass that made a non-finite value.

Forward: a pre-hook and a hook on every module reduce each floating input and output tensor to
one number on the device (its sum, accumulated in float32 or wider, which is NaN/Inf exactly
when the tensor holds a NaN/Inf, barring finite sums beyond 3e38) and keep the 0-d results in a
list: no host sync per module.
Backward: a tensor hook on each output sees the gradient the module *received*; each input that
requires grad is handed to the module as a view of itself (``x.view_as(x)``, the same tensor to
the module and to the caller), whose tensor hook sees the gradient this module alone *passed on*
(a hook on ``x`` would see the sum over all of x's consumers).

At each step the numbers are stacked into one tensor that rides in the Recorder's single host
copy of a recorded step (steps in between are kept on the device until then). On the host,
:func:`find_origin` walks the step's events in the order they happened: the first non-finite
one names the module call that made it (see its docstring). Once an origin is found the hooks
are removed, so a run that has gone NaN costs nothing more. ``trace_nonfinite=True`` runs it on every
step; ``"auto"`` runs it on a replay of the first non-finite step (``_replay``), and on every step only
where steps measured with and without its hooks show it free (``_trace_cost``).

What counts as non-finite: a NaN or +/-Inf in a floating tensor; an input or output that does not
require grad and whose only non-finite values are -Inf is taken for an attention mask (``-inf``
is how masks say "never") and counts as finite. A finite tensor whose entries add up beyond the
float32 range (entries of ~1e34 and more, of one sign) reads as Inf: that module is then named,
the first whose values left the range a float32 sum holds (a float64 sum would avoid it at 5x
the cost on CPU).

Limits: a module that changes its input in place and returns it (``nn.ReLU(inplace=True)``)
hands back the view it was given, whose earlier hook autograd drops: the gradient it passes on
is taken to be the one it receives (a NaN such a module made in the backward is put on the
module that encloses it). A forward run under ``torch.no_grad`` outside any traced call
(evaluation) is not traced. Modules run inside a ``torch.compile``'d graph are not traced (the
hooks compile to nothing, so the graph is not broken at every module): no origin is named then.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from ..run import NonfiniteOrigin
from ._hooks import Hook
from ._kernels import local_piece
from ._origin import IN, LOSS, OUT, PASS, RECV, StepTrace, find_origin

__all__ = ["NonfiniteTracer"]

#: nested outputs (tuples, dicts, Hugging Face ModelOutput) are searched this deep for tensors
_MAX_DEPTH = 4
#: stack the pending 0-d results into one tensor every this many events (bounds Python objects)
_CHUNK = 4096
#: tensors remembered (and held) during a forward so that the same one is not reduced twice
_SEEN = 8


def _tensors(x, depth: int = 0):
    """Floating tensors in ``x``: a tensor, or inside tuples, lists, dicts and dataclasses."""
    if isinstance(x, torch.Tensor):
        if x.is_floating_point() and x.numel():
            yield x
    elif depth < _MAX_DEPTH:
        if isinstance(x, dict):  # ModelOutput is an OrderedDict (with its dataclass fields as keys)
            x = x.values()
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, type):
            x = [getattr(x, f, None) for f in x.__dataclass_fields__]
        elif not isinstance(x, (tuple, list)):
            return
        for v in x:
            yield from _tensors(v, depth + 1)


def _call_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """``list(_tensors((args, kwargs)))`` without a generator per level for the common call, tensors
    passed positionally (this runs at every module call)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.is_floating_point() and a.numel():
                out.append(a)
        else:
            out.extend(_tensors(a, 2))
    if kwargs:
        out.extend(_tensors(kwargs, 1))
    return out


def _reduce(t: torch.Tensor) -> torch.Tensor:
    """One number on ``t``'s device that is non-finite iff ``t`` holds a NaN/Inf (one
    reduction kernel, no sync); a mask-like tensor's ``-inf`` (no grad, nothing else non-finite)
    maps to 0."""
    s = _sum(t.detach())
    if not t.requires_grad:
        s = torch.nan_to_num(s, nan=float("nan"), posinf=float("inf"), neginf=0.0)
    return s


def _sum(t: torch.Tensor) -> torch.Tensor:
    """The sum, accumulated in float32 or wider (a half sum overflows at 65504; asking float32 of a
    float32 tensor takes a path twice as slow as plain ``sum``). A DTensor (inside a tensor-parallel
    module) is summed over this rank's piece: each rank traces its own origin."""
    t = local_piece(t)
    return t.sum() if t.dtype in (torch.float32, torch.float64) else t.sum(dtype=torch.float32)


def _stack(vals: list[torch.Tensor], join=torch.stack) -> torch.Tensor:
    """One tensor of the values (``join``: stack 0-d values, or cat stacked parts), on the first
    one's device: a model split over devices reduces each tensor where it lives."""
    dev = vals[0].device
    if any(v.device != dev for v in vals):
        vals = [v.to(dev) for v in vals]
    return join(vals) if len(vals) > 1 or join is torch.stack else vals[0]


class NonfiniteTracer:
    """Hooks on every module of ``model`` that record, per step, whether each module call's
    inputs, outputs and gradients were finite (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        mods = list(model.named_modules())
        self.module_names = [n for n, _ in mods]
        self.module_types = [type(m).__name__ for _, m in mods]
        self._mods = [m for _, m in mods]
        self._handles: list = []
        self.hooks_on()
        self._reset()
        self.step_calls = 0  # the last ended step's module calls
        self.pending: list[StepTrace] = []  # ended steps not yet brought to the host
        self._queued: list = []  # (trace, host copy, handle) queued in a recorder's copy

    def _reset(self) -> None:
        self._vals: list[torch.Tensor] = []
        self._chunks: list[torch.Tensor] = []
        self._kinds: list[int] = []
        self._calls: list[int] = []
        self._call_module: list[int] = []
        self._call_parent: list[int] = []
        self._stack: list[int] = []  # open calls (-1: one not traced)
        self._pass_hooks: dict = {}  # open call -> {id(input view): its hook's handle}
        self._seen: dict = {}  # id(tensor) -> (tensor, version, value): no re-reduce
        self._last_grad: tuple | None = None  # (key, value, gradient) of the last gradient reduced

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def hooks_on(self) -> None:
        """Put the hooks on every module (again, after ``hooks_off``)."""
        if self._handles:
            return
        for i, m in enumerate(self._mods):
            self._handles.append(m.register_forward_pre_hook(Hook(functools.partial(self._pre, i)), with_kwargs=True))
            self._handles.append(m.register_forward_hook(Hook(functools.partial(self._post, i))))

    def hooks_off(self) -> None:
        """Take the hooks off, keeping the steps traced so far (``"auto"`` measures steps without them)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def remove(self) -> None:
        self.hooks_off()
        self._reset()
        self.pending, self._queued = [], []

    # ------------------------------------------------------------------ events
    def _event(self, call: int, kind: int, value: torch.Tensor) -> None:
        self._vals.append(value)
        self._kinds.append(kind)
        self._calls.append(call)
        if len(self._vals) >= _CHUNK:
            self._chunks.append(_stack(self._vals))
            self._vals = []

    def _value(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor's reduction, reused while the same tensor is unchanged (a module's output is
        the next one's input, and a container's input is its first child's)."""
        hit = self._seen.get(id(t))
        if hit is not None and hit[0] is t and hit[1] == t._version:
            return hit[2]
        v = _reduce(t)
        if len(self._seen) >= _SEEN:  # keep the few latest: an output is the next input
            del self._seen[next(iter(self._seen))]
        self._seen[id(t)] = (t, t._version, v)
        return v

    def _pre(self, idx: int, module, args, kwargs):
        if torch.compiler.is_compiling():
            return None  # torch.compile traces the hook as nothing: the compiled graph stays whole
        if not (torch.is_grad_enabled() or any(c >= 0 for c in self._stack)):
            self._stack.append(-1)  # evaluation: not a training step's forward
            return None
        call = len(self._call_module)
        self._call_module.append(idx)
        parent = -1
        for c in reversed(self._stack):  # the innermost traced call open
            if c >= 0:
                parent = c
                break
        self._call_parent.append(parent)
        self._stack.append(call)
        for t in _call_tensors(args, kwargs):
            self._event(call, IN, self._value(t))
        if not torch.is_grad_enabled():
            return None
        views: dict = {}

        def wrap(a):
            if not (isinstance(a, torch.Tensor) and a.requires_grad and a.is_floating_point()):
                return a
            v = views.get(id(a))
            if v is None:  # one view per tensor, so `query is key` still holds inside the module
                v = a.view_as(a)
                views[id(a)] = v
                self._pass_hooks.setdefault(call, {})[id(v)] = v.register_hook(
                    functools.partial(self._grad, call, PASS)
                )
                hit = self._seen.get(id(a))
                if hit is not None:
                    self._seen[id(v)] = (v, v._version, hit[2])
            return v

        new_args = tuple(wrap(a) for a in args)
        new_kwargs = {k: wrap(a) for k, a in kwargs.items()}
        return (new_args, new_kwargs) if views else None

    def _post(self, idx: int, module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        call = self._stack.pop() if self._stack else -1
        if call >= 0:
            passing = self._pass_hooks.pop(call, {})
            outs = _call_tensors((output,), {}) if isinstance(output, torch.Tensor) else _tensors(output)
            for t in outs:
                self._event(call, OUT, self._value(t))
                if t.requires_grad:
                    again = passing.pop(id(t), None)
                    if again is not None:  # it returns its input (identity, in place): the
                        again.remove()  # gradient it receives must be seen before the one it passes
                    t.register_hook(functools.partial(self._grad, call, RECV))
                    if again is not None:
                        t.register_hook(functools.partial(self._grad, call, PASS))
        if not self._stack:
            self._seen.clear()  # the outermost call returned: hold no activation past the forward

    def _grad(self, call: int, kind: int, g) -> None:
        if not (isinstance(g, torch.Tensor) and g.is_floating_point() and g.numel()):
            return
        # the gradient a module passed on is, along a chain, the very buffer the module before it
        # receives (and its container passes on): reduce it once. The last one is held so that
        # its memory cannot be reused under the same key.
        key = (g.device, g.data_ptr(), g.shape, g.stride(), g.dtype, g._version)
        last = self._last_grad
        if last is None or last[0] != key:
            if last is None:  # let go of the held gradient when this backward ends
                torch.autograd.Variable._execution_engine.queue_callback(self._end_backward)
            last = self._last_grad = (key, _sum(g.detach()), g)
        self._event(call, kind, last[1])

    def _end_backward(self) -> None:
        self._last_grad = None

    # ------------------------------------------------------------------ steps
    def end_step(self, step: int, loss=None, skipped: bool = False) -> None:
        """Close the events of step ``step`` (kept on the device until a host copy takes them).
        ``loss``: the loss logged for this step, a tensor (read with the rest) or a number;
        ``skipped``: the optimizer did not take the step."""
        self.step_calls = len(self._call_module)
        host_loss = None
        outside = isinstance(loss, torch.Tensor) and not loss.requires_grad
        if isinstance(loss, torch.Tensor):
            self._event(-1, LOSS, _sum(loss.detach()))
        elif loss is not None:
            host_loss = float(loss)
        if self._vals or self._chunks:
            parts = self._chunks + ([_stack(self._vals)] if self._vals else [])
            values = _stack(parts, torch.cat)
            self.pending.append(
                StepTrace(
                    step,
                    values,
                    np.array(self._kinds, np.int8),
                    np.array(self._calls, np.int64),
                    np.array(self._call_module, np.int64),
                    np.array(self._call_parent, np.int64),
                    host_loss,
                    skipped=skipped,
                    loss_outside_training=outside,
                )
            )
        elif host_loss is not None:
            self.pending.append(
                StepTrace(
                    step,
                    None,
                    np.zeros(0, np.int8),
                    np.zeros(0, np.int64),
                    np.zeros(0, np.int64),
                    np.zeros(0, np.int64),
                    host_loss,
                    skipped=skipped,
                    loss_outside_training=outside,
                )
            )
        self._reset()  # (calls left open by a forward that raised are dropped with the rest)

    def queue(self, pack) -> None:
        """Add the ended steps' values to a recorder's host copy (``collect._kernels.HostCopy``), read by ``take``."""
        for tr in self.pending:
            if tr.values is not None:
                self._queued.append((tr, pack, pack.add(tr.values)))

    def take(self) -> list[StepTrace]:
        """The ended steps with their values on the host: from the queued host copy (fetched by
        now), or (nothing queued, as on a sharded step) one copy of their own."""
        for tr, pack, handle in self._queued:
            tr.host = pack.get(handle)
        self._queued = []
        for tr in self.pending:
            if tr.host is None:
                tr.host = tr.values.double().cpu().numpy() if tr.values is not None else np.zeros(0)
        done, self.pending = self.pending, []
        return done

    def origin(self, traces: list[StepTrace], reached=None, module_of=None) -> NonfiniteOrigin | None:
        """The first origin in ``traces`` (steps in order). ``reached(step)``: the layers (parameter
        names) with non-finite gradients at that step, nearest the loss first, or None if unknown;
        ``module_of(layer)``: a layer's module path."""
        for tr in traces:
            o = find_origin(tr, self.module_names, self.module_types, reached(tr.step) if reached else None, module_of)
            if o is not None:
                return o
        return None
