"""When the Recorder records: gradient-arrival and optimizer hooks, steps an optimizer skipped
(AMP), one step's record into the Run, its NaN origin, and sharded (FSDP) steps.
"""

from __future__ import annotations

import functools
import sys
import warnings

import numpy as np
import torch

from .._warnings import GradwidgetWarning
from ._groups import grad_of
from ._inputs import _module_of
from ._kernels import norms, stored_values
from ._noise import NoiseProbe, append_noise
from ._probe import StepContext
from ._stats import _M
from ._state import ShardedStep, _RecorderState


class _Steps(_RecorderState):
    """The Recorder's step machinery (a mixin: the state is the Recorder's)."""

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

    _requeued = False
    _dist_step = None

    def _pre_step(self, optimizer, args, kwargs):
        if self._nested_step(sys._getframe(1)):
            return None
        if self._watch is not None:
            self._watch.own_step()
        self._stepped = self._in_step = True
        # args: (optimizer, *step's arguments), as the step wrapper passes them to its hooks
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if callable(closure):  # LBFGS: the step's gradient is made inside step(), by the closure
            return self._recording_closure(closure, args, kwargs)
        self._on_step(before_update=True)
        return None

    _closure_open = False  # a closure step not recorded yet (its closure has not run)

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
        assert opt is not None  # wrapped only with an optimizer
        original = opt.zero_grad
        self._own_zero_grad = opt.__dict__.get("zero_grad")  # an instance attribute to restore

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            if self._in_step or not self._attached:  # a closure's backwards belong to the step under
                return original(*args, **kwargs)  # way; a detached recorder still wrapped records nothing
            self._record_unstepped()
            out = original(*args, **kwargs)
            self._stepped, self._zero_mark = False, self._grad_mark()
            return out

        setattr(opt, "zero_grad", zero_grad)  # on the instance: the class's stays as it is
        self._zero_grad_wrapper = zero_grad

    def _unwrap_zero_grad(self) -> None:
        opt = self.optimizer
        wrapper = self._zero_grad_wrapper
        if opt is None or wrapper is None or opt.__dict__.get("zero_grad") is not wrapper:
            return  # never wrapped, or wrapped again by someone else since: leave theirs in place
        if self._own_zero_grad is None:
            del opt.zero_grad
        else:
            setattr(opt, "zero_grad", self._own_zero_grad)
        self._zero_grad_wrapper = None

    def _grad_mark(self) -> tuple:
        """Which gradient tensors exist and their in-place version counters: backward changes it
        (new tensors, or accumulation into zeroed ones), a second zero_grad does not. Taken at
        every zero_grad, so kept to one pass of C-level iteration over the parameters."""
        grads = list(map(grad_of, self._params))
        return tuple(map(id, grads)), tuple(g._version for g in grads if g is not None)

    def _record_unstepped(self) -> None:
        """Record the gradients of a backward that no optimizer step consumed: a step AMP's
        GradScaler skipped, which it does only for Inf/NaN gradients. Finite ones that zero_grad
        drops (``zero_grad()`` inside a gradient-accumulation loop) are no step: counted in
        ``run.meta["discarded_backwards"]``, not recorded as steps of their own."""
        if not self._stepped and self._grad_mark() != self._zero_mark:
            self._stepped = True
            if self._all_finite():
                self._discarded += 1
                if self.run is not None:
                    self.run.meta["discarded_backwards"] = self._discarded
                return
            self._on_step()

    def _all_finite(self) -> bool:
        """Whether every gradient is finite (one fused norm and one host read: only on a zero_grad
        that drops gradients no step used)."""
        grads = [stored_values(g) for g in map(grad_of, self._params) if g is not None]
        return not grads or bool(norms(grads).isfinite().all())

    _discarded = 0  # backwards whose finite gradients zero_grad dropped before any optimizer step

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

    _step_frame = None  # the frame of the step() call being recorded

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
            self._nonfinite.weigh(self._count - 1)  # last: its clock runs from the end of one step to the next

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
        self._noise_step = None
        if self._noise is not None:
            self._noise_step = self._noise.end_step()
            # the next step is measured if it is a recorded step the probe has ``due``, and every
            # step while "auto" times the NaN tracer (its pairs of steps then carry the probe's
            # work on both sides, whatever the cadence)
            due = self._count % self.every == 0 and self._noise.due(self._count // self.every)
            self._noise.measuring = due or self._nonfinite.weighing
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
        noise = self._noise_step  # the gradient at two batch sizes (``_noise``), in the same copy
        riders = [probe.queue for probe in self._probes]
        if noise is not None:
            riders.append(functools.partial(NoiseProbe.queue_step, noise))
        values, hist, loss, pack = self._stats.collect(with_hist, logged, tuple(riders))
        self._noise_row = self._noise.row(noise, pack, self._order) if noise is not None and self._noise else None
        if loss is not None:
            pend["loss"] = loss
        measure = before_update and self._updates.due(self._recorded)
        training_loss = None if outside else pend.get("loss")
        self._append_step(
            step_no, pend, values, hist, complete=not measure, training_loss=training_loss, skipped=skipped
        )
        if self._noise is not None:
            append_noise(self.run, self._writer, self._noise, self._noise_row)
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
        ctx = StepContext(user_step, values, self.note_meta, training_loss, skipped, self._stats.ordered)
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
        """A DDP rank other than 0 (which records nothing): end the traced step; on the steps
        rank 0 records, look for this rank's origin and post it."""
        step_no, self._count = self._count, self._count + 1
        pend, self._pending = self._pending, {}
        recorded = step_no % self.every == 0
        self._nonfinite.every_step(pend.get("step", step_no), pend.get("loss"), False, recorded)
        if recorded:
            self._nonfinite.find(None)
        if not self._nonfinite.looking:  # found and posted: nothing more to do on this rank
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
        partials = dist.local_partials(self._params, with_hist, self._nonfinite.queue)
        self._dist_step = ShardedStep(step_no, pend, partials, measure)
        if measure:
            self._updates.take()
            return
        self._end_sharded_step()

    def _end_sharded_step(self) -> None:
        st, self._dist_step, dist = self._dist_step, None, self._dist
        assert st is not None and dist is not None
        reduced = dist.reduce(st.partials)
        if reduced is None:
            self._nonfinite.find(None)  # this rank's own origin, posted for rank 0
            return  # not rank 0: rank 0 records and writes
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
