"""Where the first NaN/Inf began, as one probe of the Recorder: the per-module tracer
(``nonfinite``), the replay of the first non-finite step (``_replay``) and the meter that decides
whether ``trace_nonfinite="auto"`` keeps the tracer (``_trace_cost``), with their hooks, their
state, their cadence and their notes in the run.

- ``trace_nonfinite=True``: the tracer's hooks on every module, every step, until an origin is found.
- ``"auto"``: the replay's two hooks on the root module; the tracer on alternate warm-up steps
  while its cost is measured, kept only where it is free. Under ``torch.distributed`` "auto" keeps
  the tracer on every step (the ranks would decide apart) and has no replay.
- ``False``: nothing; the probe only says so.

Under ``torch.distributed`` every rank traces its own steps and posts its origin; rank 0 keeps the
earliest (``distributed.OriginExchange``). Once an origin is found, or the replay gives up (said in
``run.meta["nonfinite_tracing"]``), its hooks come off. Private to ``gradwidget.collect``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from ..run import NonfiniteOrigin, Run
from ._probe import Probe, StepContext
from ._replay import MAX_MISSES, StepReplay
from ._stats import _M
from ._trace_cost import PairedMeter, TraceCost
from .nonfinite import NonfiniteTracer

if TYPE_CHECKING:
    from ._kernels import HostCopy
    from .distributed import DistContext


class NonfiniteProbe(Probe):
    """The NaN tracing of one Recorder (see the module docstring). ``mode``: its
    ``trace_nonfinite``; ``dist``: the process group's context (None in one process); ``tracer``:
    whether this process traces at all (a DDP rank other than 0 does only with an optimizer);
    ``run()``: the run being recorded (None before the first step, and on ranks other than 0);
    ``write_meta()``: write the run's meta to its folder now; ``every``: the Recorder's."""

    def __init__(
        self,
        model: nn.Module,
        mode: bool | str,
        *,
        run: Callable[[], Run | None],
        write_meta: Callable[[], None],
        dist: DistContext | None = None,
        tracer: bool = True,
        every: int = 1,
    ) -> None:
        self.mode = mode
        self._model, self._dist, self._every = model, dist, every
        self._run, self._write_meta = run, write_meta
        auto = mode == "auto" and dist is None
        #: distributed: where the ranks' origins meet
        self._exchange = dist.origin_exchange() if dist is not None and mode else None
        # "auto": the origin by replaying the first non-finite step
        self._replay: StepReplay | None = StepReplay(model) if auto else None
        # "auto": the tracer's cost is measured (not under torch.distributed: the ranks would decide apart)
        self._meter: PairedMeter | None = PairedMeter() if auto else None
        self._tracer: NonfiniteTracer | None = NonfiniteTracer(model) if mode and tracer else None
        self._off: dict | None = None  # why tracing stopped with no origin, for run.meta
        self._measured: TraceCost | None = None  # the cost "auto" decided on

    # ------------------------------------------------------------------ what others may read
    @property
    def tracer(self) -> NonfiniteTracer | None:
        """The per-module tracer while it looks (None once an origin is found or it was taken off)."""
        return self._tracer

    @property
    def replay(self) -> StepReplay | None:
        """The replay while it waits for a non-finite step ("auto", one process)."""
        return self._replay

    @property
    def meter(self) -> PairedMeter | None:
        """The meter while "auto" measures what the tracer costs (None once decided)."""
        return self._meter

    @property
    def measured(self) -> TraceCost | None:
        """The tracer's cost "auto" decided on."""
        return self._measured

    @property
    def weighing(self) -> bool:
        """Whether the tracer's cost is being measured (the steps alternate with and without it)."""
        return self._meter is not None

    @property
    def looking(self) -> bool:
        """Whether this process still traces its steps."""
        return self._tracer is not None

    # ------------------------------------------------------------------ the probe's steps
    def every_step(self, label: int, loss, skipped: bool, recorded: bool) -> None:
        if self._tracer is not None:
            self._tracer.end_step(label, loss, skipped=skipped)
        if not recorded and self._replay is not None:
            self._replay.clear()  # a step not recorded is not replayed: its gradients are not read

    def queue(self, pack: HostCopy) -> None:
        if self._tracer is not None:
            self._tracer.queue(pack)

    def on_step(self, ctx: StepContext) -> None:
        self.find(ctx.values, ctx.weights)
        self._replay_origin(ctx)

    def elsewhere(self) -> None:
        self.find(None)  # this rank's own origin, posted for the rank that records

    @property
    def needs_steps(self) -> bool:
        return self.looking

    def close(self) -> None:
        if self._exchange is not None and self._run() is not None:
            self.find(None)  # take what other ranks posted since the last recorded step
        self.stop()

    def stop(self) -> None:
        """Take the tracer's and the replay's hooks off (an origin found, one found before a resume,
        or the recorder detached)."""
        if self._tracer is not None:
            self._tracer.remove()
            self._tracer = None
        if self._replay is not None:
            self._replay.remove()
            self._replay = None

    # ------------------------------------------------------------------ the origin, traced
    def find(self, values: np.ndarray | None, weights: list[torch.Tensor] | None = None, recorded: bool = True) -> None:
        """Look in the steps traced since the last recorded one for the first NaN/Inf's origin;
        once found, remove the tracer's hooks and keep the origin in the run (and its folder).
        Distributed: every rank posts its own and rank 0 keeps the earliest. ``values``: this
        step's recorded metrics (None on ranks that do not hold the run); ``weights``: the recorded
        parameters in column order; ``recorded``: the traced steps end at a recorded step."""
        origin = None
        run = self._run()
        if self._tracer is not None:
            traces = self._tracer.take()
            if traces:
                reached, current = None, traces[-1].step
                if run is not None and values is not None:
                    bad = values[_M["nonfinite"]] > 0
                    names = [run.layers[c].name for c in np.flatnonzero(bad)[::-1]]  # nearest the loss first
                    reached = lambda s: names if s == current else None  # noqa: E731
                module_of = _module_of(run) if run is not None else None
                origin = self._tracer.origin(traces, reached, module_of)
                spoiled = self.mode == "auto" and origin is not None and origin.step == current
                if spoiled and _weights_nonfinite(values, weights):
                    origin = None  # made by weights a step not traced had spoiled ("auto"): not its origin
            if origin is not None:
                self._tracer.remove()
                self._tracer = None
                if recorded and run is not None and origin.step == current:
                    origin.step = int(run.steps[-1])  # the step as recorded
                if self._exchange is not None:
                    from .distributed import clean_name, type_name

                    assert self._dist is not None  # an exchange is made only under torch.distributed
                    origin.module_type = type_name(self._model.get_submodule(origin.module))  # FSDP's classes
                    origin.module, origin.rank = clean_name(origin.module), self._dist.rank
                    self._exchange.post(origin.to_dict())
        if run is None:
            return
        self._note_off(run)
        if self._exchange is not None:
            from ._origin import earliest

            origin = earliest([NonfiniteOrigin.from_dict(d) for d in self._exchange.gather()])
        if origin is not None and origin != run.nonfinite_origin:
            run.nonfinite_origin = origin
            self._write_meta()

    # ------------------------------------------------------------------ the origin by replay ("auto")
    def _replay_origin(self, ctx: StepContext) -> None:
        """On the first recorded step whose gradients or loss are non-finite, replay it under a
        tracer before the optimizer applies it (``_replay``)."""
        rp, run = self._replay, self._run()
        if rp is None or run is None:
            return
        values, loss = ctx.values, ctx.loss
        bad = values[_M["nonfinite"]] > 0
        if run.nonfinite_origin is not None or not (bad.any() or (loss is not None and not np.isfinite(loss))):
            rp.clear()
            return
        step = int(run.steps[-1])
        if _weights_nonfinite(values, ctx.weights):
            why = "the weights were already non-finite: the NaN began at a step not recorded"
            self._stop_replay(run, step, why + (f" (every={self._every})" if self._every > 1 else ""))
            return
        names = [run.layers[c].name for c in np.flatnonzero(bad)[::-1]]  # nearest the loss first
        origin, note = rp.origin(step, loss, ctx.skipped, names or None, _module_of(run))
        if origin is not None:
            run.nonfinite_origin = origin
            if note is not None:
                run.meta["nonfinite_tracing"] = {"stopped_at_step": step, "reason": note}
            self._write_meta()
            self.stop()  # found: no hook is left on any module
        elif rp.failed or not ctx.skipped:  # a step AMP's GradScaler skipped has no backward origin, by design: go on
            rp.misses += 1
            if rp.failed or rp.misses >= MAX_MISSES:
                self._stop_replay(run, step, note or "no origin was found")

    def _stop_replay(self, run: Run, step: int, why: str) -> None:
        """Take the replay's hooks off and say in the run why no origin was found."""
        if self._replay is not None:
            self._replay.remove()
            self._replay = None
        self._off = {"stopped_at_step": int(step), "reason": why}
        self._note_off(run)

    def _note_off(self, run: Run) -> None:
        """Put why tracing stopped into the run's meta (and its folder), once."""
        if self._off is None or "nonfinite_tracing" in run.meta:
            return
        run.meta["nonfinite_tracing"] = dict(self._off)
        self._write_meta()

    # ------------------------------------------------------------------ what tracing costs ("auto")
    def continues(self, run: Run) -> None:
        if "nonfinite_origin" in run.meta:  # found before the crash: neither tracer nor replay is needed
            self.stop()

    def after_step(self, step: int) -> None:
        """At the end of step ``step`` (recorded or not, last of its work: the meter's clock runs from
        the end of one step to the end of the next). During the warm-up, put the tracer's hooks on
        and off for alternate steps; once its cost is measured (``_trace_cost``), keep it only if it
        is free. Without it the first non-finite step is still replayed."""
        meter, tracer = self._meter, self._tracer
        if meter is None:
            return
        if tracer is None:  # it found the origin, and is gone
            self._meter = None
            return
        if meter.tracing and not tracer.step_calls:
            # hooks on, yet no module call traced: the model runs compiled (torch.compile traces the
            # hooks as nothing), and putting hooks on and off would recompile it. Left as they are.
            self._meter = None
            return
        cost = meter.end_step(step, tracer.step_calls)
        if cost is None:
            tracer.hooks_on() if meter.tracing else tracer.hooks_off()
            meter.restart()
            return
        self._meter, self._measured = None, cost  # measured: decided once
        if not cost.too_dear:
            tracer.hooks_on()
            return
        # the steps traced but not recorded yet (every > 1) still name an origin if they hold one
        self.find(None, recorded=False)
        if self._tracer is not None:
            self._tracer.remove()
            self._tracer = None

    def text(self) -> str:
        """How the NaN origin is looked for, and why, in words (``repr(recorder)``)."""
        mode = f"trace_nonfinite={self.mode!r}"
        measured = self._measured.text() if self._measured is not None else None
        run = self._run()
        if run is not None and run.nonfinite_origin is not None and self.mode:
            return "NaN tracing done (origin found)"
        if self._off is not None:
            return f"NaN origin not found ({mode}, step {self._off['stopped_at_step']}: {self._off['reason']})"
        if self._tracer is not None:
            if self._meter is not None:
                return f"NaN tracing on every module call while its cost is measured ({mode})"
            if self.mode == "auto" and self._dist is not None:
                return f"NaN tracing on ({mode}, kept on under torch.distributed: the ranks decide alike)"
            kept = f": {measured}, kept" if measured is not None else ": hooks on every module call, every step"
            return f"NaN tracing on ({mode}{kept})"
        if self._replay is not None:
            why = f"; per-module tracing off: {measured}" if measured is not None else ""
            return f"NaN origin by replaying the first non-finite step ({mode}{why})"
        return f"NaN tracing off ({mode})"


def _module_of(run: Run) -> Callable[[str], str]:
    """A layer's module path in ``run``."""
    return lambda layer: run.layers[run.layer_index(layer)].module


def _weights_nonfinite(values: np.ndarray | None, weights: list[torch.Tensor] | None) -> bool:
    """Whether a weight held a NaN/Inf at this recorded step (False where not known)."""
    if values is None or not weights:
        return False
    # a norm overflows float32 long before its entries do (entries of 1e20): look at those tensors
    suspect = np.flatnonzero(~np.isfinite(values[_M["weight_norm"]]))
    return any(not bool(torch.isfinite(weights[c]).all()) for c in suspect)
