"""What the trainer callbacks share: a Recorder built when training starts (the trainer makes the
model and optimizer), marked step by step by the callback, behind the surface ``GradientPanel``
follows (``on_step``, ``run``, ``log``, ``attached``), so ``GradientPanel(callback)`` works before,
during and after training."""

from __future__ import annotations

import inspect
from collections import defaultdict

import torch

from .._args import check_objective
from ..collect._inputs import _check_number
from ..collect.torch import Recorder, norms
from ..schema import _as_step

#: Recorder options a callback passes through (model, optimizer and step marking are the trainer's)
_OWN = ("model", "optimizer", "step_hooks", "self")
RECORDER_OPTIONS = tuple(p for p in inspect.signature(Recorder.__init__).parameters if p not in _OWN)


def global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all ``grads`` together, as ``clip_grad_norm_`` computes it (fused per device,
    then the norm of the per-tensor norms), left on the device."""
    by_dev: dict = defaultdict(list)
    for g in grads:
        by_dev[g.device].append(g)
    first = grads[0].device
    parts = [norms(gs).to(first) for gs in by_dev.values()]
    return torch.linalg.vector_norm(torch.cat(parts))


def note_clipping(rec: Recorder, max_norm: float, what: str) -> None:
    """Say in the run's meta (once, written to its directory) that the trainer clips gradients at
    ``max_norm`` and what the ``global_norm`` scalar then holds."""
    run = rec.run
    if run is None or run.meta.get("clipped_at") == max_norm:
        return
    rec.note_meta({"clipped_at": max_norm, "global_norm": what})


class TrainerRecording:
    """The Recorder side of a trainer callback (see the module docstring)."""

    def __init__(self, log_dir=None, **recorder_options) -> None:
        unknown = sorted(set(recorder_options) - set(RECORDER_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown Recorder option(s) {', '.join(unknown)}; options are {', '.join(o for o in RECORDER_OPTIONS)}"
            )
        if "objective" in recorder_options:  # refused here, not when training starts
            check_objective(recorder_options["objective"])
        self._options = dict(recorder_options, log_dir=log_dir)
        #: callbacks called with the Run after each recorded step (shared with the Recorder)
        self.on_step: list = []
        self.recorder: Recorder | None = None
        self._pending: dict = {}
        self._closed = False

    # ------------------------------------------------------------------ the panel's surface
    @property
    def run(self):
        """The Run recorded so far (None before the first optimizer step)."""
        return None if self.recorder is None else self.recorder.run

    @property
    def attached(self) -> bool:
        """Recording, or waiting for training to start."""
        return not self._closed and (self.recorder is None or self.recorder.attached)

    @property
    def layer_names(self) -> list[str] | None:
        """The names of the parameters recorded (None before training starts)."""
        return None if self.recorder is None else self.recorder.layer_names

    def log(self, loss=None, lr=None, step: int | None = None) -> None:
        """Attach a loss, learning rate or step number of your own to the next recorded step."""
        if self.recorder is None:  # checked now, as the Recorder checks them
            given = {"loss": loss, "lr": lr}
            self._pending.update({k: _check_number(k, v) for k, v in given.items() if v is not None})
            if step is not None:
                self._pending["step"] = _as_step(step)
        else:
            self.recorder.log(loss=loss, lr=lr, step=step)

    def detach(self) -> None:
        """Stop recording now (training ends it too) and close the run directory."""
        self._closed = True
        self._stop()

    close = detach

    def __repr__(self) -> str:
        return f"<{type(self).__module__}.{type(self).__name__} {self.run!r}>"

    # ------------------------------------------------------------------ for the callbacks
    def _start(self, model, optimizer, resumed_at: int = 0) -> Recorder:
        """The Recorder for this training: the one already recording this model (``train()``
        called again), or a new one. ``resumed_at``: the step of the checkpoint the trainer goes
        on from (0 for a fresh start); with ``resume=True`` the run continues from that step, its
        later steps replaced by the ones the trainer trains again, under the trainer's numbers."""
        rec = self.recorder
        if rec is not None and rec.attached and rec.model is model:
            return rec
        if rec is not None:
            rec.detach()
        self._closed = False
        options = self._options
        if resumed_at and options.get("resume") is True:
            options = dict(options, resume=resumed_at)
        rec = Recorder(model, optimizer, step_hooks=False, **options)
        rec.on_step = self.on_step  # the panel's callbacks, added before training started
        self.recorder = rec
        if self._pending:
            rec.log(**self._pending)
            self._pending = {}
        return rec

    def _stop(self) -> None:
        if self.recorder is not None and self.recorder.attached:
            self.recorder.detach()
