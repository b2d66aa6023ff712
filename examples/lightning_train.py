"""Record a Lightning ``Trainer.fit``: a small MLP regressor with ``accumulate_grad_batches=2``,
gradient clipping and bf16 autocast optional.

    python examples/lightning_train.py --log-dir runs/lightning --steps 40 [--bf16]

``GradwidgetCallback`` (``lightning.pytorch`` or ``pytorch_lightning``) records one step per
optimizer update in ``on_before_optimizer_step``: after accumulation and AMP unscaling, before
Lightning clips. In a notebook, ``GradientPanel(callback)`` follows ``fit`` (examples/lightning.ipynb).
"""
from __future__ import annotations

import argparse

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gradwidget import summary
from gradwidget.integrations.lightning import GradwidgetCallback


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).float(), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def make_fit(steps: int = 40, log_dir=None, bf16: bool = False):
    """(trainer, module, loader, callback) ready for ``trainer.fit(module, loader)``."""
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    y = (x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(512, 1))
    callback = GradwidgetCallback(log_dir=log_dir)
    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=2, gradient_clip_val=1.0, callbacks=[callback],
                        precision="bf16-mixed" if bf16 else "32-true", accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return trainer, Regressor(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), callback


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args(argv)
    trainer, module, loader, cb = make_fit(args.steps, args.log_dir, args.bf16)
    trainer.fit(module, loader)
    print(summary(cb.run))


if __name__ == "__main__":
    main()
