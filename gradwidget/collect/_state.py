"""The state the Recorder's parts share (``torch``, ``_setup``, ``_steps``), declared
once with its types: each part is a mixin of ``Recorder`` reading and writing these attributes,
which ``Recorder.__init__`` and the first step (``_start``) set; the parts that own their state
(``_stats.StepStatistics``, ``_graph.GraphCapture``, ``_noise.NoiseProbe``,
``_grad_reset.GradResetCheck``, ...) are held here, with ``ShardedStep`` (a sharded step waiting
for its collective). Nothing here runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:
    from ..run import Run
    from ..storage import ResumePoint, RunWriter
    from ..thresholds import Thresholds
    from ._changes import ModelWatch
    from ._grad_reset import GradResetCheck
    from ._graph import GraphCapture
    from ._stats import StepStatistics
    from ._updates import UpdateNorms
    from ._inputs import OptimizerExtra
    from ._meta import MetaFollow
    from ._probe import Probe
    from ._noise import NoiseProbe, NoiseStep
    from ._nonfinite_probe import NonfiniteProbe
    from ._replica_exchange import ReplicaExchange
    from .distributed import DistContext
    from .loss_graph import LossGraphProbe


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


class _RecorderState:
    # what the user gave
    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    every: int
    histogram_every: int
    max_steps: int | str | None
    memory_budget: int
    objective: str
    thresholds: Thresholds
    log_dir: Any
    _overwrite: bool
    _resume: ResumePoint | None
    track_updates: bool
    skipped: dict[str, str]
    optimizer_extra: OptimizerExtra | None
    # what is recorded into
    run: Run | None
    on_step: list[Callable[[Run], None]]
    _writer: RunWriter | None
    _meta: MetaFollow
    _dist: DistContext | None
    _nonfinite: NonfiniteProbe
    _loss_probe: LossGraphProbe | None
    _replicas: ReplicaExchange | None
    _noise: NoiseProbe | None
    _noise_off: str | None
    _noise_step: NoiseStep | None
    _noise_row: tuple | None
    _watch: ModelWatch | None  # None under torch.distributed
    _opt_handles: list[Any]
    # the parameters, and the columns they become at the first step
    _names: list[str]
    _params: list[torch.Tensor]
    _tied: dict[int, tuple[str, ...]]
    _order: list[int] | None
    _graph: GraphCapture  # the layers' data-flow edges
    _stats: StepStatistics  # the statistics of each column's parameter (set at the first step)
    _col_of: dict[int, int]
    _unused_cols: list[int]
    _updates: UpdateNorms
    _reset_check: GradResetCheck | None
    _probes: list[Probe]
    _step_hooks: bool
    # hooks and step bookkeeping
    _attached: bool
    _handles: list[Any]
    _grad_handles: list[Any]
    _arrival: list[int]
    _arrival_set: set[int]
    _in_backward: bool
    _count: int
    _recorded: int
    _pending: dict[str, Any]
    _dist_step: ShardedStep | None
    _own_zero_grad: Any

    if TYPE_CHECKING:  # methods one part calls on another

        def _start(self) -> None: ...
        def _plan_optimizer(self) -> None: ...
        def _finish_unstepped(self) -> None: ...
        def _adopt_optimizer(self, optimizer) -> None: ...
        def _make_trainable(self, cols: list[int]) -> None: ...
        @property
        def attached(self) -> bool: ...
        def _window(self, n_layers: int) -> int | None: ...
        def _warn_window(self) -> None: ...
        def _pre_step(self, optimizer, args, kwargs) -> tuple[tuple, dict] | None: ...
        def _post_step(self, optimizer, args, kwargs) -> None: ...
        def _inert_step(self, optimizer, args, kwargs) -> None: ...
        def _hook_arrival(self, i: int, p: torch.Tensor) -> None: ...
        def _wrap_zero_grad(self) -> None: ...
        def _unwrap_zero_grad(self) -> None: ...
        def _record_unstepped(self) -> None: ...
        def _finish_step(self) -> None: ...
        def note_meta(self, values: dict, now: bool = True) -> None: ...
