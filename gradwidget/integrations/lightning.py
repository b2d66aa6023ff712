"""``GradwidgetCallback``: a Lightning ``Callback`` (``lightning.pytorch`` or the older
``pytorch_lightning`` package: it is an instance of both packages' ``Callback``) that records one
step per optimizer update, in ``on_before_optimizer_step``: after ``accumulate_grad_batches``
micro-batches and AMP unscaling, before Lightning clips (``gradient_clip_val``), so per-layer norms
and ``global_norm`` show the gradients before clipping; the run's meta says when Lightning clips.

    cb = GradwidgetCallback(log_dir="runs/lit")
    trainer = L.Trainer(max_steps=100, callbacks=[cb])
    GradientPanel(cb)
    trainer.fit(module, loader)

The step's loss is the sum over its micro-batches of the loss Lightning backpropagates (the
``training_step`` loss divided by ``accumulate_grad_batches``): the mean training loss of the step.
Automatic optimization with one optimizer; the first optimizer otherwise.
"""

from __future__ import annotations

import importlib

from ..collect._noise import first_dim
from .base import TrainerRecording, note_clipping

__all__ = ["GradwidgetCallback"]


def _callback_bases() -> tuple[type, ...]:
    bases = []
    for pkg in ("lightning.pytorch", "pytorch_lightning"):
        try:
            bases.append(importlib.import_module(pkg).Callback)
        except ImportError:
            continue
    if not bases:
        raise ImportError("gradwidget.integrations.lightning needs Lightning: pip install 'gradwidget[lightning]'")
    return tuple(dict.fromkeys(bases))


class GradwidgetCallback(*_callback_bases(), TrainerRecording):  # type: ignore[misc]
    """Records a Lightning ``Trainer``'s gradients. ``log_dir`` and the other keyword arguments
    are the Recorder's (``every``, ``histogram_every``, ``max_steps``, ...). ``.run`` is the Run."""

    def __init__(self, log_dir=None, **recorder_options) -> None:
        TrainerRecording.__init__(self, log_dir, **recorder_options)
        self._loss = None

    def on_train_start(self, trainer, pl_module) -> None:
        """Start recording once a checkpoint (``fit(ckpt_path=...)``) is restored: its step is
        where a resumed run goes on (``resume=True``), under the trainer's own step numbers."""
        optimizers = list(trainer.optimizers)
        if not optimizers:
            raise ValueError("GradwidgetCallback found no optimizer: configure_optimizers returned none")
        self._start(pl_module, optimizers[0], trainer.global_step)
        self._loss = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        """Tell the Recorder each micro-batch's size (the gradient noise scale needs it): Lightning
        calls ``training_step`` with the batch, not the module's forward, where the Recorder looks."""
        rec = self.recorder
        if rec is not None and rec.attached:
            n = _batch_size(batch)
            if n is not None:
                rec.log(batch_size=n)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self.recorder is not None:
            self.recorder.watch_loss(loss)  # the ops from the output to the loss, read once
        part = loss.detach().float()
        self._loss = part if self._loss is None else self._loss + part

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        rec = self.recorder
        if rec is None or not rec.attached or _inner(optimizer) is not rec.optimizer:
            return
        if self._loss is not None:
            rec.log(loss=self._loss)
            self._loss = None
        rec.log(step=trainer.global_step + 1)  # the update about to happen (global_step counts from 0)
        rec.record_step()
        clip = trainer.gradient_clip_val
        if clip:
            note_clipping(rec, float(clip), "before clipping (on_before_optimizer_step)")

    def on_fit_end(self, trainer, pl_module) -> None:
        self._stop()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._stop()


def _inner(optimizer):
    return getattr(optimizer, "_optimizer", optimizer)


def _batch_size(batch) -> int | None:
    """The first dimension of the batch's first tensor (a tensor, a tuple or list, or a dict of them)."""
    if isinstance(batch, dict):
        return first_dim((), batch)
    return first_dim(batch if isinstance(batch, (tuple, list)) else (batch,), {})
