"""Where the first NaN/Inf began, found by replaying the step that made it: finite steps pay for
one hook on the root module, not for hooks on every module call.

Every training forward of the model (autograd on) leaves behind what it was given: references to
its arguments (no copy: the caller holds them anyway), the random number generators' states and
the autocast settings it ran under; the gradients its outputs receive in the backward are kept by
reference too (up to ``KEEP_GRAD_BYTES`` a step: a model's big logits are not held on). When the
Recorder finds a recorded step's gradients non-finite, before the optimizer applies them, it asks
:meth:`StepReplay.origin`: the step's forwards are run again with a ``NonfiniteTracer`` on every
module (same weights, inputs, random numbers and autocast), then their backward from the kept
output gradients (``torch.autograd.grad`` to detached copies of the parameters, through
``torch.func.functional_call``: the parameters' ``.grad`` and their tensor hooks are left alone),
and the tracer names the first module call, pass and step that made a non-finite value, exactly as
with ``trace_nonfinite=True``. Once an origin is found the hooks are removed.

A replay must not change training, so it runs only code whose effects it puts back: afterwards
every module's buffers (BatchNorm's running statistics), its other attributes (a Python counter, a
recurrent layer's carried hidden state, a list a forward appends to: rebound, tensors changed in
place copied back, containers refilled), the inputs (the replay reads copies) and the random
generators (torch's, CUDA's, Python's and numpy's) are as they were. Hooks of the user's on any
module (forward or backward, or the global ones of ``torch.nn.modules.module``) are code whose
effects it cannot know: with one present it does not replay (``_user_code``). What it cannot
see is code in the forward that writes outside the model (a global, a closure's list): a model
that does so should be traced with ``trace_nonfinite=True`` (no replay).

What it does not replay, and says so (``run.meta["nonfinite_tracing"]``): a step whose weights
were already non-finite (the NaN began at a step not recorded, with ``every`` > 1), a model with
hooks of the user's, a backward whose output gradients were too big to keep (the forward is still
replayed), and a model called only through its submodules or compiled by ``torch.compile`` (no
root forward runs outside the compiled graph).
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules import module as _module

from ..run import NonfiniteOrigin
from ._hooks import Hook
from .nonfinite import NonfiniteTracer, _tensors

#: bytes of output gradients kept per step for a replay of the backward (beyond them the backward
#: is not replayed: a language model's logits gradient can be gigabytes; a model that computes its
#: own loss, as Hugging Face models given labels do, needs only the loss's 0-d gradient)
KEEP_GRAD_BYTES = 64 << 20
#: forwards kept per step (gradient accumulation); later ones are not replayed
MAX_CALLS = 64
#: replays of steps the optimizer takes that found no origin, before it gives up
MAX_MISSES = 2
#: autograd nodes walked at most to tell which outputs the others are computed from
_MAX_WALK = 500_000


@dataclass
class ForwardCall:
    """What one training forward was given, and the gradients its outputs received."""

    args: tuple
    kwargs: dict
    cpu_rng: torch.Tensor
    device_rng: dict
    autocast: list
    grads: dict = field(default_factory=dict)  #: output position -> the gradient it received
    too_big: bool = False  #: an output gradient was not kept (over ``KEEP_GRAD_BYTES``)
    done: bool = False  #: the forward returned (one that raised is not replayed)


class StepReplay:
    """The root-module hooks that keep each training forward's inputs, and the replay of a step
    whose gradients went non-finite (see the module docstring). ``remove()`` takes the hooks off."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[ForwardCall] = []
        self._kept = 0  # output-gradient bytes kept this step
        self._replaying = False
        self.misses = 0
        self.failed = False  # a replay raised, or had nothing to run: no more are tried
        devs = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
        self._rng_devices = sorted((d for d in devs if d.type == "cuda"), key=str)
        self._autocast_types = sorted({"cpu"} | {d.type for d in devs if d.type in ("cuda", "xpu", "mps")})
        self._open: list[ForwardCall | None] = []  # the root's calls under way (recursion-safe)
        self._handles = [
            model.register_forward_pre_hook(Hook(self._pre), with_kwargs=True),
            model.register_forward_hook(Hook(self._post)),
        ]

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.clear()

    def clear(self) -> None:
        """Forget the forwards of the step that ended (called at every step's end)."""
        self.calls, self._kept, self._open = [], 0, []

    # ------------------------------------------------------------------ capture (every step)
    def _pre(self, module, args, kwargs) -> None:
        keep = (
            not self._replaying
            and torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and len(self.calls) < MAX_CALLS
        )
        call = None
        if keep:
            call = ForwardCall(
                _cut(args),
                _cut(dict(kwargs)),
                torch.get_rng_state(),
                {d: torch.cuda.get_rng_state(d) for d in self._rng_devices},
                [(t, torch.is_autocast_enabled(t), torch.get_autocast_dtype(t)) for t in self._autocast_types],
            )
            self.calls.append(call)
        self._open.append(call)

    def _post(self, module, args, output) -> None:
        call = self._open.pop() if self._open else None
        if call is None:
            return
        call.done = True
        for k, t in enumerate(_tensors(output)):
            if t.requires_grad:
                t.register_hook(functools.partial(self._keep_grad, call, k))

    def _keep_grad(self, call: ForwardCall, k: int, g) -> None:
        if not isinstance(g, torch.Tensor):
            return
        size = g.numel() * g.element_size()
        if self._kept + size > KEEP_GRAD_BYTES:
            call.too_big = True
            return
        self._kept += size
        call.grads[k] = g

    # ------------------------------------------------------------------ the replay (a non-finite step)
    def origin(
        self, step: int, loss=None, skipped: bool = False, reached=None, module_of=None
    ) -> tuple[NonfiniteOrigin | None, str | None]:
        """Replay this step's forwards (and, unless the optimizer ``skipped`` the step, their
        backward) under a tracer: ``(origin, None)``, or ``(None, why not)``. ``loss``: the logged
        loss; ``reached``/``module_of``: as ``NonfiniteTracer.origin``."""
        calls = [c for c in self.calls if c.done]
        self.clear()
        if not calls:
            self.failed = True  # nothing to replay now will be nothing later: said once
            return None, (
                "the model's own forward never ran to replay (its submodules were called directly, "
                "or it runs under torch.compile)"
            )
        user = _user_code(self.model)
        if user is not None:
            self.failed = True
            return None, (
                f"not replayed: {user} would run again, with effects a replay cannot undo "
                "(trace_nonfinite=True traces every step instead)"
            )
        tracer = NonfiniteTracer(self.model)
        self._replaying = True
        try:
            with _state_restored(self.model, self._rng_devices):
                for call in calls:  # one step's events in the order they happened, as True traces them
                    self._run(call, tracer, backward=not skipped)
                tracer.end_step(step, loss, skipped=skipped)
                traces = tracer.take()
        except Exception as e:  # noqa: BLE001 - looking for an origin must never stop the training
            self.failed = True
            return None, f"the replay of step {step} failed ({type(e).__name__}: {str(e)[:200]})"
        finally:
            self._replaying = False
            tracer.remove()
        origin = tracer.origin(traces, (lambda s: reached) if reached else None, module_of)
        if origin is None:
            return None, "the replayed step stayed finite (the model's forward depends on more than its inputs)"
        seen = origin.inputs_finite is False or origin.output_finite is False  # not only inferred from gradients
        if not seen and any(c.too_big for c in calls):
            return origin, "the backward was not replayed: its output gradient was not kept"
        return origin, None

    def _run(self, call: ForwardCall, tracer: NonfiniteTracer, backward: bool) -> None:
        torch.set_rng_state(call.cpu_rng)
        for d, s in call.device_rng.items():
            torch.cuda.set_rng_state(s, d)
        args, kwargs = _copied((call.args, call.kwargs))  # a forward that writes its inputs writes copies
        # detached copies of the parameters (tied ones stay tied): the replay's backward reaches
        # them, never the parameters' own gradients and tensor hooks
        params = {n: p.detach().requires_grad_(p.requires_grad) for n, p in self.model.named_parameters()}
        with contextlib.ExitStack() as stack:
            for dev, on, dtype in call.autocast:
                stack.enter_context(torch.autocast(dev, dtype=dtype, enabled=on))
            stack.enter_context(torch.enable_grad())
            out = torch.func.functional_call(self.model, params, args, kwargs, strict=False)
        if not backward or not call.grads:
            return
        outs = list(_tensors(out))
        roots = [(outs[k], g) for k, g in call.grads.items() if k < len(outs) and outs[k].grad_fn is not None]
        roots = _outermost(roots)
        # every path the training's backward took: to the parameters, and back out through the
        # model's inputs that carry a gradient to code before it
        ends = [p for p in params.values() if p.requires_grad]
        ends += [t for t in _tensors((args, kwargs)) if t.requires_grad]
        if roots and ends:
            torch.autograd.grad(
                [t for t, _ in roots], ends, [g for _, g in roots], allow_unused=True, materialize_grads=False
            )


def _map_tensors(x, leaf: Callable[[torch.Tensor], torch.Tensor], levels: int, depth: int = 0):
    """``x`` with ``leaf`` applied to every tensor, tuples, lists and dicts rebuilt ``levels`` deep."""
    if isinstance(x, torch.Tensor):
        return leaf(x)
    if depth >= levels:
        return x
    if type(x) in (tuple, list):
        return type(x)(_map_tensors(v, leaf, levels, depth + 1) for v in x)
    if type(x) is dict:
        return {k: _map_tensors(v, leaf, levels, depth + 1) for k, v in x.items()}
    return x


def _cut(x):
    """``x`` with every tensor that has a graph behind it (made by code before the model, say a
    frozen encoder called apart) replaced by a detached copy that requires grad: the replay's
    backward stops at the model's inputs, as the tracer's events do, and never walks into a graph
    that the training's backward has freed. Containers are rebuilt, a few levels deep."""
    return _map_tensors(
        x, lambda t: t.detach().requires_grad_(t.requires_grad) if t.grad_fn is not None else t, levels=3
    )


def _outermost(roots: list[tuple[torch.Tensor, Any]]) -> list[tuple[torch.Tensor, Any]]:
    """The outputs no other kept output is computed from: a model that returns its loss and its
    logits has the loss's gradient flow into the logits already, so the logits' kept gradient (which
    is that flow) must not be sent back a second time."""
    if len(roots) < 2:
        return roots
    inner: set = set()
    for t, _ in roots:
        seen: set = set()
        queue = deque([t.grad_fn])
        while queue and len(seen) < _MAX_WALK:
            node = queue.popleft()
            for nxt, _ in getattr(node, "next_functions", ()):
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    queue.append(nxt)
        inner |= {id(u.grad_fn) for u, _ in roots if u is not t and u.grad_fn in seen}
    return [(t, g) for t, g in roots if id(t.grad_fn) not in inner]


def _copied(x):
    """``x`` with every tensor replaced by a copy (requiring grad as it did); containers rebuilt,
    a few levels deep, as ``_cut`` does."""
    return _map_tensors(
        x,
        lambda t: t.detach().clone().requires_grad_(t.requires_grad) if t.is_floating_point() else t.clone(),
        levels=4,
    )


#: the hook dicts of a module whose hooks a replay would run, and the global ones
_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


def _user_code(model: nn.Module) -> str | None:
    """What a replay would run of the user's code beyond the modules' own forwards: a hook that is
    not gradwidget's (``_hooks.Hook``) on a module of ``model``, or a global module hook; None
    when there is none."""
    for name in _GLOBAL_HOOKS:
        if any(not isinstance(h, Hook) for h in getattr(_module, name, {}).values()):
            return f"a global module hook ({name.strip('_').replace('_', ' ')[7:]})"
    for path, m in model.named_modules():
        for name in _MODULE_HOOKS:
            if any(not isinstance(h, Hook) for h in getattr(m, name, {}).values()):
                kind = name.strip("_").replace("_", " ")[:-1]
                return f"a {kind} of the user's on {path or 'the model'} ({type(m).__name__})"
    return None


#: a bare module's own attributes (its parameters, buffers, submodules, hooks, training flag):
#: what is not among them is a module's state of its own
_MODULE_KEYS = frozenset(vars(nn.Module()))


@contextlib.contextmanager
def _state_restored(model: nn.Module, rng_devices: list):
    """Everything a replayed forward can change in the model, and the random generators, as they
    were before the replay, afterwards: training goes on as if it never ran. The buffers
    (BatchNorm's running statistics) are copied back; every module's other attributes (a counter,
    a carried hidden state, a cache) rebound to what they were, those added removed, a tensor
    changed in place copied back, a list, dict or set refilled."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    modules = []
    for m in model.modules():
        own = {k: v for k, v in vars(m).items() if k not in _MODULE_KEYS}
        inner: list[tuple[Any, int | None, Any]] = []
        for v in own.values():
            if isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
                inner.append((v, v._version, v.detach().clone()))
            elif type(v) in (list, dict, set):
                inner.append((v, None, type(v)(v)))
        modules.append((m, own, inner))
    cpu = torch.get_rng_state()
    dev = {d: torch.cuda.get_rng_state(d) for d in rng_devices}
    py, npy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
            for m, own, inner in modules:
                for k in [k for k in vars(m) if k not in _MODULE_KEYS and k not in own]:
                    del m.__dict__[k]
                m.__dict__.update(own)
                for v, version, saved in inner:
                    if isinstance(v, list):
                        v[:] = saved
                    elif version is None:  # a dict or a set
                        v.clear()
                        v.update(saved)
                    elif v._version != version:
                        v.copy_(saved)
        torch.set_rng_state(cpu)
        for d, s in dev.items():
            torch.cuda.set_rng_state(s, d)
        random.setstate(py)
        np.random.set_state(npy)
