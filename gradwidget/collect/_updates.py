"""The update norms, as a probe of the Recorder: ``||w after - w before||`` of each parameter an
optimizer step updates, measured one recorded step in ``update_every`` (NaN in between).

Before the step it copies the parameters the optimizer holds that have a gradient then (optimizers
skip ``grad=None``: the others keep a NaN update norm, not a false 0); after it (the Recorder's
optimizer step post-hook), the norms of the differences come to the host in one copy and fill the
recorded step's ``update_norm`` row. Sharded (FSDP), each rank copies its own pieces and its sums
of squares ride in the step's one collective (``distributed``). Planned at the first recorded step
and again when the model or the optimizer changed: the Recorder says which columns to measure.
Its cost is one copy of the trainable parameters (docs/costs.md). Private to
``gradwidget.collect``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._groups import UpdateSnapshot
from ._kernels import HostCopy
from ._probe import Probe
from ._stats import _M

if TYPE_CHECKING:
    from ..run import Run
    from .distributed import DistContext


class UpdateNorms(Probe):
    """The update norms of one Recorder. ``every``: measure one recorded step in this many;
    ``dist``: the context of a sharded model (None otherwise)."""

    def __init__(self, every: int, dist: DistContext | None = None) -> None:
        self.every = every
        self._dist = dist
        self._cols: np.ndarray | None = None  # the run's columns measured
        self._bufs: Any = None  # an UpdateSnapshot, or the sharded path's (params, buffers)
        self._taken = False  # a recorded step's parameters copied, waiting for the update

    def plan(self, cols: list[int], params: list[torch.Tensor]) -> None:
        """Measure the columns ``cols``, whose parameters are ``params``, from the next step on."""
        self._cols = np.array(cols, dtype=np.int64)
        self._bufs = self._dist.update_buffers(params) if self._dist is not None else UpdateSnapshot(params)

    @property
    def cols(self) -> np.ndarray | None:
        """The columns measured (None before the plan)."""
        return self._cols

    def due(self, recorded: int) -> bool:
        """Whether recorded step number ``recorded`` (counted from 0) measures its update."""
        return self._bufs is not None and recorded % self.every == 0

    @property
    def waiting(self) -> bool:
        """A recorded step's parameters are copied, and its update not measured yet."""
        return self._taken

    def take(self) -> None:
        """Copy the parameters the coming optimizer step updates."""
        if self._dist is not None:
            self._dist.snapshot(self._bufs)
        else:
            with torch.no_grad():
                self._bufs.take()
        self._taken = True

    def forget(self) -> None:
        """The step waiting was finished without its update (the optimizer step raised, AMP
        skipped it, or training stopped): no update norm."""
        self._taken = False

    def measure(self, run: Run) -> None:
        """After the optimizer step: the update norms into ``run``'s last step."""
        self._taken = False
        snap, cols = self._bufs, self._cols
        assert cols is not None  # planned before any step is taken
        pack = HostCopy()
        with torch.no_grad():
            parts = snap.norms(pack)
        if parts:
            pack.fetch()
            for pos, at in parts:
                v = pack.get(at)
                v[~snap.has_grad[pos]] = np.nan  # not updated by the step: no norm, not a false 0
                run.set_last(_M["update_norm"], cols[pos], v)

    def measure_sharded(self, partials: np.ndarray) -> None:
        """After the optimizer step, sharded: this rank's sums of squares into the step's partials."""
        assert self._dist is not None and self._cols is not None
        self._taken = False
        self._dist.local_update_sumsq(self._bufs, self._cols, partials)

    def close(self) -> None:
        self._bufs, self._taken = None, False
