"""Record real PyTorch training into a Run, with hooks and fused per-step statistics.

A *step* is an optimizer step (gradients as the optimizer sees them: after accumulation and AMP
unscaling, via an optimizer step pre-hook) or, without an optimizer, one completed backward pass.
A step ``GradScaler`` skips (Inf/NaN found, so ``optimizer.step()`` never runs) is recorded at the
next ``optimizer.zero_grad()``.

Statistics are computed with fused ``torch._foreach_norm`` calls grouped by device and dtype (as
``torch.nn.utils.clip_grad_norm_`` does), accumulated in float32 or wider whatever the parameter
dtype (``acc_dtype``); complex, integer and meta-device parameters are skipped with one warning. Per recorded step, the weight norms, the gradient
statistics, the histogram's exponent counts (on histogram steps) and a tensor loss of a device are
packed into one float64 tensor and copied to the host once; the update norms, known only after
``optimizer.step()``, are a second copy on the steps that measure them. No ``.item()`` per
parameter (a tensor holding NaN/Inf costs one more read, to count them). Layer order and data-flow
edges come from the real autograd graph, captured on the first forward (again for a layer first
used later).
"""
from __future__ import annotations

import functools
import math
import operator
import warnings
import weakref
from collections import defaultdict
from typing import Callable

import numpy as np
import torch
from torch import nn

from .._warnings import GradwidgetWarning
from ..run import METRICS, N_BINS, LayerInfo, NonfiniteOrigin, Run, _as_step
from ..storage import check_log_dir
from ..thresholds import as_thresholds
from ._groups import Plan, UpdateSnapshot, detached, grad_of
from ._kernels import (HostCopy, exponent_counts, grad_rows, norms, octave_bins, stacked, stacked_exponent_counts,
                       stacked_norms, stacked_rows, stored_values)
from .nonfinite import NonfiniteTracer

_M = {name: i for i, name in enumerate(METRICS)}
_GRAD = operator.attrgetter("grad")
_MAX_GRAPH_VISITS = 200_000
#: forwards captured again, at most, to find the edges of layers first used after the first step
_LATE_CAPTURES = 16


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


def _count_arg(name: str, value, minimum: int, also: str = "") -> int:
    """An int option, checked up front so a bad value fails here, not inside a training hook
    (a bool is an int to Python, but never what was meant)."""
    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {also}{kind}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {also}{kind}, got {value!r}")
    return int(value)


def _bytes_arg(name: str, value) -> int:
    """A positive size in bytes (an int, or a whole float such as 1e9)."""
    ok = (isinstance(value, (int, np.integer, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value == int(value))
    if not ok:
        raise TypeError(f"{name} must be a number of bytes (an int, e.g. 512 << 20 for 512 MiB), "
                        f"got {type(value).__name__} {value!r}")
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
        warnings.warn(f"gradwidget: {len(skipped)} parameter(s) cannot be recorded and are left out: "
                      f"{_skipped_text(skipped)}", GradwidgetWarning, stacklevel=3)
    return keep, skipped


def _check_number(name: str, value):
    """A loss or learning rate given to ``Recorder.log``: a real number, or a real tensor read at
    record time; anything else fails here, not later inside backward or the optimizer step."""
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a real number or a real tensor, got a {value.dtype} tensor")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number (or a torch tensor), got {type(value).__name__} {value!r:.40}")
    return float(value)


#: model -> weak reference to the Recorder attached to it; weak both ways, so neither is kept alive
_ATTACHED: "weakref.WeakKeyDictionary[nn.Module, weakref.ref]" = weakref.WeakKeyDictionary()


def _replace_attached(model: nn.Module, new: "Recorder") -> None:
    """Detach the Recorder still attached to ``model`` (re-running a notebook cell that builds a
    Recorder or GradientPanel would otherwise stack recorders that all keep recording)."""
    ref = _ATTACHED.get(model)
    old = ref() if ref is not None else None
    if old is not None and old is not new and old.attached:
        old.detach()
        n = old.run.n_steps if old.run is not None else 0
        warnings.warn(f"gradwidget: a previous Recorder on this {type(model).__name__} was detached; "
                      f"its run keeps the {n} steps it recorded", GradwidgetWarning, stacklevel=3)
    _ATTACHED[model] = weakref.ref(new)


class Recorder:
    """Hooks a model (and optionally its optimizer) and records per-layer gradient statistics.

    Parameters
    ----------
    model: the ``nn.Module`` being trained.
    optimizer: its optimizer; a step is then one ``optimizer.step()`` and update norms are recorded.
    every: record one step in ``every``.
    histogram_every: also record a log10|g| histogram every this many recorded steps (0: never).
    max_steps: keep at most this many steps in memory (older ones fold into ``run.history``);
        ``"auto"`` (default) sizes the window to ``memory_budget`` bytes, None keeps everything.
    memory_budget: bytes the in-memory Run may use with ``max_steps="auto"`` (default 256 MiB);
        a ``log_dir`` on disk always keeps every step. ``repr(recorder)`` (``window_text()``) says
        how many steps that keeps, and a warning says once when older steps start to fold.
    thresholds: a ``Thresholds`` or dict of overrides for the vanishing/exploding flags.
    log_dir: a run directory written as training goes (readable by ``load_run`` at any time).
    track_updates: record ``update_norm`` (keeps one copy of the trainable parameters).
    update_every: measure the update norm every this many recorded steps (NaN in between): taking
        it costs a copy of the parameters, ~2.5% of a step for a small transformer on CPU.
    trace_nonfinite: find where the first NaN/Inf was made (module, step, forward/backward/loss)
        into ``run.nonfinite_origin``; hooks on every module, removed once it is found
        (``gradwidget.collect.nonfinite``; its cost is measured in bench/nonfinite.py).

    One Recorder per model: building another on the same model detaches this one (with a warning),
    as re-running a notebook cell does. With an optimizer, ``optimizer.zero_grad`` is wrapped on the
    instance (restored by ``detach``) so steps AMP's GradScaler skips are still recorded.

    Under ``torch.distributed`` (a default process group is initialised), build the Recorder on
    every rank, after wrapping the model (DDP, ``fully_shard``, FSDP1 ``use_orig_params=True``):
    DDP's averaged gradients are recorded on rank 0; FSDP shards are combined on rank 0 with one
    gather per recorded step. Only rank 0 writes ``log_dir`` and holds ``run`` (None elsewhere).
    See ``gradwidget.collect.distributed``.

    ``step_hooks=False`` leaves ``optimizer.step()``'s pre-hook (and ``zero_grad``) alone: the caller
    marks each step with ``record_step()`` (the trainer callbacks of ``gradwidget.integrations``).
    A ``torch.compile``d model records as the module it compiles (names without ``_orig_mod.``;
    no hook runs inside the compiled graph, so the backward-graph edges are not captured).
    """

    def __init__(self, model, optimizer=None, *, every: int = 1, histogram_every: int = 10,
                 max_steps: int | str | None = "auto", memory_budget: int = 256 << 20, thresholds=None,
                 log_dir=None, overwrite: bool = False,
                 track_updates: bool = True, update_every: int = 10, foreach_all: bool = False,
                 trace_nonfinite: bool = True, step_hooks: bool = True) -> None:
        model, optimizer = _unwrapped(model), _unwrapped_optimizer(optimizer)
        if not isinstance(model, nn.Module):
            raise TypeError(f"Recorder needs a torch.nn.Module, got {type(model).__name__}; "
                            "for other frameworks use gradwidget.ArrayRecorder")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        every, update_every = _count_arg("every", every, 1), _count_arg("update_every", update_every, 1)
        histogram_every = _count_arg("histogram_every", histogram_every, 0)
        if not (max_steps is None or max_steps == "auto"):
            max_steps = _count_arg("max_steps", max_steps, 1, "'auto', None or ")
        memory_budget = _bytes_arg("memory_budget", memory_budget)
        if not isinstance(trace_nonfinite, bool):
            raise TypeError(f"trace_nonfinite must be True or False, got {type(trace_nonfinite).__name__} "
                            f"{trace_nonfinite!r}")
        #: how the model is distributed (None in a single process: no distributed code runs)
        self._dist = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from .distributed import attach

            self._dist = attach(model, optimizer)
            model = self._dist.model  # DDP unwrapped, so names match the single-process model
        self.model, self.optimizer = model, optimizer
        self.every, self.histogram_every = every, histogram_every
        self.max_steps, self.thresholds = max_steps, as_thresholds(thresholds)
        self.memory_budget = memory_budget
        if log_dir is not None and (self._dist is None or self._dist.is_writer):
            check_log_dir(log_dir, overwrite)  # refuse now, not inside the first optimizer.step()
        self.log_dir, self._overwrite = log_dir, overwrite
        self.track_updates = track_updates and optimizer is not None
        self.update_every = update_every
        self.foreach_all = foreach_all  # use _foreach_norm for every statistic (the CUDA path) on CPU too

        all_named = list(model.named_parameters())
        if not all_named:
            raise ValueError(f"{type(model).__name__} has no parameters to record")
        named, self.skipped = _recordable(all_named)
        if not named:
            raise ValueError(f"no parameter of {type(model).__name__} can be recorded: "
                             f"{_skipped_text(self.skipped)}")
        if not any(p.requires_grad for _, p in named):
            raise ValueError(f"every parameter of {type(model).__name__} is frozen (requires_grad=False), "
                             "so there is no gradient to record: unfreeze the layers you train before "
                             "building the Recorder")
        self._names = [_clean_compiled(n) for n, _ in named]
        self._params = [p for _, p in named]
        self._tied = _tied_names(model, self._params)
        self._pindex = {id(p): i for i, p in enumerate(self._params)}
        if optimizer is not None:
            opt_params = [p for g in optimizer.param_groups for p in g["params"]]
            model_ids = {id(p) for _, p in all_named}
            foreign = [p for p in opt_params if id(p) not in model_ids]
            if foreign:
                raise ValueError(
                    f"the optimizer holds {len(foreign)} parameter tensor(s) (of {len(opt_params)}) that "
                    f"are not parameters of this {type(model).__name__}: pass the optimizer built from "
                    "model.parameters()")

        _replace_attached(model, self)
        self.run: Run | None = None
        self.on_step: list[Callable[[Run], None]] = []
        self._handles: list = []
        self._arrival: list[int] = []        # parameter indices in gradient arrival order
        self._arrival_set: set[int] = set()
        self._grad_handles: list = []
        self._in_backward = False
        self._count = 0                      # steps seen (recorded or not)
        self._recorded = 0
        self._pending: dict = {}
        self._order: list[int] | None = None  # column -> parameter index
        self._writer = None
        self._edges_mod: set[tuple[str, str]] | None = None
        self._update_bufs = None
        self._attached = True
        self._fwd_modules: list[str] = []     # parameter-owning modules in first-forward order
        self._graph_handles: list = []
        self._capturing = False
        self._edge_wanted: set[str] = set()   # modules of late layers whose edges are still unknown
        self._late_captures = 0
        self._unused_cols: list[int] = []
        self._tracer: NonfiniteTracer | None = None
        self._exchange = None  # distributed: where the ranks' non-finite origins meet
        if self._dist is not None and trace_nonfinite:
            self._exchange = self._dist.origin_exchange()
        if self._dist is not None and self._dist.inert:
            # replicated gradients (DDP): rank 0 records them; the other ranks only trace their own
            # NaN origin (an optimizer step hook ends each step), unless trace_nonfinite=False
            if trace_nonfinite and optimizer is not None:
                self._tracer = NonfiniteTracer(model)
                self._handles.append(optimizer.register_step_pre_hook(self._inert_step))
            return

        for i, p in enumerate(self._params):
            if p.requires_grad:
                self._grad_handles.append(p.register_post_accumulate_grad_hook(self._make_grad_hook(i)))
        if optimizer is not None:
            if step_hooks:
                self._handles.append(optimizer.register_step_pre_hook(self._pre_step))
            self._handles.append(optimizer.register_step_post_hook(self._post_step))
            if step_hooks and (self._dist is None or not self._dist.sharded):
                self._wrap_zero_grad()
        self._install_graph_capture()
        if trace_nonfinite:
            self._tracer = NonfiniteTracer(model)

    # ------------------------------------------------------------------ public
    def log(self, loss=None, lr=None, step: int | None = None, global_norm=None) -> None:
        """Attach the loss (a tensor is fine: it is read once, at record time), a learning rate, or
        your own step number to the next recorded step. ``global_norm``: the global gradient norm a
        trainer computed before clipping it (kept instead of the norm of the clipped gradients, so
        the explosion clipping hid stays visible)."""
        if global_norm is not None:
            self._pending["global_norm"] = _check_number("global_norm", global_norm)
        if loss is not None:
            self._pending["loss"] = _check_number("loss", loss)
        if lr is not None:
            self._pending["lr"] = _check_number("lr", lr)
        if step is not None:
            self._pending["step"] = _as_step(step)

    def detach(self) -> None:
        """Remove every hook this recorder installed and close its run directory (recording first
        a last backward no optimizer step consumed)."""
        if self._attached and self.optimizer is not None and self._zero_grad_wrapper is not None:
            self._record_unstepped()
        if self._attached and self._dist is None:
            self._finish_unstepped()
        for h in self._handles + self._grad_handles + self._graph_handles:
            h.remove()
        self._handles, self._grad_handles, self._graph_handles = [], [], []
        if self._exchange is not None and self.run is not None:
            self._trace_origin(None)  # take what other ranks posted since the last recorded step
        if self._tracer is not None:
            self._tracer.remove()
            self._tracer = None
        self._unwrap_zero_grad()
        self._update_bufs = None
        if self._writer is not None:
            self._writer.close()
        self._attached = False

    close = detach

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._stepped = True  # training failed: its last gradients are no skipped step to record
        self.detach()

    def record_step(self) -> None:
        """Record the gradients as they are now as one optimizer step, for a Recorder built with
        ``step_hooks=False``: a trainer that says when it is about to step (the callbacks in
        ``gradwidget.integrations``) marks the step, not ``optimizer.step()`` (Lightning runs the
        backward inside ``optimizer.step(closure)``, after its pre-hooks). The update norm is still
        measured by the optimizer's post-hook."""
        self._finish_unstepped()
        self._pre_step(self.optimizer, (), {})
        self._in_step = False

    def _finish_unstepped(self) -> None:
        """Finish (write, tell on_step) a step ``record_step`` recorded whose ``optimizer.step()``
        never ran (AMP skipped it, or training stopped): no update norm, none measured."""
        if self._snap_taken:
            self._snap_taken = False
            self._finish_step()

    @property
    def attached(self) -> bool:
        return self._attached

    def __repr__(self) -> str:
        state = "attached" if self._attached else "detached"
        return f"<Recorder {type(self.model).__name__} {state}, {self.window_text()}, {self.run!r}>"

    def window_text(self) -> str:
        """How many steps the in-memory run keeps, and what decided it, in words."""
        if self.max_steps is None:
            return "keeping every step in memory (max_steps=None)"
        n = self._window(len(self._names))
        why = (f"max_steps='auto': a {self.memory_budget / 2 ** 20:,.0f} MiB memory_budget"
               if self.max_steps == "auto" else f"max_steps={self.max_steps}")
        return f"keeping the last {n:,} steps in memory ({why})"

    def _warn_window(self) -> None:
        """Say once, when the window of ``max_steps="auto"`` (which the user never chose) starts to
        fold steps into the coarser ``run.history``, how to keep more."""
        if self._window_told or self.max_steps != "auto" or self.run is None or self.run.history is None:
            return
        self._window_told = True
        disk = f"; every step is still written to {self.log_dir}" if self._writer is not None else ""
        warnings.warn(f"gradwidget: {self.window_text()}; older steps are now folded into run.history at a "
                      f"coarser resolution{disk}. Keep more with Recorder(..., memory_budget=<bytes>) or "
                      "max_steps=None (every step; memory grows with the run)", GradwidgetWarning, stacklevel=2)

    _window_told = False

    # ------------------------------------------------------------------ hooks
    def _make_grad_hook(self, i: int):
        def hook(p):
            if self._order is None and i not in self._arrival_set:
                self._arrival.append(i)
                self._arrival_set.add(i)
            if self.optimizer is None and not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        return hook

    def _end_of_backward(self) -> None:
        if self._dist is not None and not self._requeued:
            # DDP (and FSDP) queue their own end-of-backward callback, which finishes the gradient
            # reduction, after ours: run once more behind it, so the reduced gradients are read
            self._requeued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            return
        self._requeued = False
        self._in_backward = False
        self._on_step()

    _requeued = False
    _dist_step = None

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self._stepped = self._in_step = True
        self._on_step(before_update=True)

    # ------------------------------------------------------------------ steps the optimizer skipped
    _stepped = True  # an optimizer step ran since the last zero_grad (or none ran yet)
    _in_step = False  # inside optimizer.step(), whose closure (LBFGS) may call zero_grad
    _zero_mark: tuple = ()
    _zero_grad_wrapper = None

    def _wrap_zero_grad(self) -> None:
        """Wrap ``optimizer.zero_grad`` on the instance: AMP's GradScaler skips ``optimizer.step()``
        when it finds Inf/NaN, so the step hooks never see that step; the zero_grad that follows
        records it. Several backwards per step (accumulation) stay one step: only zero_grad flushes."""
        opt = self.optimizer
        original = opt.zero_grad
        self._own_zero_grad = opt.__dict__.get("zero_grad")  # an instance attribute to restore

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            if self._in_step or not self._attached:  # a closure's backwards belong to the step under
                return original(*args, **kwargs)   # way; a detached recorder still wrapped records nothing
            self._record_unstepped()
            out = original(*args, **kwargs)
            self._stepped, self._zero_mark = False, self._grad_mark()
            return out

        opt.zero_grad = zero_grad
        self._zero_grad_wrapper = zero_grad

    def _unwrap_zero_grad(self) -> None:
        opt = self.optimizer
        wrapper = self._zero_grad_wrapper
        if opt is None or wrapper is None or opt.__dict__.get("zero_grad") is not wrapper:
            return  # never wrapped, or wrapped again by someone else since: leave theirs in place
        if self._own_zero_grad is None:
            del opt.zero_grad
        else:
            opt.zero_grad = self._own_zero_grad
        self._zero_grad_wrapper = None

    def _grad_mark(self) -> tuple:
        """Which gradient tensors exist and their in-place version counters: backward changes it
        (new tensors, or accumulation into zeroed ones), a second zero_grad does not. Taken at
        every zero_grad, so kept to one pass of C-level iteration over the parameters."""
        grads = list(map(_GRAD, self._params))
        return tuple(map(id, grads)), tuple(g._version for g in grads if g is not None)

    def _record_unstepped(self) -> None:
        """Record the gradients of a backward that no optimizer step consumed (a skipped AMP step)."""
        if not self._stepped and self._grad_mark() != self._zero_mark:
            self._stepped = True
            self._on_step()

    def _post_step(self, optimizer, args, kwargs) -> None:
        self._in_step = False
        if self._update_bufs is None or not self._snap_taken:
            return
        self._snap_taken = False
        if self._dist is not None and self._dist.sharded:
            self._dist.local_update_sumsq(self._update_bufs, self._update_cols, self._dist_step["partials"])
            self._end_sharded_step()
            return
        snap = self._update_bufs
        pack = HostCopy()
        with torch.no_grad():
            parts = snap.norms(pack)
        if parts:
            pack.fetch()
            for pos, at in parts:
                v = pack.get(at)
                v[~snap.has_grad[pos]] = np.nan  # not updated by the step: no norm, not a false 0
                self.run._M3[-1, _M["update_norm"], self._update_cols[pos]] = v
        self._finish_step()

    def _snapshot_updates(self) -> None:
        """Copy the parameters this step will update: those the optimizer holds that have a gradient
        now (optimizers skip grad=None); every other column keeps a NaN update norm, not a false 0."""
        with torch.no_grad():
            self._update_bufs.take()

    _snap_taken = False

    # ------------------------------------------------------------------ the step
    def _on_step(self, before_update: bool = False) -> None:
        if self._capturing and (self._mod_in or self._mod_out):  # else (LBFGS's first step() runs
            self._finish_capture()                               # before its closure) keep watching
        self._capture_late_edges()
        step_no = self._count
        self._count += 1
        if self._tracer is not None:
            # with an optimizer, a step not read at its step pre-hook is one it skipped (AMP)
            self._tracer.end_step(self._pending.get("step", step_no), self._pending.get("loss"),
                                  skipped=self.optimizer is not None and not before_update)
        if step_no % self.every:
            return
        if self._order is None:
            if self._dist is not None and self._dist.sharded and self._fwd_modules:
                # sharded gradients arrive per FSDP group (FSDP1: without per-parameter hooks at all),
                # not in autograd order: derive the order from the first forward instead
                self._arrival = self._dist.fallback_arrival(self._names, self._params, self._fwd_modules,
                                                            set(self._arrival) if self._arrival else None)
            if not self._arrival:
                return  # no gradient has arrived yet: nothing to record
            self._start()
        with_hist = self.histogram_every > 0 and self._recorded % self.histogram_every == 0
        if self._dist is not None and self._dist.sharded:
            self._begin_sharded_step(step_no, with_hist, before_update)
            return
        pend, self._pending = self._pending, {}
        values, hist, loss = self._collect(with_hist, pend.get("loss"))
        if loss is not None:
            pend["loss"] = loss
        self._append_step(step_no, pend, values, hist)
        self._trace_origin(values)
        self._recorded += 1
        if before_update and self._update_bufs is not None and (self._recorded - 1) % self.update_every == 0:
            self._snapshot_updates()
            self._snap_taken = True
            return  # finished in _post_step once the update norms are known
        self._finish_step()

    def _append_step(self, step_no: int, pend: dict, values: np.ndarray, hist) -> None:
        """Append one step's values with its loss, learning rate and global norm to the Run."""
        user_step = pend.get("step", step_no)
        loss = pend.get("loss")
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach().float().mean().cpu())
        lr = pend.get("lr")
        if lr is None and self.optimizer is not None:
            lr = self.optimizer.param_groups[0].get("lr")
        if isinstance(lr, torch.Tensor):
            lr = float(lr)
        # total norm over the tensors that have a gradient, as clip_grad_norm_ computes it
        has_grad = ~np.isnan(values[_M["nonfinite"]])
        gn = values[_M["grad_norm"], has_grad].astype(np.float64)
        global_norm = pend.get("global_norm")
        if global_norm is None:
            global_norm = float(np.sqrt(np.sum(gn * gn))) if gn.size else float("nan")
        elif isinstance(global_norm, torch.Tensor):
            global_norm = float(global_norm.detach().float().cpu())
        if self.run.n_steps and user_step <= self.run.steps[-1]:
            warnings.warn(f"gradwidget: step {user_step} does not increase (last was "
                          f"{int(self.run.steps[-1])}); recording it as {int(self.run.steps[-1]) + 1}",
                          GradwidgetWarning)
            user_step = int(self.run.steps[-1]) + 1
        self.run.append(user_step, values, {"loss": loss, "lr": lr, "global_norm": global_norm}, hist)
        self._warn_window()
        if self._unused_cols:
            self._adopt_late_layers(values)

    def _trace_origin(self, values: np.ndarray | None) -> None:
        """Look in the steps traced since the last recorded one for the first NaN/Inf's origin;
        once found, remove the tracer's hooks and keep the origin in the run (and its directory).
        Distributed: every rank posts its own and rank 0 keeps the earliest (``OriginExchange``).
        ``values``: this step's recorded metrics (None on ranks that do not hold the run)."""
        origin = None
        if self._tracer is not None:
            traces = self._tracer.take()
            if traces:
                reached, current = None, traces[-1].step
                if self.run is not None and values is not None:
                    bad = values[_M["nonfinite"]] > 0
                    names = [self.run.layers[c].name for c in np.flatnonzero(bad)[::-1]]  # nearest the loss first
                    reached = lambda s: names if s == current else None  # noqa: E731
                module_of = (lambda layer: self.run.layers[self.run.layer_index(layer)].module) if self.run else None
                origin = self._tracer.origin(traces, reached, module_of)
            if origin is not None:
                self._tracer.remove()
                self._tracer = None
                if self.run is not None and origin.step == current:
                    origin.step = int(self.run.steps[-1])  # the step as recorded
                if self._exchange is not None:
                    from .distributed import clean_name, type_name

                    origin.module_type = type_name(self.model.get_submodule(origin.module))  # FSDP's classes
                    origin.module, origin.rank = clean_name(origin.module), self._dist.rank
                    self._exchange.post(origin.to_dict())
        if self.run is None:
            return
        if self._exchange is not None:
            from .nonfinite import earliest

            origin = earliest([NonfiniteOrigin.from_dict(d) for d in self._exchange.gather()])
        if origin is not None and origin != self.run.nonfinite_origin:
            self.run.nonfinite_origin = origin
            if self._writer is not None:
                self._writer.write_meta()

    def _inert_step(self, optimizer, args, kwargs) -> None:
        """A DDP rank other than 0 (which records nothing): end the traced step; on the steps
        rank 0 records, look for this rank's origin and post it."""
        step_no, self._count = self._count, self._count + 1
        pend, self._pending = self._pending, {}
        self._tracer.end_step(pend.get("step", step_no), pend.get("loss"))
        if step_no % self.every == 0:
            self._trace_origin(None)
        if self._tracer is None:  # found and posted: nothing more to do on this rank
            for h in self._handles:
                h.remove()
            self._handles = []

    # ------------------------------------------------------------------ sharded (FSDP) steps
    def _begin_sharded_step(self, step_no: int, with_hist: bool, before_update: bool) -> None:
        """Every rank computes partial sums over its shards; with an update to measure, the one
        collective waits for the optimizer step post-hook so the update's partials ride along."""
        measure = (before_update and self._update_bufs is not None
                   and self._recorded % self.update_every == 0)
        pend, self._pending = self._pending, {}
        self._recorded += 1
        partials = self._dist.local_partials(self._params, with_hist, self.foreach_all,
                                             self._tracer.queue if self._tracer is not None else None)
        self._dist_step = {"step_no": step_no, "pend": pend, "partials": partials, "measure": measure}
        if measure:
            self._dist.snapshot(self._update_bufs)
            self._snap_taken = True
            return
        self._end_sharded_step()

    def _end_sharded_step(self) -> None:
        st, self._dist_step = self._dist_step, None
        reduced = self._dist.reduce(st["partials"])
        if reduced is None:
            self._trace_origin(None)  # this rank's own origin, posted for rank 0
            return  # not rank 0: rank 0 records and writes
        values, hist = self._dist.statistics(*reduced, getattr(self, "_update_cols", None), st["measure"])
        self._append_step(st["step_no"], st["pend"], values, hist)
        self._trace_origin(values)
        self._finish_step()

    def _finish_step(self) -> None:
        if self._writer is not None:
            self._writer.append_last()
        for fn in list(self.on_step):
            try:
                fn(self.run)
            except Exception as e:  # noqa: BLE001 - a display callback must never stop training
                warnings.warn(f"gradwidget: an on_step callback failed: {e!r}", GradwidgetWarning)

    # ------------------------------------------------------------------ setup at the first step
    def _start(self) -> None:
        """Fix the columns (depth order = reverse of gradient arrival) and create the Run."""
        arrived = self._arrival
        if self._capturing and not (self._mod_in or self._mod_out):
            # no forward hook ran outside a compiled graph (torch.compile): gradients arrived in the
            # compiled backward's output order, not the graph's; the model's own order is closer
            arrived = sorted(arrived, reverse=True)
        rank = {p: len(arrived) - 1 - k for k, p in enumerate(arrived)}  # depth rank
        keys, last = [], -0.5
        for i in range(len(self._params)):
            if i in rank:
                last = rank[i]
                keys.append((last, 0, i))
            else:
                keys.append((last, 1, i))
        self._order = [i for _, _, i in sorted(keys)]
        layers = []
        sharded = self._dist is not None and self._dist.sharded
        if sharded:
            from .distributed import clean_name, type_name

            self._dist.prepare(self._names, self._params, self._order)
        for i in self._order:
            p, name = self._params[i], self._names[i]
            mod, mtype = _module_of(self.model, name)
            status = "frozen" if not p.requires_grad else ("trainable" if i in rank else "unused")
            shape = self._dist.full_shape(name, p) if sharded else tuple(p.shape)
            if sharded:
                mtype = type_name(self.model.get_submodule(mod)) if mtype else mtype
                name, mod = clean_name(name), clean_name(mod)
            layers.append(LayerInfo(name=name, module=mod, module_type=mtype, shape=shape,
                                    numel=math.prod(shape), dtype=str(p.dtype).replace("torch.", ""),
                                    backward_index=arrived.index(i) if i in rank else -1, status=status,
                                    tied=self._tied.get(id(p), ())))
        if self._dist is not None and not self._dist.is_writer:
            self.run = None  # sharded, not rank 0: partial sums go to rank 0, which records
        else:
            self.run = Run(layers, thresholds=self.thresholds, max_steps=self._window(len(layers)),
                           edges=self._layer_edges(), meta={"model": type(self.model).__name__,
                                                            "optimizer": type(self.optimizer).__name__
                                                            if self.optimizer is not None else None,
                                                            "every": self.every})
            if self.skipped:
                self.run.meta["skipped"] = dict(self.skipped)
            if self._dist is not None:
                from .distributed import type_name

                self.run.meta["model"] = type_name(self.model)
                self.run.meta["distributed"] = {"kind": self._dist.kind, "world_size": self._dist.world_size}
        self._col_of = {pi: c for c, pi in enumerate(self._order)}
        self._ordered = [self._params[i] for i in self._order]  # the parameter of each column
        self._wplan = self._gplan = None
        self._unused_cols = [c for c, layer in enumerate(layers) if layer.status == "unused"]
        if self.track_updates:
            stepped = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
            cols = [c for c, pi in enumerate(self._order)
                    if self._params[pi].requires_grad and id(self._params[pi]) in stepped]
            params = [self._params[self._order[c]] for c in cols]
            self._update_cols = np.array(cols, dtype=np.int64)
            if sharded:
                self._update_bufs = self._dist.update_buffers(params)
            else:
                self._update_bufs = UpdateSnapshot(params)
        if self.log_dir is not None and self.run is not None:
            self._open_writer()
        # with an optimizer, arrival hooks are only needed once: drop them to keep steps cheap
        if self.optimizer is not None:
            for h in self._grad_handles:
                h.remove()
            self._grad_handles = []

    def _open_writer(self) -> None:
        """Start the run directory (inside the first optimizer step, so a failure here, say the
        folder removed since construction, is a loud warning and an explicit stop, not an
        exception that skips the update); later write failures are the writer's (``live``)."""
        from ..storage import RunWriter, RunWriteWarning

        try:
            self._writer = RunWriter(self.log_dir, self.run, overwrite=self._overwrite, live=True)
        except OSError as e:
            warnings.warn(f"gradwidget: not recording to {self.log_dir}: {e}. The run is kept in memory "
                          "only (recorder.run); save it with recorder.run.save(folder)", RunWriteWarning,
                          stacklevel=2)

    def _window(self, n_layers: int) -> int | None:
        """Steps kept in memory: with "auto", as many as fit the memory budget (the Run allocates up
        to twice the window while it slides), at least 1,000."""
        if self.max_steps != "auto":
            return self.max_steps
        per_step = 4 * len(METRICS) * n_layers + 32
        if self.histogram_every:
            per_step += 4 * N_BINS * n_layers / self.histogram_every
        return max(1000, int(self.memory_budget / (2 * per_step)))

    # ------------------------------------------------------------------ statistics
    def _collect(self, with_hist: bool, loss=None) -> tuple[np.ndarray, np.ndarray | None, object]:
        """This step's ``(METRICS, L)`` values, ``(L, N_BINS)`` histogram (on histogram steps) and
        loss (a tensor loss read in the same copy): weight norms, gradient statistics, exponent
        counts and the loss are packed per device and copied to the host once."""
        L = len(self._order)
        out = np.full((len(METRICS), L), np.nan, np.float32)
        hist = np.zeros((L, N_BINS), np.uint32) if with_hist else None
        with torch.no_grad():
            pack, wparts, gparts = self._queue_stats(with_hist)
            loss_at = pack.add(loss.detach().float().mean()) if isinstance(loss, torch.Tensor) else None
        if self._tracer is not None:
            self._tracer.queue(pack)  # the traced steps' finiteness rides in the same copy
        pack.fetch()
        for cols, at in wparts:
            out[_M["weight_norm"], cols] = pack.get(at)
        for cols, grads, numels, rows, counts in gparts:
            self._fill_grad_stats(out, cols, grads, numels, pack.get(rows))
            if hist is not None:
                nonzero = numels * (1.0 - out[_M["zero_frac"], cols])
                hist[cols] = octave_bins(pack.get(counts), nonzero)
        return out, hist, (float(pack.get(loss_at)) if loss_at is not None else loss)

    def _queue_stats(self, with_hist: bool) -> tuple[HostCopy, list, list]:
        """Queue the weight norms and gradient statistics of every column in a new host copy, by the
        plans of ``_groups`` (kept from step to step); a plan gone stale (a gradient appeared or
        vanished, a parameter moved) fails or shows here, and the step is planned again."""
        for attempt in range(2):
            if attempt or self._wplan is None:
                self._wplan = Plan(self._ordered, detached)
            if attempt or self._gplan is None or not self._gplan.current():
                self._gplan = Plan(self._ordered, grad_of)
            try:
                return self._queue_planned(with_hist)
            except (TypeError, RuntimeError, AttributeError):
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _queue_planned(self, with_hist: bool) -> tuple[HostCopy, list, list]:
        pack = HostCopy()
        wparts = [(cols, pack.add(stacked_norms(stacked(owners)))) for cols, owners in self._wplan.stacks]
        wparts += [(cols, pack.add(norms([p.detach() for p in owners])))
                   for cols, owners in self._wplan.rest.values()]
        gparts = []
        for cols, owners in self._gplan.stacks:
            grads = [p.grad for p in owners]
            x = stacked(grads)
            numels = np.full(len(cols), x.shape[1], np.float64)
            counts = pack.add(stacked_exponent_counts(x)) if with_hist else None
            gparts.append((cols, grads, numels, pack.add(stacked_rows(x)), counts))
        for (dev, _dt), (cols, owners) in self._gplan.rest.items():
            grads = [stored_values(p.grad) for p in owners]
            numels = np.array([p.numel() for p in owners], np.float64)
            rows = pack.add(grad_rows(grads, foreach_all=self.foreach_all or dev.type != "cpu"))
            counts = pack.add(exponent_counts(grads)) if with_hist else None
            gparts.append((cols, grads, numels, rows, counts))
        return pack, wparts, gparts

    @staticmethod
    def _fill_grad_stats(out: np.ndarray, cols: list[int], grads: list[torch.Tensor], n: np.ndarray,
                         host: np.ndarray) -> None:
        """Per-layer metrics of one gradient group from its host rows (``grad_rows``); ``grads``
        are the stored values (a sparse gradient's non-zero entries), ``n`` the layers' sizes."""
        l2, l1, linf, nnz, s = host[:5]
        mean = s / n
        with np.errstate(invalid="ignore", over="ignore"):
            var = np.maximum(l2 * l2 / n - mean * mean, 0.0)
        out[_M["grad_norm"], cols] = l2
        out[_M["mean_abs"], cols] = l1 / n
        out[_M["max_abs"], cols] = linf
        out[_M["std"], cols] = np.sqrt(var)
        out[_M["zero_frac"], cols] = 1.0 - nnz / n
        out[_M["nonfinite"], cols] = 0.0
        # rare: count the NaN/Inf entries of the offending tensors only (a host read each)
        for k in np.flatnonzero(~np.isfinite(l2)):
            g = grads[k]
            out[_M["nonfinite"], cols[k]] = float((~torch.isfinite(g)).sum())
            out[_M["zero_frac"], cols[k]] = 1.0 - float((g != 0).sum()) / n[k]
            out[_M["max_abs"], cols[k]] = math.inf

    # ------------------------------------------------------------------ backward-graph edges
    def _install_graph_capture(self) -> None:
        """Forward hooks that, on the first forward with autograd on, note which module output
        each parameter-owning module consumes. Removed once captured."""
        owners = {name: m for name, m in self.model.named_modules()
                  if any(True for _ in m.parameters(recurse=False))}
        self._mod_in: dict[str, list] = {}
        self._mod_out: dict = {}
        self._capturing = True

        def pre(name):
            def f(mod, args, kwargs=None):
                if _compiling():  # reading grad_fn inside a compiled region breaks its graph
                    return
                if torch.is_grad_enabled() and self._capturing:
                    if name not in self._mod_in and self._order is None:
                        self._fwd_modules.append(name)
                    fns = []
                    for a in list(args) + list((kwargs or {}).values()):
                        if isinstance(a, torch.Tensor) and a.grad_fn is not None:
                            fns.append(a.grad_fn)
                    self._mod_in.setdefault(name, []).extend(fns)
            return f

        def post(name):
            def f(mod, args, output):
                if _compiling():
                    return
                if torch.is_grad_enabled() and self._capturing:
                    outs = output if isinstance(output, (tuple, list)) else (output,)
                    for o in outs:
                        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                            self._mod_out.setdefault(o.grad_fn, name)
            return f

        def root_done(mod, args, output):
            if not _compiling() and torch.is_grad_enabled() and self._mod_out:
                self._finish_capture()

        for name, m in owners.items():
            self._graph_handles.append(m.register_forward_pre_hook(pre(name)))
            self._graph_handles.append(m.register_forward_hook(post(name)))
        self._graph_handles.append(self.model.register_forward_hook(root_done))

    def _finish_capture(self) -> None:
        """Turn what the forward hooks saw into module edges, then remove the hooks and drop the
        grad_fns they hold (and the activations those keep alive). Runs when the root module's
        forward returns or, for models whose root forward never runs (an ``nn.ModuleDict`` whose
        submodules are called directly), at the first step, whatever was seen by then."""
        if not self._capturing:
            return
        self._capturing = False
        self._edges_mod = (self._edges_mod or set()) | self._walk_edges()
        self._edge_wanted -= set(self._mod_in) | set(self._mod_out.values())
        self._mod_in, self._mod_out = {}, {}
        for h in self._graph_handles:
            h.remove()
        self._graph_handles = []
        if self.run is not None:  # graph captured after the first step: store it now
            self.run.edges = np.asarray(self._layer_edges(), np.int32).reshape(-1, 2)
            if self._writer is not None:
                self._writer.write_meta()

    def _capture_late_edges(self) -> None:
        """Capture the next forward's graph again while a layer first used after the first step has
        no edges yet; at most ``_LATE_CAPTURES`` times, since a layer used once may never return."""
        if self._edge_wanted and not self._capturing and self._late_captures < _LATE_CAPTURES:
            self._late_captures += 1
            self._install_graph_capture()

    def _adopt_late_layers(self, values: np.ndarray) -> None:
        """A layer marked unused at the first step that now has a gradient becomes trainable, placed
        after the layers of the first backward (its real arrival order was not observed), and the
        next forward is captured for its edges; the run directory's meta is rewritten."""
        has = ~np.isnan(values[_M["nonfinite"]])
        late = [c for c in self._unused_cols if has[c]]
        if not late:
            return
        self._unused_cols = [c for c in self._unused_cols if not has[c]]
        nxt = 1 + max(layer.backward_index for layer in self.run.layers)
        for k, c in enumerate(late):
            self.run.layers[c].status, self.run.layers[c].backward_index = "trainable", nxt + k
            self._edge_wanted.add(_module_of(self.model, self._names[self._order[c]])[0])
        self._capture_late_edges()
        if self._writer is not None:
            self._writer.write_meta()

    def _walk_edges(self) -> set[tuple[str, str]]:
        edges: set[tuple[str, str]] = set()
        visits = 0
        for name, fns in self._mod_in.items():
            stack, seen = list(fns), set()
            while stack and visits < _MAX_GRAPH_VISITS:
                node = stack.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                visits += 1
                src = self._mod_out.get(node)
                if src is not None and src != name:
                    edges.add((src, name))
                    continue
                for nxt, _ in getattr(node, "next_functions", ()):
                    if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                        stack.append(nxt)
        return edges

    def _layer_edges(self) -> list[tuple[int, int]]:
        if not self._edges_mod or self._order is None:
            return []
        by_mod: dict[str, list[int]] = defaultdict(list)
        for c, pi in enumerate(self._order):
            by_mod[_module_of(self.model, self._names[pi])[0]].append(c)
        return sorted({(a, b) for src, dst in self._edges_mod for a in by_mod.get(src, ())
                       for b in by_mod.get(dst, ())})
