"""The gradient at two batch sizes, from what training already computes: the raw
material of the gradient noise scale (McCandlish et al. 2018, appendix A), with no extra backward.

- **Gradient accumulation** (one process): every backward between two optimizer steps adds one
  micro-batch's gradient to ``p.grad``. At the end of each backward one fused pass reads the
  accumulated gradient; the increment is measured where it costs least (a hook and a norm per
  parameter per backward would cost more than the recording itself on models of many small layers):
  small tensors of one shape are stacked (``_groups.Plan``) and their increment is the difference of
  the stack at the end and at the start of the backward (their hooks only say that a backward
  began, so that the start is read before any of them takes its gradient); a parameter with no
  gradient yet gets the increment as its gradient, read in that same end-of-backward pass; any
  other increment is reduced to its norm in the parameter's tensor hook, before it is added (it is
  gone after). A backward that adds nothing to ``.grad`` (``torch.autograd.grad``) is no
  micro-batch; one run inside another's node (reentrant activation checkpointing) is part of it.
- **DDP**: the increment is this rank's local gradient, before the all-reduce; the gradient read
  after DDP's end-of-backward callback is the synchronised one, over ``world_size`` times the batch.

Nothing is copied to the host here: a step's two ``(P,)`` vectors ride in the Recorder's packed
copy (``queue``/``take``), once per recorded step. With one batch size only (one backward per step
in one process) there is nothing to compare: ``"auto"`` then removes the hooks after
``ONE_SIZE_STEPS`` steps and notes it in ``run.meta["noise_scale"]``; ``Recorder.split_backward``
runs one step's backward in parts (the cheapest opt-in: the same examples, no extra backward).

The noise scale moves slowly (it grows as the loss falls), and the estimate is a moving average over
rows anyway: after its first ``NOISE_MIN_ROWS`` rows, taken at consecutive recorded steps so that the
first estimate comes as soon as it can, the probe measures one recorded step in ``every``
(``NOISE_EVERY`` by default), and on the others its hooks are switched off (``after_step``
decides for the next step; ``_hooks.TensorHooks``: a parameter's hook dict unhooked from
autograd, or a no-op in C in it where it holds other hooks). That divides its cost by ``every``
and leaves the estimate's precision as it was: the moving average spans the same number of rows,
each the same number as before, over more steps (docs/costs.md).

The batch size is the user's (``Recorder(batch_size=...)`` or ``rec.log(batch_size=...)``, the size
of one micro-batch) or, by default, the first dimension of the first tensor the model is called with
(a forward pre-hook on the root module), read at the start of each backward.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import FrameType
from typing import Any

import numpy as np
import torch
from torch import nn

from ..noise_series import NOISE_MIN_ROWS, NoiseSeries
from ._groups import Plan, grad_of
from ._hooks import Hook, TensorHooks
from ._kernels import HostCopy, acc_dtype, norms, stacked, stacked_norms, stored_values
from ._probe import Probe, StepContext

#: "auto" keeps its hooks this many steps; with one batch size on every one, it removes them (one:
#: accumulation shows at the first step, and the hooks then cost nothing in the steps NaN tracing's
#: "auto" times, nor stay on a model whose forward hooks a user counts)
ONE_SIZE_STEPS = 1

#: after its first ``NOISE_MIN_ROWS`` rows, the probe measures one recorded step in this many by default
#: (``Recorder(noise_every=...)``; 1 measures every step). A measured step of two micro-batches
#: costs about 6% of a small model's step on CPU and more on a GPU (a norm launched per tensor per
#: backward): one in 8 keeps the probe's average within the 2% of a step the product leaves an
#: optional instrument (``_trace_cost.INSTRUMENT_SHARE``; the figures: docs/costs.md), at the
#: price of a moving average over twice as many steps
NOISE_EVERY = 8

#: what ``run.meta["noise_scale"]["one_size"]`` says when only one batch size is seen
ONE_SIZE_TEXT = (
    "only one batch size was seen (one backward per optimizer step, in one process), so the gradient "
    "noise scale cannot be estimated from it; run one step in N with "
    "recorder.split_backward(loss_fn, *batch) (the batch in two halves: the same examples, no extra "
    "backward; that step costs ~1.2-1.3x, docs/costs.md), or use gradient accumulation"
)


#: what ``run.meta["noise_scale"]["one_size"]`` says when each step's several backwards are of one
#: batch (losses of one forward: a multi-task loss, ``retain_graph``), not micro-batches
ONE_BATCH_TEXT = (
    "each optimizer step ran several backward passes over one batch (losses of one forward), which "
    "are not micro-batches of gradient accumulation: one batch size only, so the gradient noise "
    "scale cannot be estimated from it; run one step in N with recorder.split_backward(loss_fn, "
    "*batch), or use gradient accumulation"
)


#: what ``run.meta["noise_scale"]["unavailable"]`` says of a sharded model ({kind}: FSDP's or tensor
#: parallelism's): a backward's increment reaches the sharded gradient already summed over the ranks,
#: and no hook sees it apart from the accumulated one
SHARDED_TEXT = (
    "the gradient noise scale is not measured under {kind}: its sharded gradients arrive already "
    "reduced over the ranks, where no hook sees one micro-batch's gradient apart from the "
    "accumulated one; DDP (or one process with gradient accumulation) measures it"
)


@dataclass
class NoiseStep:
    """One step's device vectors, before its host copy: the sum over its backwards of each
    increment's squared norm, and the accumulated gradient's squared norm (per parameter)."""

    incr_sq: torch.Tensor
    acc_sq: torch.Tensor
    k: int  # backwards (micro-batches) in the step
    sizes: list[int | None]  # their batch sizes (None where unknown)
    seen: np.ndarray  # parameters that received a gradient
    handle: tuple | None = None


def first_dim(args, kwargs) -> int | None:
    """The batch size a model is called with: the first dimension of its first tensor argument."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor) and a.ndim >= 1:
            return int(a.shape[0])
    return None


def _shaped(p: torch.Tensor) -> torch.Tensor | None:
    """What a stack is planned from: the parameter, unless a lazy module has not shaped it yet."""
    return None if nn.parameter.is_lazy(p) else p.detach()


#: the Python frame of an autograd Function's backward: a backward that ends while one is on the
#: stack ran inside a node of another backward (reentrant checkpointing)
_FUNCTION_BACKWARD = torch.autograd.function.BackwardCFunction.apply.__code__


def _inside_a_backward() -> bool:
    """Whether this runs inside an autograd Function's backward (a nested graph task)."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if f.f_code is _FUNCTION_BACKWARD:
            return True
        f = f.f_back
    return False


def _norm(g: torch.Tensor) -> torch.Tensor:
    """One gradient's L2 norm, a 0-d tensor left on its device (no host sync)."""
    v = stored_values(g.detach())
    return torch.linalg.vector_norm(v, 2, dtype=acc_dtype([v]))


def _vector(values: list, dev: torch.device) -> torch.Tensor:
    """Norms from hooks (0-d tensors from ``_norm``, left on their device: no host sync) as one
    float64 vector on ``dev``."""
    return torch.stack([torch.as_tensor(n).to(dev, torch.float64) for n in values])


@dataclass
class _Backward:
    """What one backward's hooks saw: the parameters, the fresh ones (no gradient before it) and
    the others' increment norms."""

    seen: list[int] = field(default_factory=list)
    fresh: list[int] = field(default_factory=list)
    incr: list[tuple[int, torch.Tensor]] = field(default_factory=list)


class NoiseProbe(Probe):
    """Hooks that see each backward's gradient increment and the accumulated gradient of ``params``."""

    # this step's state (``_reset_step``): what this backward's hooks saw (``_Backward``); per
    # step, the sums over its backwards
    _now: _Backward
    _starts: list[torch.Tensor | None]
    _incr_sq: torch.Tensor | None
    _acc_sq: torch.Tensor | None
    _k: int
    _sizes: list[int | None]
    _seen: set[int]
    _first_seen: int | None  # a parameter this step's first backward reached
    _forwards_at_begin: int  # forwards counted when this backward began
    _last_forwards: int | None  # forwards counted when the step's last micro-batch began
    _one_batch: bool  # two of this step's backwards began with no forward between them
    _told: bool  # every backward of this step had its batch size told (``Recorder.log``)
    _lost: bool  # an increment this step was not measured (a stack that failed): no row

    def __init__(
        self,
        model: nn.Module,
        params: list[torch.Tensor],
        batch_size: int | None,
        world_size: int = 1,
        mode="auto",
        every: int = NOISE_EVERY,
        *,
        record_every: int = 1,
        run: Callable[[], Any] = lambda: None,
        also_measure: Callable[[], bool] = lambda: False,
    ) -> None:
        self.params, self.world_size, self.mode, self.every = params, world_size, mode, every
        # the Recorder's: one step in ``record_every`` is recorded, ``run()`` the run the rows go to
        # (None before the first step, and off the recording rank), ``also_measure()`` whether the
        # next step is measured whatever the cadence (while the NaN tracer's cost is weighed, its
        # pairs of steps carry this probe's work on both sides)
        self._record_every, self._run, self._also_measure = record_every, run, also_measure
        self._step: NoiseStep | None = None  # the step being recorded: its vectors, in the host copy
        self._copy: HostCopy | None = None
        self._hooks = TensorHooks()  # switched off while not ``measuring``
        self.rows = 0  # steps measured at two batch sizes so far (``due``)
        self.fixed_batch = batch_size
        self.user_batch: int | None = None  # rec.log(batch_size=...): this step's micro-batch size
        self.input_batch: int | None = None
        self.source = "argument" if batch_size is not None else "input"
        self._model = model
        self._fwd_handle: Any = None
        self._forwards = 0  # training forwards of the root module seen (while its hook is on)
        self._indices: dict = {}
        self._one_size = 0  # consecutive steps with one batch size ("auto")
        self.one_size_note: str | None = None
        # in one process the small parameters of one shape are stacked: their increment is the
        # difference of the stack at the end and at the start of the backward (no work in their
        # hooks, one kernel for thousands of them). Under DDP the all-reduce writes the averaged
        # gradient into p.grad before the end of the backward, so every increment is reduced in its hook
        self._plan = Plan(params, _shaped) if world_size == 1 else None
        # Every parameter keeps its hook, a stacked one's only to say that a backward began: the
        # stack's start must be read before any of its members takes this backward's gradient, and
        # whichever parameter a backward reaches first may be one (a final LayerNorm's weight
        # among the blocks' norms; inside a checkpointed block). Without them, 2,000 Linear(2, 2)
        # step 12% faster and GPT-2's final norm read wrong.
        self._stacked = np.zeros(len(params), bool)
        for cols, _ in self._plan.stacks if self._plan is not None else ():
            self._stacked[cols] = True
        self._rest = [c for c in range(len(params)) if not self._stacked[c]]
        self._zeros: list[torch.Tensor] = []  # one per stack, for a member without a gradient
        self._reset_step()
        self._in_bwd = False
        self._open: set[int] = set()  # graph tasks of this backward whose end is still to come
        self.armed = self._once = False
        self.arm()

    # ------------------------------------------------------------------ hooks
    def arm(self, once: bool = False) -> None:
        """Install the hooks (again, for one step of ``split_backward`` after "auto" removed them)."""
        if self.armed:
            return
        self._once = once
        self.armed = True
        for i, p in enumerate(self.params):
            if p.requires_grad and not nn.parameter.is_lazy(p):  # a lazy module's: no tensor to hook yet
                self._hooks.add(p, partial(self._grad, i))
        if self.mode is True or self.world_size > 1 or self.two_sizes_seen:
            self._watch_input()

    def _watch_input(self) -> None:
        """Count the model's training forwards and read the batch size off its input, unless it
        was given (a forward pre-hook on the root module). "auto" installs it once two batch sizes
        are seen, not before: a hook added and removed again would make ``torch.compile`` compile
        the forward twice. With it on, a backward that began with no forward since the step's
        previous one is a second loss of one batch, not a micro-batch (``_finish``)."""
        if self._fwd_handle is None:
            self._fwd_handle = self._model.register_forward_pre_hook(Hook(self._forward), with_kwargs=True)

    def due(self, recorded: int) -> bool:
        """Whether recorded step number ``recorded`` is one to measure: each of them until the
        probe holds ``NOISE_MIN_ROWS`` rows (the first estimate), then one in ``every``."""
        return self.rows < NOISE_MIN_ROWS or recorded % self.every == 0

    def continues(self, run) -> None:
        """Resuming ``run``: its rows count with the ones measured since, so a run that has its first
        estimate goes on at one recorded step in ``every`` rather than measuring its first rows again."""
        if run.noise is not None:
            self.rows += len(run.noise)

    @property
    def measuring(self) -> bool:
        """Whether this step is measured (set by the Recorder at each step's end for the next one:
        one recorded step in ``every``): the hooks of an unmeasured step are switched off."""
        return self._hooks.on

    @measuring.setter
    def measuring(self, value: bool) -> None:
        self._hooks.on = value

    def close(self) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        self._hooks.remove()
        if self._fwd_handle is not None:
            self._fwd_handle.remove()
        self.armed, self._fwd_handle = False, None
        self._reset_step()

    def _forward(self, module, args, kwargs) -> None:
        if torch.is_grad_enabled():  # an evaluation under no_grad is no training batch
            self._forwards += 1
            if self.fixed_batch is None:
                self.input_batch = first_dim(args, kwargs)

    def _begin_backward(self, i: int) -> None:
        if self._k and self._first_seen is not None and self.params[self._first_seen].grad is None:
            # zero_grad (set_to_none) between two backwards of one step: what the earlier ones
            # brought is gone from the gradient the step uses, so they are no part of its sizes
            self._reset_step()
        self._in_bwd = True
        g = self.params[i].grad
        self._witness = (i, g, None if g is None else g._version)
        self._sizes.append(self._batch_now())
        self._told = self._told and self.user_batch is not None
        self._forwards_at_begin = self._forwards
        if self._k == 0:  # the stacks as the step found them (zeroed or not): the first start
            self._starts = [self._stack(j) for j in range(len(self._stack_plan()))]

    def _enter_task(self, task: int, i: int) -> None:
        """A hook ran in graph task ``task`` for the first time. One backward can run several:
        reentrant activation checkpointing (``use_reentrant=True``, long the default of PyTorch and
        transformers) runs a backward inside a node of the outer one, and whichever of them ends
        first must not end the micro-batch. A task started after every task of this backward ended, not from inside
        another's node, is the next backward: the one before it is finished first (nothing of the
        new one has been added yet)."""
        if self._in_bwd and not self._open and task > self._last_task and not _inside_a_backward():
            self._finish()
        if not self._in_bwd:
            self._begin_backward(i)
        self._open.add(task)
        self._last_task = max(self._last_task, task)
        torch.autograd.Variable._execution_engine.queue_callback(partial(self._task_end, task, True))

    def _task_end(self, task: int, first: bool) -> None:
        """Graph task ``task`` ended (its final callback). The backward ends with the last of its
        tasks, unless this one ran inside another backward's node: then the outer one goes on, and
        its own end (queued when one of its hooks runs), the next backward or the step finishes it."""
        if self.world_size > 1 and first:
            # DDP queues its own end-of-backward callback (finishing the all-reduce) after ours:
            # run once more behind it, so the synchronised gradient is read
            torch.autograd.Variable._execution_engine.queue_callback(partial(self._task_end, task, False))
            return
        self._open.discard(task)
        if self._in_bwd and not self._open and not _inside_a_backward():
            self._finish()

    def _grad(self, i: int, g: torch.Tensor) -> None:
        """Parameter ``i``'s increment ``g`` (the hook runs for every parameter in every backward:
        kept short). A stacked one is measured at the end of the backward; one without a gradient
        yet (one process) will have ``g`` as its gradient, measured at the end of the backward
        (``_finish``); any other is reduced to its norm now (``g`` is gone once it is added). Not
        called while not ``measuring``."""
        task = torch._C._current_graph_task_id()
        if task not in self._open:
            self._enter_task(task, i)
        now = self._now
        now.seen.append(i)
        if self._stacked[i]:
            return
        acc = self.params[i].grad
        if self.world_size > 1:
            now.incr.append((i, _norm(g)))
            return
        if acc is None:
            now.fresh.append(i)
            return
        now.incr.append((i, _norm(g)))

    def _batch_now(self) -> int | None:
        if self.user_batch is not None:
            return self.user_batch
        return self.fixed_batch if self.fixed_batch is not None else self.input_batch

    def _stack_plan(self) -> list:
        return self._plan.stacks if self._plan is not None else []

    def _stack(self, j: int) -> torch.Tensor | None:
        """Stack ``j``'s gradients now as the rows of one matrix (a member without one as zeros);
        None when none has one. A stack that cannot be made (a sparse gradient, a parameter
        resized) ends stacking for good: its parameters are measured in their hooks from then on."""
        owners = self._plan.stacks[j][1] if self._plan is not None else []
        grads = list(map(grad_of, owners))
        missing = [g is None for g in grads]
        if all(missing):
            return None
        try:
            if any(missing):
                if j >= len(self._zeros):
                    self._zeros = [torch.zeros_like(ow[0]).detach() for _, ow in self._stack_plan()]
                grads = [self._zeros[j] if g is None else g for g in grads]
            return stacked(grads)
        except (TypeError, RuntimeError):
            self._unstack()
            return None

    def _unstack(self) -> None:
        self._lost = True
        self._plan = None
        self._stacked[:] = False  # every increment measured in its hook from now on
        self._rest = list(range(len(self.params)))
        self._starts = []

    def _finish(self) -> None:
        """The end of one backward (one micro-batch): measure what it added (the fresh parameters'
        increment is their gradient) and the gradients it leaves."""
        self._in_bwd = False
        self._open = set()
        now, self._now = self._now, _Backward()
        if not now.seen or not self._accumulated():
            return
        # forwards counted (a model whose own forward runs), sizes not told backward by backward
        # (a trainer's callback, which knows its micro-batches): a micro-batch is one forward's
        if self._fwd_handle is not None and self._forwards and not self._told:
            if self._forwards_at_begin == self._last_forwards:
                self._one_batch = True
            self._last_forwards = self._forwards_at_begin
        self._seen.update(now.seen)
        if self._first_seen is None:
            self._first_seen = now.seen[0]
        with torch.no_grad():
            grads = list(map(grad_of, self.params))
            dev = next(g for g in grads if g is not None).device
            acc: list[tuple[list[int], torch.Tensor]] = []
            incr: list[tuple[list[int], torch.Tensor]] = []
            ends = [self._stack(j) for j in range(len(self._stack_plan()))]
            for (cols, _), start, end in zip(self._stack_plan(), self._starts, ends):
                if end is not None:
                    a = stacked_norms(end)
                    acc.append((cols, a))
                    incr.append((cols, a if start is None else stacked_norms(end - start)))
            self._starts = ends
            cols = [c for c in self._rest if grads[c] is not None]
            if cols:
                a = norms([stored_values(grads[c]) for c in cols])
                acc.append((cols, a))
                at = {c: k for k, c in enumerate(cols)}
                if now.fresh:  # a fresh parameter's increment is its gradient
                    incr.append((now.fresh, a[self._index([at[c] for c in now.fresh], a.device)]))
            if now.incr:
                incr.append(([i for i, _ in now.incr], _vector([n for _, n in now.incr], dev)))
            step_incr = self._squares(incr, dev)
            self._incr_sq = step_incr if self._incr_sq is None else self._incr_sq.add_(step_incr)
            self._acc_sq = self._squares(acc, dev)
        self._k += 1

    two_sizes_seen = False
    _last_task = -1  # the newest graph task a hook ran in
    _witness: tuple = (0, None, None)

    def _accumulated(self) -> bool:
        """Whether this backward added to ``.grad``: not ``torch.autograd.grad`` (a gradient penalty,
        a reference computed apart), whose gradients fire the hooks and go nowhere. Asked of the
        parameter that began it: its gradient is a new tensor or was added to in place. If not,
        the backward is no micro-batch: forgotten."""
        i, before, version = self._witness
        g = self.params[i].grad
        if g is not None and (g is not before or g._version != version):
            return True
        self._sizes.pop()
        return False

    def _squares(self, parts: list[tuple[list[int], torch.Tensor]], dev: torch.device) -> torch.Tensor:
        """The squares of the norms of ``parts`` (columns, norms) summed into a ``(P,)`` float64
        vector, zero elsewhere: one concatenation and one indexed add (a column twice, as the
        first backward's increment beside the second's, gets both)."""
        out = torch.zeros(len(self.params), dtype=torch.float64, device=dev)
        if parts:
            cols = [c for part, _ in parts for c in part]
            norms = torch.cat([n.to(dev, torch.float64) for _, n in parts])
            out.index_add_(0, self._index(cols, dev), norms.square())
        return out

    def _index(self, idx, dev: torch.device) -> torch.Tensor:
        """``idx`` as an index tensor on ``dev``, made once per distinct list (the arrival order
        repeats from backward to backward): a host-to-device copy is a host sync on CUDA."""
        key = (tuple(idx), dev)
        t = self._indices.get(key)
        if t is None:
            if len(self._indices) > 64:  # a model whose set of gradients keeps changing
                self._indices.clear()
            t = self._indices[key] = torch.tensor(key[0], device=dev)
        return t

    @property
    def keeps_rows(self) -> bool:
        """Whether the run will get a noise row a step (for the memory window): hooked and either
        told to (``True``) or already seen two batch sizes ("auto" decides at the first step)."""
        return self.armed and (self.mode is True or self.two_sizes_seen)

    # ------------------------------------------------------------------ steps
    def _reset_step(self) -> None:
        self._now = _Backward()
        self._starts = []
        self._lost = False
        self._incr_sq = self._acc_sq = None
        self._k = 0
        self._sizes, self._seen = [], set()
        self._first_seen = None
        self._forwards_at_begin = 0
        self._last_forwards = None
        self._one_batch = False
        self._told = True

    def end_step(self) -> NoiseStep | None:
        """Close this optimizer step: its vectors when it saw two batch sizes, else None (and, in
        "auto", after ``ONE_SIZE_STEPS`` such steps in a row, the hooks are removed)."""
        if self._in_bwd and not self._open:  # a backward whose last task ran inside another's node
            self._finish()
        k, incr, acc, sizes, seen = self._k, self._incr_sq, self._acc_sq, self._sizes, self._seen
        lost, one_batch, told = self._lost, self._one_batch, self._told
        counted = self._fwd_handle is not None
        self._reset_step()
        self.user_batch = None
        if self._once:  # armed for one split step only (its parts are micro-batches by construction)
            self._uninstall()
        if k == 0 or incr is None or acc is None or lost:
            return None
        if k * self.world_size < 2 or one_batch:
            self._one_size += 1
            # "auto" gives up only before it measured a row: a later step of one backward (an
            # epoch's last, short accumulation) is no reason to stop measuring
            if self.mode == "auto" and self._one_size >= ONE_SIZE_STEPS and not self.rows:
                self.one_size_note = ONE_BATCH_TEXT if one_batch else ONE_SIZE_TEXT
                self._uninstall()
            return None
        self.two_sizes_seen = True
        if not counted and not told and not self._once and self.world_size == 1:
            # "auto"'s first step of several backwards: whether each had a batch of its own is
            # known only with the forwards counted, from the next step on; no row for this one
            if self.armed:
                self._watch_input()
            return None
        self._one_size = 0
        self.rows += 1
        mask = np.zeros(len(self.params), bool)
        mask[list(seen)] = True
        return NoiseStep(incr, acc, k, list(sizes), mask)

    # ------------------------------------------------------------------ the probe's steps
    def every_step(self, label: int, loss, skipped: bool, recorded: bool) -> None:
        """Close this step (its vectors kept for the recording, if it is recorded)."""
        st = self.end_step()
        self._step = st if recorded else None

    def after_step(self, step: int) -> None:
        """Switch the hooks on for the next step if it is one to measure (``due``)."""
        n, every = step + 1, self._record_every
        self.measuring = (n % every == 0 and self.due(n // every)) or self._also_measure()

    def queue(self, pack: HostCopy) -> None:
        """Put the recorded step's two vectors in the recorder's packed host copy."""
        st = self._step
        if st is not None:
            st.handle = pack.add(torch.stack([st.incr_sq, st.acc_sq]))
            self._copy = pack

    def on_step(self, ctx: StepContext) -> None:
        """Add the step's row (if it saw two batch sizes) to ``run.noise``, and keep
        ``run.meta["noise_scale"]`` saying how the sizes were seen (in the folder at once)."""
        st, pack, self._step, self._copy = self._step, self._copy, None, None
        run = self._run()
        if run is None:
            return
        row = self.row(st, pack, ctx.order) if st is not None and pack is not None else None
        if row is not None:
            if run.noise is None:
                run.noise = NoiseSeries(run.n_layers, run.max_steps)
            run.noise.append(ctx.step, *row)
        meta = self.meta()
        if (row is not None or self.one_size_note is not None) and run.meta.get("noise_scale") != meta:
            ctx.note_meta({"noise_scale": meta}, True)

    def tell_batch(self, size: int, source: str = "log") -> None:
        """The examples in each of this step's micro-batches, as the user said (``source``: how)."""
        self.user_batch, self.source = size, source

    def split(self, loss_fn, batch: tuple, parts: int) -> torch.Tensor:
        """This step's forward and backward in ``parts`` slices (``Recorder.split_backward``),
        measured whatever the cadence."""
        self.arm(once=not self.armed)
        self.measuring = True
        return split_backward(loss_fn, batch, parts, lambda n: self.tell_batch(n, "split_backward"))

    def row(self, st: NoiseStep, pack: HostCopy, order: list[int]) -> tuple[float, float, int, np.ndarray, np.ndarray]:
        """``(b_small, b_big, n_small, small_sq, big_sq)`` in column ``order``, after the copy.
        The big gradient is the accumulated one divided by the number of increments, so both are in
        the units of one micro-batch's gradient, whatever the loss was divided by."""
        assert st.handle is not None  # queued before the copy
        incr, acc = pack.get(st.handle)
        small = incr / st.k
        big = acc / (st.k * st.k)
        small[~st.seen], big[~st.seen] = np.nan, np.nan
        known = [b for b in st.sizes if b is not None]
        b_small = float(np.mean(known)) if len(known) == len(st.sizes) and known else math.nan
        b_big = b_small * st.k * self.world_size
        return b_small, b_big, st.k * self.world_size, small[order], big[order]

    def meta(self) -> dict:
        """What ``run.meta["noise_scale"]`` says about how the two sizes were seen."""
        out = {
            "batch_size": self.source,
            "two_sizes": "ddp and accumulation" if self.world_size > 1 else "accumulation",
            "world_size": self.world_size,
            "every": self.every,
            "first": NOISE_MIN_ROWS,
        }
        if self.one_size_note is not None:
            out["one_size"] = self.one_size_note
        return out


def split_backward(loss_fn, batch: tuple, parts: int = 2, sizes=None) -> torch.Tensor:
    """Forward and backward ``loss_fn(*batch)`` in ``parts`` equal slices along the first dimension,
    each loss divided by ``parts``: for a loss averaged over the batch, the gradient one backward of
    the whole batch gives (up to layers that mix examples, such as BatchNorm in training mode), seen
    at two batch sizes. ``sizes(n)`` is told each part's size before its backward. Returns the whole
    batch's loss (detached)."""
    n = first_dim(batch, {})
    if n is None or n < parts:
        raise ValueError(f"split_backward needs a batch of at least {parts} examples along the first dimension")
    total = None
    for idx in torch.arange(n).tensor_split(parts):
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        piece = tuple(a[lo:hi] if isinstance(a, torch.Tensor) and a.ndim >= 1 and a.shape[0] == n else a for a in batch)
        loss = loss_fn(*piece) / parts
        if sizes is not None:
            sizes(hi - lo)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    assert total is not None
    return total
