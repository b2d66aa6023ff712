"""Record real PyTorch training into a Run, with hooks and fused per-step statistics.

A *step* is an optimizer step (gradients as the optimizer sees them: after accumulation and AMP
unscaling, via an optimizer step pre-hook) or, without an optimizer, one completed backward pass.
A step ``GradScaler`` skips (Inf/NaN found, so ``optimizer.step()`` never runs) is recorded at the
next ``optimizer.zero_grad()``.

Statistics are reduced a group at a time, never a Python op per tensor: small tensors of one
device, dtype and shape are stacked and reduced row by row, the rest go through fused
``torch._foreach_norm`` calls per device and dtype (as ``torch.nn.utils.clip_grad_norm_`` does);
the grouping is planned once and kept while the gradients keep their layout (``_groups``). One
backend per device (``_stats.queue_group``): on a GPU with Triton, one fused kernel takes every
statistic in one pass (``_fused``); on CPU and wherever Triton is absent, PyTorch's kernels. Sums are accumulated in float32 or wider whatever
the parameter dtype (``acc_dtype``; float64 in the fused kernels); complex, integer and meta-device
parameters are skipped with one warning. Per recorded step, the weight norms, the
gradient statistics, the histogram's exponent counts (on histogram steps) and a tensor loss of a
device are packed into one float64 tensor and copied to the host once; the update norms, known
only after ``optimizer.step()``, are a second copy on the steps that measure them. No ``.item()``
per parameter (a tensor holding NaN/Inf costs one more read, to count them). Layer order and
data-flow edges come from the real autograd graph, captured on the first forward (again for a
layer first used later). What this costs is written down in docs/costs.md.

The Recorder (this module) owns the model and optimizer references, the column layout, the Run and
its writer, the step bookkeeping (its gradient-arrival and optimizer step hooks) and a list of
probes (``_probe``), each of which owns its hooks, state and cadence and sees a recorded step
through a ``StepContext``: the layers' graph (``_graph``), the update norms (``_updates``), the
model and optimizer changes (``_changes``), the loss graph (``loss_graph``), the training-mode and
zero_grad checks (``_train_mode``, ``_grad_reset``), the noise scale (``_noise``), the NaN origin
(``_nonfinite_probe``) and the replicas' exchange (``_replica_exchange``). Its other parts get
what they need as arguments: ``_inputs`` (argument checks, wrappers, names), ``_layout`` (the
columns and the window), ``_skipped`` (steps AMP skipped), ``_stats`` (a step's statistics),
``_groups`` and ``_kernels`` (grouping and the reductions).
"""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import nn

from .._args import check_bool, check_bool_or_auto, check_count, check_objective
from .._warnings import GradwidgetWarning
from ..run import Run, _as_step
from ..storage import check_log_dir, check_resume, resume_point
from ..thresholds import as_thresholds
from ._changes import ModelWatch, WatchHost
from ._grad_reset import GradResetCheck
from ._graph import GraphCapture
from ._hooks import remove_tensor_hooks
from ._inputs import (
    _bytes_arg,
    _check_number,
    _clean_compiled,
    _module_of,
    _optimizer_extra,
    _recordable,
    _hands_over,
    _replace_attached,
    _shapes,
    _skipped_text,
    _tied_names,
    _unwrapped,
    _unwrapped_optimizer,
)
from ._kernels import HostCopy, norms
from ._layout import column_order, layer_infos, window, window_text
from ._meta import MetaFollow
from ._noise import NOISE_EVERY, SHARDED_TEXT, NoiseProbe
from ._nonfinite_probe import NonfiniteProbe
from ._probe import Probe, StepContext
from ._skipped import SkippedSteps
from ._stats import _M, StepStatistics
from ._train_mode import TrainModeCheck
from ._updates import UpdateNorms
from .loss_graph import LossGraphProbe

if TYPE_CHECKING:
    from ..storage import RunWriter
    from ._replica_exchange import ReplicaExchange
    from .distributed import DistContext

__all__ = ["Recorder", "norms"]  # norms: the fused kernel, for the trainer callbacks


#: backwards whose gradients zero_grad dropped, with no optimizer step yet, after which the Recorder
#: says that the optimizer never steps (``Recorder._note_discarded``): more than the micro-batches of
#: one step of an accumulation loop that zeroes each of them
NO_STEP_BACKWARDS = 16


@dataclass
class ShardedStep:
    """A sharded step between its partial sums and the one collective that combines them (which
    waits for the optimizer's post-hook when the step measures update norms)."""

    step_no: int
    pend: dict[str, Any]
    partials: np.ndarray
    measure: bool

    @property
    def label(self) -> int:
        """The step number the run records it under (the user's, when given)."""
        return int(self.pend.get("step", self.step_no))


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
    overwrite: replace the run already in ``log_dir`` (refused while another Recorder writes it).
    resume: continue the run in ``log_dir`` (after a crash, or for another training phase): its
        steps first, new ones numbered after them; refused for a model with other layers. A new or
        empty ``log_dir`` starts a run (``storage/_resume.py``). A step number instead of True:
        training goes on from a checkpoint of that step, so the run's steps after it are trained
        again and replaced (dropped from the folder too), not numbered after them.
    track_updates: record ``update_norm`` (keeps one copy of the trainable parameters).
    update_every: measure the update norm every this many recorded steps (NaN in between): taking
        it costs a copy of the parameters, ~2.5% of a step for a small transformer on CPU.
    trace_nonfinite: find where the first NaN/Inf was made (module, step, forward/backward/loss)
        into ``run.nonfinite_origin``. ``"auto"`` (default): the first recorded step whose gradients
        or loss are non-finite is replayed under hooks on every module before the optimizer applies
        it (``gradwidget.collect._replay``; a finite step pays one hook on the root module); the
        per-module tracer also runs on alternate warm-up steps and stays only if steps with it take
        0.98-1.02x the steps without (``_trace_cost``: wall clock and CPU time, paired, medians). A NaN made
        at a step not recorded (``every`` > 1) is not located: the run says so. ``True``: the
        per-module tracer on every step, recorded or not (``gradwidget.collect.nonfinite``: tens of
        microseconds of Python per module call; 1.2-1.3x a bare step for a small transformer on
        CPU, several times the step of thousands of tiny modules; docs/costs.md). ``False``: none.
        Under ``torch.distributed`` "auto" runs the tracer on every step (every rank alike).
    noise_scale: see each step's gradient at two batch sizes, for the gradient noise scale
        (``run.noise``; ``gradwidget.collect._noise``): the micro-batches of gradient accumulation
        and the accumulated gradient, or under DDP rank 0's local gradient and the synchronised one.
        ``"auto"`` (default) removes its hooks after a first step of one batch size (one backward a step,
        one process) and says so in ``run.meta["noise_scale"]``; ``split_backward`` opts a step in.
        True always hooks, False never. Not under FSDP.
    noise_every: measure the noise scale at one recorded step in this many (default 8: the estimate
        is a moving average over measured steps, and the noise scale moves slowly; 1/8 of the
        probe's cost), once its first estimate's 10 rows are taken, at the first 10 recorded steps
        (docs/costs.md).
    batch_size: the examples in one micro-batch (one backward); None (default) reads it from the
        first dimension of the first tensor the model is called with. ``log(batch_size=...)``
        sets it for one step.
    objective: what the logged loss is, for the analysis: ``"auto"`` (default) reads it off the
        loss's autograd graph; ``"loss"`` a loss to minimise (its trajectory is judged);
        ``"adversarial"`` (a GAN's), ``"policy_gradient"`` or ``"other"`` an objective that is not
        minimised on its own (no claim on its trajectory). Kept in ``run.meta["objective"]`` (the
        run folder's meta.json), so the panel, ``gradwidget report``, ``load_run`` + ``analyze`` and
        ``compare`` read the run with it; ``analyze(run, objective=...)`` overrides it.

    One Recorder per model: building another on the same model detaches this one (with a warning),
    as re-running a notebook cell does. With an optimizer, ``optimizer.zero_grad`` is wrapped on the
    instance (restored by ``detach``) so steps AMP's GradScaler skips are still recorded.

    Under ``torch.distributed`` (a default process group is initialised), build the Recorder on
    every rank, after wrapping the model (DDP, ``fully_shard``, FSDP1 ``use_orig_params=True``):
    DDP's averaged gradients are recorded on rank 0; FSDP shards are combined on rank 0 with one
    gather per recorded step. Only rank 0 writes ``log_dir`` and holds ``run`` (None elsewhere).
    With an optimizer every rank also fingerprints its replicated parameters on recorded steps and
    rank 0 compares them (``run.meta["replicas"]``, the ``replicas_diverged`` diagnosis).
    See ``gradwidget.collect.distributed`` and ``gradwidget.collect._replicas``.

    ``step_hooks=False`` leaves ``optimizer.step()``'s pre-hook (and ``zero_grad``) alone: the caller
    marks each step with ``record_step()`` (the trainer callbacks of ``gradwidget.integrations``).
    A ``torch.compile``d model records as the module it compiles (names without ``_orig_mod.``;
    no hook runs inside the compiled graph, so the backward-graph edges are not captured).
    """

    def __init__(
        self,
        model,
        optimizer=None,
        *,
        every: int = 1,
        histogram_every: int = 10,
        max_steps: int | str | None = "auto",
        memory_budget: int = 256 << 20,
        thresholds=None,
        log_dir=None,
        overwrite: bool = False,
        track_updates: bool = True,
        update_every: int = 10,
        trace_nonfinite: bool | str = "auto",
        step_hooks: bool = True,
        noise_scale: bool | str = "auto",
        noise_every: int = NOISE_EVERY,
        batch_size: int | None = None,
        resume: bool | int = False,
        objective: str = "auto",
    ) -> None:
        model, optimizer = _unwrapped(model), _unwrapped_optimizer(optimizer)
        if not isinstance(model, nn.Module):
            raise TypeError(
                f"Recorder needs a torch.nn.Module, got {type(model).__name__}; "
                "for other frameworks use gradwidget.ArrayRecorder"
            )
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        every, update_every = check_count("every", every, 1), check_count("update_every", update_every, 1)
        histogram_every = check_count("histogram_every", histogram_every, 0)
        if not (max_steps is None or max_steps == "auto"):
            max_steps = check_count("max_steps", max_steps, 1, "'auto', None or ")
        memory_budget = _bytes_arg("memory_budget", memory_budget)
        trace_nonfinite = check_bool_or_auto("trace_nonfinite", trace_nonfinite)
        noise_scale = check_bool_or_auto("noise_scale", noise_scale)
        noise_every = check_count("noise_every", noise_every, 1)
        if batch_size is not None:
            batch_size = check_count("batch_size", batch_size, 1)
        self.objective = check_objective(objective)
        flags = {"overwrite": overwrite, "track_updates": track_updates}
        for flag, value in dict(flags, step_hooks=step_hooks).items():
            check_bool(flag, value)
        resume_after = check_resume(resume)
        resume = resume is not False
        if resume and (overwrite or log_dir is None):
            raise ValueError(
                "resume=True continues the run in log_dir: give a log_dir, and not overwrite=True (which replaces it)"
            )
        #: how the model is distributed (None in a single process: no distributed code runs)
        self._dist: DistContext | None = None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from .distributed import attach

            self._dist = attach(model, optimizer)
            model = self._dist.model  # DDP unwrapped, so names match the single-process model
        self.model, self.optimizer = model, optimizer
        self.every, self.histogram_every = every, histogram_every
        self.max_steps, self.thresholds = max_steps, as_thresholds(thresholds)
        self.memory_budget = memory_budget
        if resume and self._dist is not None:
            raise ValueError("resume=True is not supported under torch.distributed yet: record into a new log_dir")
        if log_dir is not None and not resume and (self._dist is None or self._dist.is_writer):
            # refuse now, not inside the first optimizer.step()
            check_log_dir(log_dir, overwrite, handover=_hands_over(model, log_dir))
        self.log_dir, self._overwrite = log_dir, overwrite
        self._track_updates_asked = track_updates
        self.track_updates = track_updates and optimizer is not None

        all_named = list(model.named_parameters())
        if not all_named:
            raise ValueError(f"{type(model).__name__} has no parameters to record")
        named, self.skipped = _recordable(all_named)
        if not named:
            raise ValueError(f"no parameter of {type(model).__name__} can be recorded: {_skipped_text(self.skipped)}")
        if not any(p.requires_grad for _, p in named):
            raise ValueError(
                f"every parameter of {type(model).__name__} is frozen (requires_grad=False), "
                "so there is no gradient to record: unfreeze the layers you train before "
                "building the Recorder"
            )
        self._names = [_clean_compiled(n) for n, _ in named]
        self._params = [p for _, p in named]
        self._tied = _tied_names(model, self._params)
        #: tensors the optimizer holds that are not the model's (a loss temperature, multi-task loss
        #: weights, the head a replaced ``model.classifier`` left behind): not recorded, said in repr
        self.optimizer_extra = _optimizer_extra(model, optimizer, all_named)
        #: the run in log_dir this recorder continues (resume=True), checked against these layers
        self._resume = resume_point(log_dir, _shapes(self._names, self._params), resume_after) if resume else None

        _replace_attached(model, self)
        self.run: Run | None = None
        self.on_step: list[Callable[[Run], None]] = []
        self._handles: list = []
        self._opt_handles: list = []  # the step hooks on self.optimizer
        self._watch: ModelWatch | None = None
        self._arrival: list[int] = []  # parameter indices in gradient arrival order
        self._arrival_set: set[int] = set()
        self._grad_handles: list = []
        self._in_backward = False
        self._count = self._resume.next_step if self._resume else 0  # steps seen (recorded or not)
        self._recorded = 0
        self._pending: dict = {}
        self._order: list[int] | None = None  # column -> parameter index
        self._dist_step: ShardedStep | None = None  # a sharded step waiting for its collective
        self._requeued = False  # the end-of-backward callback queued again, behind DDP's or FSDP's
        self._closure_open = False  # a closure step not recorded yet (its closure has not run)
        #: steps AMP skipped, seen at the zero_grad after them (``_skipped``)
        self._zero_grad = SkippedSteps(lambda: self._params, self._on_step, self._note_discarded, self._passive)
        self._in_step = False  # inside optimizer.step(), whose closure (LBFGS) may call zero_grad
        self._step_frame: Any = None  # the frame of the step() call being recorded
        self._window_told = False  # the window's folding was said
        self._writer: RunWriter | None = None
        self._meta = MetaFollow()  # run.meta's changes into the folder's meta.json (``_meta``)
        self._probes: list[Probe] = []  # the instruments (``_probe``), called in this order
        #: the zero_grad check (``_grad_reset``), planned with the update norms
        self._reset_check: GradResetCheck | None = None
        self._attached = True
        self._step_hooks = step_hooks
        self._graph = GraphCapture(model, lambda: self._order is None, self._store_edges)  # layer edges
        self._probes.append(self._graph)
        sharded = self._dist if self._dist is not None and self._dist.sharded else None
        self._updates = UpdateNorms(update_every, sharded)  # planned at the first step
        self._probes.append(self._updates)
        self._unused_cols: list[int] = []
        self._loss_probe: LossGraphProbe | None = None
        self._noise: NoiseProbe | None = None
        self._noise_off: str | None = None  # why there is no noise probe, when one was asked for
        self._replicas: ReplicaExchange | None = None
        nonfinite = functools.partial(
            NonfiniteProbe,
            model,
            trace_nonfinite,
            run=lambda: self.run,
            write_meta=self._write_meta,
            dist=self._dist,
            every=every,
        )
        if self._dist is not None and self._dist.inert:
            # replicated gradients (DDP): rank 0 records them; the other ranks only trace their own
            # NaN origin (an optimizer step hook ends each step), unless trace_nonfinite=False,
            # and take part in the replica check (its hook first: _inert_step removes itself from
            # inside the optimizer's loop over its hooks, which only the last one may do)
            self._attach_replica_check()
            self._nonfinite = nonfinite(tracer=optimizer is not None)
            self._probes.append(self._nonfinite)
            if optimizer is not None and any(probe.needs_steps for probe in self._probes):
                self._handles.append(optimizer.register_step_pre_hook(self._inert_step))
            return

        #: follows a model and optimizer that change while training (not under torch.distributed)
        if self._dist is None:
            self._watch = ModelWatch(
                WatchHost(
                    model=model,
                    params=self._params,
                    names=self._names,
                    unrecorded={n for names in self._tied.values() for n in names} | set(self.skipped),
                    optimizer=lambda: self.optimizer,
                    attached=lambda: self._attached,
                    rebind=self._rebind,
                    lazy_ready=self._lazy_ready,
                    optimizer_changed=self._plan_optimizer,
                    adopt_optimizer=self._adopt_optimizer,
                )
            )
            self._probes.append(self._watch)
        lazy = []
        for i, p in enumerate(self._params):
            if p.requires_grad:
                if nn.parameter.is_lazy(p):  # nn.LazyLinear: no shape before the first forward
                    lazy.append(i)
                else:
                    self._hook_arrival(i, p)
        if lazy and self._watch is not None:
            self._watch.watch_lazy(lazy)
        self._register_optimizer()
        self._graph.install()
        self._loss_probe = LossGraphProbe(model)  # one step to see a loss with its graph
        self._probes.append(self._loss_probe)
        train_mode = TrainModeCheck.of(model)  # None for a model without normalisation or dropout modules
        if train_mode is not None:
            self._probes.append(train_mode)
        if noise_scale and (self._dist is None or not self._dist.sharded):
            world = self._dist.world_size if self._dist is not None and self._dist.kind == "ddp" else 1
            self._noise = NoiseProbe(
                model,
                self._params,
                batch_size,
                world,
                noise_scale,
                noise_every,
                record_every=every,
                run=lambda: self.run,
                also_measure=lambda: self._nonfinite.weighing,
            )
            self._probes.append(self._noise)
        elif noise_scale and self._dist is not None:  # sharded: said in the run, not silently absent
            self._noise_off = SHARDED_TEXT.format(kind=self._dist.kind)
        #: the NaN/Inf origin: the tracer, its replay and its cost meter (``_nonfinite_probe``)
        self._nonfinite = nonfinite()
        self._probes.append(self._nonfinite)
        self._attach_replica_check()  # after the step pre-hook: rank 0 labels the step it recorded

    def _attach_replica_check(self) -> None:
        """Under torch.distributed with an optimizer, every rank takes part in the replica check
        (``gradwidget.collect._replicas``); rank 0 keeps its record in ``run.meta["replicas"]``."""
        if self._dist is None or self.optimizer is None:
            return

        def label() -> int | None:
            st = self._dist_step  # a sharded step waiting for its update norms: not in the run yet
            if st is not None:
                return st.label
            run = self.run
            return int(run.steps[-1]) if run is not None and run.n_steps else None

        def keep(record: dict) -> None:
            self.note_meta({"replicas": copy.deepcopy(record)})

        from ._replica_exchange import ReplicaExchange

        self._replicas = ReplicaExchange(
            self._dist,
            self._names,
            self._params,
            self.every,
            label,
            keep,
            tolerance=self.thresholds.replica_tolerance,
        )
        self._replicas.attach(self.optimizer)
        self._probes.append(self._replicas)

    def _register_optimizer(self) -> None:
        """The step hooks (and the ``zero_grad`` wrapper) on ``self.optimizer``."""
        optimizer = self.optimizer
        if optimizer is None:
            return
        if self._step_hooks:
            self._opt_handles.append(optimizer.register_step_pre_hook(self._pre_step))
        self._opt_handles.append(optimizer.register_step_post_hook(self._post_step))
        if self._step_hooks and (self._dist is None or not self._dist.sharded):
            self._zero_grad.wrap(optimizer)

    def _rebind(self, rebound: list) -> None:
        """Parameters re-created under their names with the same shape and dtype (``[(index, new)]``,
        found by the ``ModelWatch``): recorded from now on in place of the old ones."""
        for i, new in rebound:
            self._params[i] = new
            if self.optimizer is None or self._order is None:  # arrival hooks still needed
                self._hook_arrival(i, new)
        if self._order is not None:
            self._stats = StepStatistics([self._params[i] for i in self._order])
            self._plan_optimizer()

    def _lazy_ready(self, i: int, p: torch.Tensor) -> None:
        """Lazy parameter ``i`` has its shape (its first forward): its gradient's arrival is watched."""
        if self._order is None:
            self._hook_arrival(i, p)

    def _adopt_optimizer(self, optimizer) -> None:
        """Record the steps of ``optimizer`` from now on, in place of the old one's (a new optimizer
        built for a second phase of training: ``_changes.ModelWatch``)."""
        self._finish_unstepped()
        for h in self._opt_handles:
            h.remove()
        self._opt_handles = []
        self._zero_grad.unwrap()
        self.optimizer = optimizer
        self.track_updates = self._track_updates_asked
        self._register_optimizer()
        self._plan_optimizer()
        try:  # what the new optimizer holds beyond the model (repr, run.meta)
            self.optimizer_extra = _optimizer_extra(self.model, optimizer, list(self.model.named_parameters()))
        except ValueError:  # none of the model's parameters as they are now: nothing to say beyond them
            self.optimizer_extra = None
        if self.run is not None:
            self.run.meta.pop("optimizer_extra", None)
            if self.optimizer_extra is not None:
                self.run.meta["optimizer_extra"] = self.optimizer_extra.to_dict()
            if self._writer is not None:
                self._writer.write_meta()

    # ------------------------------------------------------------------ public
    def log(self, loss=None, lr=None, step: int | None = None, global_norm=None, batch_size=None) -> None:
        """Attach the loss (a tensor is fine: it is read once, at record time), a learning rate, or
        your own step number to the next recorded step. ``global_norm``: the global gradient norm a
        trainer computed before clipping it (kept instead of the norm of the clipped gradients, so
        the explosion clipping hid stays visible). ``batch_size``: the examples in each of this
        step's micro-batches (call it before the backwards; for the gradient noise scale)."""
        if batch_size is not None and self._noise is not None:
            self._noise.tell_batch(check_count("batch_size", batch_size, 1))
        if global_norm is not None:
            self._pending["global_norm"] = _check_number("global_norm", global_norm)
        if loss is not None:
            self._pending["loss"] = _check_number("loss", loss)
            self.watch_loss(loss)
        if lr is not None:
            self._pending["lr"] = _check_number("lr", lr)
        if step is not None:
            self._pending["step"] = _as_step(step)

    def note_meta(self, values: dict, now: bool = True) -> None:
        """Add ``values`` (JSON-ready) to the run's meta (``run.meta``) and to its run directory's
        meta.json: at once, or with ``now=False`` within one flush interval (``collect/_meta.py``).
        For what a trainer integration knows of the run (that it clips, at which norm)."""
        if self.run is None:
            return
        self.run.meta.update(values)
        self._meta.changed(self._writer, now=now)

    def watch_loss(self, loss) -> None:
        """Read the ops between the model's output and ``loss`` (a tensor with its graph) without
        logging it, once (``gradwidget.collect.loss_graph``): for trainers that log the loss detached."""
        if self._loss_probe is not None:
            self._loss_probe.see(loss)

    def detach(self) -> None:
        """Remove every hook this recorder installed and close its run directory (recording first
        a last backward no optimizer step consumed)."""
        if self._attached and self._zero_grad.wrapped:
            self._zero_grad.flush()
        if self._attached and self._dist is None:
            self._finish_unstepped()
        for h in self._handles + self._opt_handles:
            h.remove()
        remove_tensor_hooks(self._grad_handles, self._params)
        self._handles, self._opt_handles, self._grad_handles = [], [], []
        self._loss_probe = None  # closed with the probes
        self._zero_grad.unwrap()
        for probe in reversed(self._probes):
            probe.close()
        self._probes = []
        if self._writer is not None:
            self._meta.flush(self._writer)  # the last interval's counts
            self._writer.close()
        if self._resume is not None:
            self._resume.release()  # resumed but never written: the folder is free again
        self._attached = False

    close = detach

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._zero_grad.stepped = True  # training failed: its last gradients are no skipped step to record
        self.detach()

    def split_backward(self, loss_fn, *batch, parts: int = 2):
        """Run this step's forward and backward as ``parts`` slices of ``batch`` (along its first
        dimension), each ``loss_fn(*slice) / parts``: the same gradient as ``loss_fn(*batch).backward()``
        for a loss averaged over the batch (not with BatchNorm in training mode), seen at two batch
        sizes, so the gradient noise scale is estimated at this step. Call it one step in N instead of
        the backward; returns the batch's loss (detached). Its cost: ``parts`` smaller forwards and
        backwards instead of one (bench/noise_scale.py measures it)."""
        if self._noise is None:
            raise RuntimeError("split_backward needs Recorder(..., noise_scale='auto' or True) (not under FSDP)")
        return self._noise.split(loss_fn, batch, check_count("parts", parts, 2))

    def record_step(self) -> None:
        """Record the gradients as they are now as one optimizer step, for a Recorder built with
        ``step_hooks=False``: a trainer that says when it is about to step (the callbacks in
        ``gradwidget.integrations``) marks the step, not ``optimizer.step()`` (Lightning runs the
        backward inside ``optimizer.step(closure)``, after its pre-hooks). The update norm is still
        measured by the optimizer's post-hook."""
        self._finish_unstepped()
        self._pre_step(self.optimizer, (), {})
        self._in_step, self._step_frame = False, None  # no step() call of ours to wait for

    def _finish_unstepped(self) -> None:
        """Finish (write, tell on_step) a step ``record_step`` recorded whose ``optimizer.step()``
        never ran (AMP skipped it, or training stopped): no update norm, none measured."""
        if self._updates.waiting:
            self._updates.forget()
            self._finish_step()

    @property
    def layer_names(self) -> list[str]:
        """The names of the parameters it records, in the model's order (the run's columns, once
        the first step has set their order, are ``run.layer_names``)."""
        return list(self._names)

    @property
    def attached(self) -> bool:
        return self._attached

    @property
    def update_every(self) -> int:
        """The update norm is measured one recorded step in this many."""
        return self._updates.every

    @property
    def noise_every(self) -> int | None:
        """The gradient noise scale is measured one recorded step in this many, after its first
        rows (None while it is not measured: asked off, unavailable, or "auto" saw one batch size)."""
        noise = self._noise
        return noise.every if noise is not None and noise.armed else None

    @property
    def trace_nonfinite(self) -> bool | str:
        """How the NaN/Inf origin is looked for (the argument given)."""
        return self._nonfinite.mode

    def tracing_text(self) -> str:
        """How the NaN origin is looked for, and why, in words (``repr(recorder)``)."""
        return self._nonfinite.text()

    def _write_meta(self) -> None:
        """Write the run's meta to its folder now (a finding)."""
        if self._writer is not None:
            self._writer.write_meta()

    def _note_discarded(self, n: int) -> None:
        """``n`` backwards' finite gradients were dropped by zero_grad before any step used them.
        Before any optimizer step at all, the ``NO_STEP_BACKWARDS``-th says so, once: nothing is
        recorded until the optimizer steps, and a forgotten ``optimizer.step()`` would otherwise
        leave the run empty without a word."""
        if self.run is not None:
            self.run.meta["discarded_backwards"] = n
        elif n == NO_STEP_BACKWARDS:
            warnings.warn(
                f"gradwidget: optimizer.zero_grad() has dropped the gradients of {n} backward passes and "
                f"{type(self.optimizer).__name__}.step() has not run once, so the model is not training "
                "and nothing is recorded: call optimizer.step() after loss.backward(), before "
                "optimizer.zero_grad()",
                GradwidgetWarning,
                stacklevel=4,
            )

    def _passive(self) -> bool:
        """Whether a zero_grad call is only passed on: a closure's backwards belong to the step
        under way, and a detached recorder still wrapped records nothing."""
        return self._in_step or not self._attached

    def __repr__(self) -> str:
        state = "attached" if self._attached else "detached"
        extra = f", {self.optimizer_extra.text()}" if self.optimizer_extra is not None else ""
        return (
            f"<Recorder {type(self.model).__name__} {state}, {self.window_text()}, {self.tracing_text()}{extra}, "
            f"{self.run!r}>"
        )

    def window_text(self) -> str:
        """How many steps the in-memory run keeps, and what decided it, in words."""
        return window_text(self.max_steps, self.memory_budget, self._window(len(self._names)))

    def _window(self, n_layers: int) -> int | None:
        """Steps kept in memory (``_layout.window``)."""
        noise = self._noise if self._noise is not None and self._noise.keeps_rows else None
        return window(
            self.max_steps,
            self.memory_budget,
            self.histogram_every,
            n_layers,
            noise.every if noise is not None else None,
        )

    def _warn_window(self) -> None:
        """Say once, when the window of ``max_steps="auto"`` (which the user never chose) starts to
        fold steps into the coarser ``run.history``, how to keep more."""
        if self._window_told or self.max_steps != "auto" or self.run is None or self.run.history is None:
            return
        self._window_told = True
        disk = f"; every step is still written to {self.log_dir}" if self._writer is not None else ""
        warnings.warn(
            f"gradwidget: {self.window_text()}; older steps are now folded into run.history at a "
            f"coarser resolution{disk}. Keep more with Recorder(..., memory_budget=<bytes>) or "
            "max_steps=None (every step; memory grows with the run)",
            GradwidgetWarning,
            stacklevel=2,
        )

    # ------------------------------------------------------------------ setup at the first step
    def _start(self) -> None:
        """Fix the columns (depth order = reverse of gradient arrival) and create the Run."""
        arrived = self._arrival
        if self._graph.capturing and not self._graph.seen:
            # no forward hook ran outside a compiled graph (torch.compile): gradients arrived in the
            # compiled backward's output order, not the graph's; the model's own order is closer
            arrived = sorted(arrived, reverse=True)
        self._order = column_order(arrived, len(self._params))
        if self._resume is not None:  # the columns of the run continued, whose files hold them so
            at = {name: i for i, name in enumerate(self._names)}
            self._order = [at[info.name] for info in self._resume.run.layers]
        dist = self._dist if self._dist is not None and self._dist.sharded else None
        if dist is not None:
            dist.prepare(self._names, self._params, self._order)
        layers = layer_infos(self.model, self._names, self._params, self._tied, self._order, arrived, dist)
        if self._dist is not None and not self._dist.is_writer:
            self.run = None  # sharded, not rank 0: partial sums go to rank 0, which records
        else:
            self.run = Run(
                layers,
                thresholds=self.thresholds,
                max_steps=self._window(len(layers)),
                edges=self._graph.layer_edges(self._order, self._names),
                meta={
                    "model": type(self.model).__name__,
                    "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
                    "every": self.every,
                },
            )
            if self.objective != "auto":  # stated by the user: read by every analysis of the run
                self.run.meta["objective"] = self.objective
            if self.skipped:
                self.run.meta["skipped"] = dict(self.skipped)
            if self.optimizer_extra is not None:
                self.run.meta["optimizer_extra"] = self.optimizer_extra.to_dict()
            if self._resume is not None:
                self._continue(self._resume.run)
            if self._dist is not None:
                from .distributed import type_name

                self.run.meta["model"] = type_name(self.model)
                self.run.meta["distributed"] = {"kind": self._dist.kind, "world_size": self._dist.world_size}
            if self._noise_off is not None:
                self.run.meta["noise_scale"] = {"unavailable": self._noise_off}
        self._col_of = {pi: c for c, pi in enumerate(self._order)}
        self._stats = StepStatistics([self._params[i] for i in self._order])
        self._unused_cols = [c for c, layer in enumerate(layers) if layer.status == "unused"]
        self._plan_optimizer()
        if self.log_dir is not None and self.run is not None:
            self._open_writer()
        # with an optimizer, arrival hooks are only needed once: drop them to keep steps cheap
        if self.optimizer is not None:
            remove_tensor_hooks(self._grad_handles, self._params)
            self._grad_handles = []

    def _plan_optimizer(self) -> None:
        """Which columns' update norms are measured (the trainable parameters the optimizer holds:
        ``_updates``), and which parameter the zero_grad check watches: at the first step, and again
        when the model or the optimizer changed (``_changes``)."""
        if self.optimizer is None or self._order is None:
            return
        stepped = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        if self.run is not None:  # the trainable layers it does not hold (a target or EMA copy, or a mistake)
            self.run.meta["not_in_optimizer"] = [
                self.run.layers[c].name
                for c, pi in enumerate(self._order)
                if self._params[pi].requires_grad and id(self._params[pi]) not in stepped
            ]
        self._plan_reset_check(stepped)
        if not self.track_updates:
            return
        cols = [
            c for c, pi in enumerate(self._order) if self._params[pi].requires_grad and id(self._params[pi]) in stepped
        ]
        self._updates.plan(cols, [self._params[self._order[c]] for c in cols])

    def _plan_reset_check(self, stepped: set[int]) -> None:
        """Watch one parameter the optimizer holds for a gradient not reset between steps
        (``_grad_reset``), keeping the counts when the model changed; not under torch.distributed,
        where each rank's backward brings its own part of the reduced gradient."""
        if self._dist is not None or not self._step_hooks:
            return
        assert self._order is not None  # planned from the first step on
        cols = [pi for pi in self._order if id(self._params[pi]) in stepped]
        held, names = [self._params[pi] for pi in cols], [self._names[pi] for pi in cols]
        old, self._reset_check = self._reset_check, GradResetCheck.choose(held, names)
        if old is not None:
            old.close()
            self._probes.remove(old)
            if self._reset_check is not None:
                self._reset_check.continue_from(old)
        if self._reset_check is not None:
            self._probes.append(self._reset_check)

    def _continue(self, old: Run) -> None:
        """Put the run this recorder resumes in front of its own (``Run.continue_from``)."""
        assert self.run is not None
        self.run.continue_from(old)
        for probe in self._probes:
            probe.continues(old)
        self._recorded = old.n_steps

    def _open_writer(self) -> None:
        """Start the run directory (inside the first optimizer step, so a failure here, say the
        folder removed since construction, is a loud warning and an explicit stop, not an
        exception that skips the update); later write failures are the writer's (``live``)."""
        from ..storage import RunWriter, RunWriteWarning

        try:
            assert self.run is not None  # only the process that holds the run writes
            self._writer = RunWriter(self.log_dir, self.run, overwrite=self._overwrite, live=True, resume=self._resume)
        except OSError as e:
            warnings.warn(
                f"gradwidget: not recording to {self.log_dir}: {e}. The run is kept in memory "
                "only (recorder.run); save it with recorder.run.save(folder)",
                RunWriteWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------ hooks
    def _hook_arrival(self, i: int, p: torch.Tensor) -> None:
        """Note when parameter ``i``'s gradient arrives (the first backward's order fixes the columns)
        and, without an optimizer, end the step when its backward ends. With an optimizer the hooks
        are removed after the first step: tensor hooks then, whose dict ``remove_tensor_hooks``
        can unhook from autograd (a removed post-accumulate-grad hook leaves its dict called for
        every parameter in every backward); without one they stay, after accumulation."""

        def hook(_):
            if self._order is None and i not in self._arrival_set:
                self._arrival.append(i)
                self._arrival_set.add(i)
            if self.optimizer is None and not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

        register = p.register_post_accumulate_grad_hook if self.optimizer is None else p.register_hook
        self._grad_handles.append(register(hook))

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

    def _pre_step(self, optimizer, args, kwargs):
        if self._nested_step(sys._getframe(1)):
            return None
        if self._watch is not None:
            self._watch.own_step()
        self._zero_grad.stepped = self._in_step = True
        # args: (optimizer, *step's arguments), as the step wrapper passes them to its hooks
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if callable(closure):  # LBFGS: the step's gradient is made inside step(), by the closure
            return self._recording_closure(closure, args, kwargs)
        self._on_step(before_update=True)
        return None

    def _recording_closure(self, closure, args, kwargs) -> tuple[tuple, dict]:
        """``optimizer.step(closure)``: the step is recorded right after the closure's first call,
        with the gradient it made at the parameters the step starts from (the pre-hook runs before
        it, when the gradients are still the last step's, or none at step 0), and its loss when
        none was logged. Later calls (LBFGS's line search) belong to the same step."""
        self._closure_open = True

        def recording_closure():
            loss = closure()
            if self._closure_open:
                self._closure_open = False
                if isinstance(loss, torch.Tensor) and loss.numel() == 1 and "loss" not in self._pending:
                    self._pending["loss"] = loss
                    if self._loss_probe is not None:
                        self._loss_probe.see(loss)
                self._on_step(before_update=True)
            return loss

        if "closure" in kwargs:
            return args, dict(kwargs, closure=recording_closure)
        return (args[0], recording_closure, *args[2:]), kwargs

    def _nested_step(self, caller) -> bool:
        """Is this step() call inside another one being recorded (an optimizer subclass whose step
        calls ``super().step()``: both are hooked)? ``caller``: the frame of torch's step wrapper
        that runs the hooks; the outer call's is kept while it runs. One that raised is no longer
        on the stack, so the next step() is a step again."""
        outer = self._step_frame
        if outer is not None and outer is not caller:
            f = caller.f_back
            while f is not None:
                if f is outer:
                    return True
                f = f.f_back
        self._step_frame = caller
        return False

    def _post_step(self, optimizer, args, kwargs) -> None:
        caller = sys._getframe(1)
        if self._step_frame is not None and self._step_frame is not caller:
            return  # the end of a nested step() call (``_nested_step``): the outer one ends the step
        self._step_frame = None
        self._in_step = False
        if self._closure_open:  # a closure the optimizer never called: the gradients as they are
            self._closure_open = False
            self._on_step()
        if not self._updates.waiting:
            return
        if self._dist is not None and self._dist.sharded:
            assert self._dist_step is not None  # begun at the pre-hook, waiting for this update
            self._updates.measure_sharded(self._dist_step.partials)
            self._end_sharded_step()
            return
        assert self.run is not None  # not sharded: this process records
        self._updates.measure(self.run)
        self._finish_step()

    # ------------------------------------------------------------------ the step
    def _on_step(self, before_update: bool = False) -> None:
        try:
            self._step(before_update)
        finally:
            for probe in self._probes:
                probe.after_step(self._count - 1)

    def _step(self, before_update: bool) -> None:
        if self._updates.waiting:  # the last step's optimizer.step() raised (and was caught): finish it
            self._updates.forget()
            self._finish_step()
        if self._watch is not None:
            self._watch.before_step()  # parameters re-created, an optimizer's parameters changed
        if self._graph.capturing and self._graph.seen:  # else (LBFGS's first step() runs before its
            self._graph.finish()  # closure) keep watching
        self._graph.capture_late()
        step_no = self._count
        self._count += 1
        # with an optimizer, a step not read at its step pre-hook is one it skipped (AMP)
        skipped = self.optimizer is not None and not before_update
        recorded = step_no % self.every == 0
        for probe in self._probes:
            probe.every_step(self._pending.get("step", step_no), self._pending.get("loss"), skipped, recorded)
        if before_update:
            for probe in self._probes:
                probe.before_update()
        if not recorded:
            return
        if self._order is None:
            if self._dist is not None and self._dist.order_from_forward and self._graph.fwd_modules:
                # sharded gradients arrive per FSDP group (FSDP1: without per-parameter hooks at all),
                # not in autograd order: derive the order from the first forward instead
                self._arrival = self._dist.fallback_arrival(
                    self._names, self._params, self._graph.fwd_modules, set(self._arrival) if self._arrival else None
                )
            if not self._arrival:
                if self._watch is not None and self.optimizer is not None:
                    self._watch.no_gradient(self._pending.get("step", step_no), self._reset_check)
                return  # no gradient has arrived yet: nothing to record
            self._start()
            if before_update and self._reset_check is not None:
                self._reset_check.before_update()  # planned by _start: the first gradient, for the next step
        with_hist = self.histogram_every > 0 and self._recorded % self.histogram_every == 0
        if self._dist is not None and self._dist.sharded:
            self._begin_sharded_step(step_no, with_hist, before_update)
            return
        pend, self._pending = self._pending, {}
        logged = pend.get("loss")
        # a logged loss tensor without an autograd graph (a validation loss under no_grad) is not the
        # training's: a NaN in it alone is no origin to replay (``StepTrace.loss_outside_training``)
        outside = isinstance(logged, torch.Tensor) and not logged.requires_grad
        assert self._order is not None  # set by the first step, before any is collected
        values, hist, loss, pack = self._stats.collect(with_hist, logged, self._queue_probes)
        if loss is not None:
            pend["loss"] = loss
        measure = before_update and self._updates.due(self._recorded)
        training_loss = None if outside else pend.get("loss")
        self._append_step(
            step_no, pend, values, hist, complete=not measure, training_loss=training_loss, skipped=skipped
        )
        self._recorded += 1
        if measure:  # the parameters this step will update, copied
            self._updates.take()
            return  # finished in _post_step once the update norms are known
        self._finish_step()

    def _append_step(
        self,
        step_no: int,
        pend: dict,
        values: np.ndarray,
        hist,
        complete: bool = True,
        training_loss=None,
        skipped: bool = False,
    ) -> None:
        """Append one step's values with its loss, learning rate and global norm to the Run
        (``complete=False``: its update norms are filled in by ``_post_step``), then show it to
        the probes (``training_loss``: the loss to trace, None for one logged without a graph;
        ``skipped``: the optimizer skipped the step)."""
        if self._watch is not None and self._order is not None:
            self._watch.mask_gone(values, self._order)  # layers no longer in the model: no values
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
        run = self.run
        assert run is not None  # called on the recording rank only
        if run.n_steps and user_step <= run.steps[-1]:
            warnings.warn(
                f"gradwidget: step {user_step} does not increase (last was "
                f"{int(run.steps[-1])}); recording it as {int(run.steps[-1]) + 1}",
                GradwidgetWarning,
            )
            user_step = int(run.steps[-1]) + 1
        run.append(user_step, values, {"loss": loss, "lr": lr, "global_norm": global_norm}, hist, complete=complete)
        assert self._order is not None  # set by the first step, before any is appended
        ctx = StepContext(user_step, values, self.note_meta, training_loss, skipped, self._stats.ordered, self._order)
        for probe in self._probes:
            probe.on_step(ctx)
        self._warn_window()
        if self._unused_cols:
            self._adopt_late_layers(values)
        if self._watch is not None:
            if np.isnan(values[_M["nonfinite"]]).all():
                self._watch.no_gradient(user_step, self._reset_check)
            woke = self._watch.woken(values, _M["nonfinite"], run, self._stats.ordered)
            if woke:  # unfrozen: trainable from now on, with update norms
                self._make_trainable(woke)
                self._plan_optimizer()
                if self._writer is not None:
                    self._writer.write_meta()

    def _inert_step(self, optimizer, args, kwargs) -> None:
        """A DDP rank other than 0 (which records nothing): the probes' ``every_step``, and on the
        steps rank 0 records their ``elsewhere`` (the NaN probe looks for this rank's origin and
        posts it); the hook goes once no probe needs it."""
        step_no, self._count = self._count, self._count + 1
        pend, self._pending = self._pending, {}
        recorded = step_no % self.every == 0
        for probe in self._probes:
            probe.every_step(pend.get("step", step_no), pend.get("loss"), False, recorded)
        if recorded:
            for probe in self._probes:
                probe.elsewhere()
        if not any(probe.needs_steps for probe in self._probes):  # nothing more to do on this rank
            for h in self._handles:
                h.remove()
            self._handles = []

    # ------------------------------------------------------------------ sharded (FSDP) steps
    def _begin_sharded_step(self, step_no: int, with_hist: bool, before_update: bool) -> None:
        """Every rank computes partial sums over its shards; with an update to measure, the one
        collective waits for the optimizer step post-hook so the update's partials ride along."""
        measure = before_update and self._updates.due(self._recorded)
        pend, self._pending = self._pending, {}
        self._recorded += 1
        dist = self._dist
        assert dist is not None
        partials = dist.local_partials(self._params, with_hist, self._queue_probes)
        self._dist_step = ShardedStep(step_no, pend, partials, measure)
        if measure:
            self._updates.take()
            return
        self._end_sharded_step()

    def _queue_probes(self, pack: HostCopy) -> None:
        """Every probe's tensors into a recorded step's host copy (``Probe.queue``)."""
        for probe in self._probes:
            probe.queue(pack)

    def _end_sharded_step(self) -> None:
        st, self._dist_step, dist = self._dist_step, None, self._dist
        assert st is not None and dist is not None
        reduced = dist.reduce(st.partials)
        if reduced is None:  # not rank 0: rank 0 records and writes
            for probe in self._probes:
                probe.elsewhere()
            return
        values, hist = dist.statistics(*reduced, self._updates.cols, st.measure)
        self._append_step(st.step_no, st.pend, values, hist)  # its probes look for a NaN origin
        self._finish_step()

    def _store_edges(self) -> None:
        """The layer edges a capture found, into the run (a capture after the first step: a late layer)."""
        if self.run is not None:
            self.run.edges = np.asarray(self._graph.layer_edges(self._order, self._names), np.int32).reshape(-1, 2)
            if self._writer is not None:
                self._writer.write_meta()

    def _adopt_late_layers(self, values: np.ndarray) -> None:
        """A layer marked unused at the first step that now has a gradient becomes trainable, placed
        after the layers of the first backward (its real arrival order was not observed), and the
        next forward is captured for its edges; the run directory's meta is rewritten."""
        has = ~np.isnan(values[_M["nonfinite"]])
        late = [c for c in self._unused_cols if has[c]]
        if not late:
            return
        self._unused_cols = [c for c in self._unused_cols if not has[c]]
        self._make_trainable(late)
        self._graph.capture_late()
        if self._writer is not None:
            self._writer.write_meta()

    def _make_trainable(self, cols: list[int]) -> None:
        """Columns that start having a gradient after the first step (a late layer, an unfrozen one)
        become trainable, placed after the layers seen so far in the backward order (their real
        arrival was not observed); their modules' edges are wanted from the next forward."""
        run, order = self.run, self._order
        assert run is not None and order is not None  # only the recording rank, after the first step
        nxt = 1 + max(layer.backward_index for layer in run.layers)
        for k, c in enumerate(cols):
            run.layers[c].status, run.layers[c].backward_index = "trainable", nxt + k
            self._graph.wanted.add(_module_of(self.model, self._names[order[c]])[0])

    def _finish_step(self) -> None:
        run = self.run
        if run is None:  # (never: only the process that holds the run finishes steps)
            return
        run.complete_last()
        if self._writer is not None:
            self._writer.append_new()
            self._meta.step_end(self._writer)
        for fn in list(self.on_step):
            try:
                fn(run)
            except Exception as e:  # noqa: BLE001 - a display callback must never stop training
                warnings.warn(f"gradwidget: an on_step callback failed: {e!r}", GradwidgetWarning)
