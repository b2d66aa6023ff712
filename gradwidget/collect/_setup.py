"""The Recorder's setup at its first recorded step (columns, the Run, update buffers, the run
directory) and the in-memory window of steps it keeps (a mixin: the state is the Recorder's)."""

from __future__ import annotations

import math
import warnings

from .._warnings import GradwidgetWarning
from ..noise_series import noise_dtype
from ..run import LayerInfo, Run, step_bytes
from ._grad_reset import GradResetCheck
from ._hooks import remove_tensor_hooks
from ._inputs import _module_of
from ._state import _RecorderState
from ._stats import StepStatistics


class _Setup(_RecorderState):
    """The first recorded step's setup and the window of kept steps."""

    def window_text(self) -> str:
        """How many steps the in-memory run keeps, and what decided it, in words."""
        if self.max_steps is None:
            return "keeping every step in memory (max_steps=None)"
        n = self._window(len(self._names))
        why = (
            f"max_steps='auto': a {self.memory_budget / 2**20:,.0f} MiB memory_budget"
            if self.max_steps == "auto"
            else f"max_steps={self.max_steps}"
        )
        return f"keeping the last {n:,} steps in memory ({why})"

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

    _window_told = False

    # ------------------------------------------------------------------ setup at the first step
    def _start(self) -> None:
        """Fix the columns (depth order = reverse of gradient arrival) and create the Run."""
        arrived = self._arrival
        if self._graph.capturing and not self._graph.seen:
            # no forward hook ran outside a compiled graph (torch.compile): gradients arrived in the
            # compiled backward's output order, not the graph's; the model's own order is closer
            arrived = sorted(arrived, reverse=True)
        rank = {p: len(arrived) - 1 - k for k, p in enumerate(arrived)}  # depth rank
        keys: list[tuple[float, int, int]] = []
        last: float = -0.5
        for i in range(len(self._params)):
            if i in rank:
                last = rank[i]
                keys.append((last, 0, i))
            else:
                keys.append((last, 1, i))
        self._order = [i for _, _, i in sorted(keys)]
        if self._resume is not None:  # the columns of the run continued, whose files hold them so
            at = {name: i for i, name in enumerate(self._names)}
            self._order = [at[info.name] for info in self._resume.run.layers]
        layers = []
        dist = self._dist if self._dist is not None and self._dist.sharded else None
        sharded = dist is not None
        if dist is not None:
            from .distributed import clean_name, type_name

            dist.prepare(self._names, self._params, self._order)
        for i in self._order:
            p, name = self._params[i], self._names[i]
            mod, mtype = _module_of(self.model, name)
            status = "frozen" if not p.requires_grad else ("trainable" if i in rank else "unused")
            shape = dist.full_shape(name, p) if dist is not None else tuple(p.shape)
            if sharded:
                mtype = type_name(self.model.get_submodule(mod)) if mtype else mtype
                name, mod = clean_name(name), clean_name(mod)
            layers.append(
                LayerInfo(
                    name=name,
                    module=mod,
                    module_type=mtype,
                    shape=shape,
                    numel=math.prod(shape),
                    dtype=str(p.dtype).replace("torch.", ""),
                    backward_index=arrived.index(i) if i in rank else -1,
                    status=status,
                    tied=self._tied.get(id(p), ()),
                )
            )
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
        if "nonfinite_origin" in old.meta:  # found before the crash: neither tracer nor replay is needed
            self._nonfinite.stop()
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

    def _window(self, n_layers: int) -> int | None:
        """Steps kept in memory: with "auto", as many as fit the memory budget (the Run's capacity is
        up to twice the window; docs/costs.md, Memory), at least 1,000."""
        if self.max_steps is None or isinstance(self.max_steps, int):
            return self.max_steps
        per_step = step_bytes(n_layers, self.histogram_every)
        noise = getattr(self, "_noise", None)
        if noise is not None and noise.keeps_rows:  # run.noise: a row a measured step
            per_step += noise_dtype(n_layers).itemsize / noise.every
        return max(1000, int(self.memory_budget / (2 * per_step)))
