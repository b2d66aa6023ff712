"""Lightning: the ``LitAutoEncoder`` of Lightning's README (a 3-dimensional bottleneck, mean squared
error, Adam at 1e-3, ``self.log("train_loss", ...)``) trained by ``L.Trainer.fit`` on scikit-learn's
digits, recorded by gradwidget's Lightning ``GradwidgetCallback``. Healthy: held-out reconstruction
error falls."""

from __future__ import annotations

from .case import Health


def autoencoder_digits():
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gradwidget.integrations.lightning import GradwidgetCallback

    from .data import digits

    class LitAutoEncoder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 3))
            self.decoder = nn.Sequential(nn.Linear(3, 128), nn.ReLU(), nn.Linear(128, 64))

        def forward(self, x):
            return self.decoder(self.encoder(x))

        def training_step(self, batch, batch_idx):
            x, _ = batch
            x = x.view(x.size(0), -1)
            z = self.encoder(x)
            x_hat = self.decoder(z)
            loss = F.mse_loss(x_hat, x)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    x, y, order = digits()
    train, held = order[:1500], order[1500:]
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x[train], y[train]), batch_size=32, shuffle=True
    )

    def error() -> float:
        with torch.no_grad():
            return float(F.mse_loss(model(x[held]), x[held]))

    model = LitAutoEncoder()
    before = error()
    cb = GradwidgetCallback()
    trainer = L.Trainer(
        max_epochs=10,
        callbacks=[cb],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    after = error()
    return cb.run, Health("held-out reconstruction MSE", before, after, "after <= 0.6x before", after <= 0.6 * before)
