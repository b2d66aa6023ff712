"""``GradwidgetCallback``: a Hugging Face ``transformers.TrainerCallback`` that records one step per
optimizer update, when the Trainer is about to step (``on_pre_optimizer_step``): after gradient
accumulation, AMP unscaling and clipping, the gradients the optimizer sees.

    cb = GradwidgetCallback(log_dir="runs/bert")
    trainer = Trainer(model, args, train_dataset=ds, callbacks=[cb])
    GradientPanel(cb)          # follows the training below (or run it in a thread)
    trainer.train()

The step's loss is the one the Trainer adds to its logged loss (the model output's ``loss``
summed over the micro-batches when the Trainer passes ``num_items_in_batch``, else their mean),
the learning rate the one the optimizer steps with. When the Trainer clips
(``max_grad_norm > 0``), the run's ``global_norm`` is the norm the Trainer computed before
clipping (its logged ``grad_norm``), measured at the end of the step's last backward: per-layer
norms show the clipped gradients, ``global_norm`` the explosion clipping hid.
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback

from ..collect._hooks import Hook
from .base import TrainerRecording, global_norm, note_clipping

__all__ = ["GradwidgetCallback"]


class GradwidgetCallback(TrainerCallback, TrainerRecording):
    """Records a ``transformers.Trainer``'s gradients. ``log_dir`` and the other keyword arguments
    are the Recorder's (``every``, ``histogram_every``, ``max_steps``, ...). ``.run`` is the Run."""

    def __init__(self, log_dir=None, **recorder_options) -> None:
        TrainerRecording.__init__(self, log_dir, **recorder_options)
        self._hooks: list = []
        self._loss_sum = None
        self._loss_n = 0
        self._loss_summed = False
        self._pre_clip: torch.Tensor | None = None
        self._queued = False
        self._scaler = None
        self._clip_at: float | None = None

    # ------------------------------------------------------------------ Trainer events
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if model is None or optimizer is None:
            raise ValueError("GradwidgetCallback needs the Trainer's model and optimizer at on_train_begin")
        self._remove_hooks()
        self._start(model, optimizer, state.global_step)  # a checkpoint's step when resuming from one
        self._hooks.append(model.register_forward_hook(Hook(self._on_forward), with_kwargs=True))
        self._scaler = getattr(optimizer, "scaler", None)
        self._clip_at = None
        if args.max_grad_norm and args.max_grad_norm > 0:  # the Trainer clips: keep its pre-clip norm
            self._clip_at = float(args.max_grad_norm)
            for p in model.parameters():
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        rec = self.recorder
        if rec is None or not rec.attached:
            return
        if self._loss_n:
            loss = self._loss_sum if self._loss_summed else self._loss_sum / self._loss_n
            rec.log(loss=loss)
        if self._pre_clip is not None:
            rec.log(global_norm=self._pre_clip)
        rec.log(step=state.global_step + 1)  # the Trainer's step number (global_step counts from 0)
        self._loss_sum, self._loss_n, self._pre_clip = None, 0, None
        rec.record_step()
        if self._clip_at is not None:
            note_clipping(rec, self._clip_at, "before clipping (the Trainer's grad_norm)")

    def on_train_end(self, args, state, control, **kwargs):
        self._remove_hooks()
        self._stop()

    # ------------------------------------------------------------------ hooks
    def _on_forward(self, module, args, kwargs, output):
        """The loss a training forward returns, as the Trainer will count it."""
        if not (module.training and torch.is_grad_enabled()):
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        if self.recorder is not None:
            self.recorder.watch_loss(loss)  # the ops from logits to loss, read once
        loss = loss.detach().float()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._loss_n += 1
        self._loss_summed = kwargs.get("num_items_in_batch") is not None

    def _on_grad(self, p) -> None:
        if not self._queued and _sync_step():
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._behind_ddp)

    def _behind_ddp(self) -> None:
        """Queue the norm once more, behind the end-of-backward callback DDP queues after ours
        (it finishes the gradient all-reduce): the norm is then of the averaged gradients."""
        torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        """The global norm after the step's last backward, before the Trainer clips (unscaled
        when an fp16 GradScaler scaled the loss)."""
        self._queued = False
        rec = self.recorder
        if rec is None:
            return
        grads = [p.grad for p in rec.model.parameters() if p.grad is not None]  # what the Trainer clips
        if not grads:
            return
        norm = global_norm(grads)
        scaler = self._scaler
        if scaler is not None and getattr(scaler, "is_enabled", lambda: False)():
            norm = norm / scaler.get_scale()
        self._pre_clip = norm

    def _remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


def _sync_step() -> bool:
    """Whether this backward ends an accumulation (accelerate's gradient state, which the Trainer
    sets before each micro-batch)."""
    from accelerate.state import GradientState  # type: ignore[import-untyped]

    return bool(GradientState().sync_gradients)
