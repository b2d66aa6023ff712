"""The Recorder's instruments as probes: the base a probe builds on and the step context it sees.

A probe owns its hooks (one group, which ``close`` removes), its state, its cadence and what it
adds to the run; the Recorder (``collect/torch.py``) owns the model and optimizer references, the
column layout, the Run and its writer, and calls its probes in order at each step:

- ``every_step(label, loss, skipped, recorded)``: at every step, recorded or not, before it is
  recorded;
- ``before_update()``: at an optimizer step, before the optimizer updates the parameters;
- ``queue(pack)``: on a recorded step, queue device tensors in the step's one host copy;
- ``on_step(ctx)``: on a recorded step, after the copy and after the step is in the run;
- ``after_step(step)``: at every step, after all of its work, recorded or not;
- ``continues(run)``: once, when the Recorder resumes ``run`` (its folder's), before it records;
- ``elsewhere()``: on a process that holds no run (a DDP rank other than 0, a sharded rank that
  does not hold the run), at each step another process records, once this process's part of it is
  done; such a process calls ``every_step`` (and ``queue``, sharded) too, and its step hook stays
  while a probe ``needs_steps``;
- ``close()``: on ``detach()``, in reverse order of the probes.

The probes: the layers' data-flow graph (``_graph``), the update norms (``_updates``), the model
and optimizer changes (``_changes``), the loss's graph (``loss_graph``), the gradient noise scale
(``_noise``), the zero_grad check (``_grad_reset``), the training-mode check (``_train_mode``),
the replicas' exchange (``_replica_exchange``) and the NaN tracing (``_nonfinite_probe``: the
tracer, its replay and its cost meter).

A new instrument is one module with a ``Probe`` subclass that overrides what it needs, and one
line in ``Recorder.__init__`` that builds it and appends it to the Recorder's probes (their order
is the order they are called in). Private to ``gradwidget.collect``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ._kernels import HostCopy


@dataclass
class StepContext:
    """What a probe sees of one recorded step: its number (the user's), the ``(METRICS, L)``
    values just recorded, ``note_meta(values, now)``, the one way to add to the run's meta
    (``Recorder.note_meta``: in its folder at once, or within one flush interval), the step's
    training loss (None when none was logged, or one logged without a graph), whether the
    optimizer skipped the step (AMP), the recorded parameters in column order, and the index of
    each column's parameter among the model's recorded parameters (the order the Recorder was
    given them in)."""

    step: int
    values: np.ndarray
    note_meta: Callable[[dict, bool], None]
    loss: float | torch.Tensor | None = None
    skipped: bool = False
    weights: list[torch.Tensor] = field(default_factory=list)
    order: list[int] = field(default_factory=list)


class Probe:
    """An instrument of the Recorder (see the module docstring); every method does nothing."""

    def every_step(self, label: int, loss, skipped: bool, recorded: bool) -> None:
        """At every step, recorded or not, before it is recorded: ``label`` its number (the user's,
        when given), ``loss`` the loss logged for it (a tensor or a number, or None), ``skipped``
        the optimizer did not take it, ``recorded`` it is one to record."""

    def before_update(self) -> None:
        """At an optimizer step, before the parameters are updated."""

    def queue(self, pack: HostCopy) -> None:
        """Queue device tensors in the recorded step's host copy (read back in ``on_step``)."""

    def on_step(self, ctx: StepContext) -> None:
        """A recorded step is in the run (and its host copy fetched)."""

    def after_step(self, step: int) -> None:
        """Step ``step`` (the Recorder's count from 0, recorded or not) is over, all its work done."""

    def continues(self, run) -> None:
        """The Recorder resumes ``run``, read from its folder, before its first step is recorded."""

    def elsewhere(self) -> None:
        """A step another process records is over here (this process holds no run)."""

    @property
    def needs_steps(self) -> bool:
        """On a process that holds no run: whether this probe still needs the Recorder's step hook
        (it is removed once none does)."""
        return False

    def close(self) -> None:
        """Remove every hook this probe installed and let go of its state."""
