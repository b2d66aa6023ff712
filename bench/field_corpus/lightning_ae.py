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


def _frechet(a, b) -> float:
    """The Fréchet distance between Gaussians fitted to two sets of flat images (FID's formula,
    on pixels)."""
    import numpy as np
    from scipy.linalg import sqrtm

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    eps = 1e-6 * np.eye(a.shape[1])  # constant pixels (the corners) make a covariance singular
    ca, cb = np.cov(a, rowvar=False) + eps, np.cov(b, rowvar=False) + eps
    root = sqrtm(ca @ cb).real
    return float(((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca + cb - 2 * root))


def gan_digits():
    """The GAN of Lightning's "basic GAN" tutorial (manual optimization: the generator's step,
    then the discriminator's, ``manual_backward`` on each, ``adversarial_loss`` the binary cross
    entropy, Adam at 2e-4 with betas (0.5, 0.999)), with MLPs on scikit-learn's digits, recorded by
    the Lightning ``GradwidgetCallback`` (which follows the first optimizer, the generator's). The
    generator's loss rises as the discriminator learns. Healthy: the Fréchet distance between
    generated and real digits (on pixels) falls."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch import nn

    from gradwidget.integrations.lightning import GradwidgetCallback

    from .data import digits

    latent_dim = 16

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()

            def block(in_feat, out_feat, normalize=True):
                layers = [nn.Linear(in_feat, out_feat)]
                if normalize:
                    layers.append(nn.BatchNorm1d(out_feat, 0.8))
                layers.append(nn.LeakyReLU(0.2, inplace=True))
                return layers

            self.model = nn.Sequential(
                *block(latent_dim, 64, normalize=False), *block(64, 128), nn.Linear(128, 64), nn.Tanh()
            )

        def forward(self, z):
            return self.model(z)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Sequential(
                nn.Linear(64, 128),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Linear(128, 64),
                nn.LeakyReLU(0.2, inplace=True),
                nn.Linear(64, 1),
                nn.Sigmoid(),
            )

        def forward(self, img):
            return self.model(img)

    class GAN(L.LightningModule):
        def __init__(self, lr=2e-4, b1=0.5, b2=0.999):
            super().__init__()
            self.save_hyperparameters()
            self.automatic_optimization = False
            self.generator = Generator()
            self.discriminator = Discriminator()

        def forward(self, z):
            return self.generator(z)

        def adversarial_loss(self, y_hat, y):
            return F.binary_cross_entropy(y_hat, y)

        def training_step(self, batch):
            imgs, _ = batch
            optimizer_g, optimizer_d = self.optimizers()
            z = torch.randn(imgs.shape[0], latent_dim).type_as(imgs)
            # train the generator
            self.toggle_optimizer(optimizer_g)
            self.generated_imgs = self(z)
            valid = torch.ones(imgs.size(0), 1).type_as(imgs)
            g_loss = self.adversarial_loss(self.discriminator(self(z)), valid)
            self.log("g_loss", g_loss)
            self.manual_backward(g_loss)
            optimizer_g.step()
            optimizer_g.zero_grad()
            self.untoggle_optimizer(optimizer_g)
            # train the discriminator
            self.toggle_optimizer(optimizer_d)
            real_loss = self.adversarial_loss(self.discriminator(imgs), valid)
            fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
            fake_loss = self.adversarial_loss(self.discriminator(self(z).detach()), fake)
            d_loss = (real_loss + fake_loss) / 2
            self.log("d_loss", d_loss)
            self.manual_backward(d_loss)
            optimizer_d.step()
            optimizer_d.zero_grad()
            self.untoggle_optimizer(optimizer_d)

        def configure_optimizers(self):
            lr, b1, b2 = self.hparams.lr, self.hparams.b1, self.hparams.b2
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(b1, b2))
            opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(b1, b2))
            return [opt_g, opt_d]

    torch.manual_seed(0)
    x, y, _ = digits()
    real = x * 2 - 1
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(real, y), batch_size=64, shuffle=True, drop_last=True
    )
    model = GAN()

    def distance() -> float:
        model.eval()
        with torch.no_grad():
            fake = model(torch.randn(len(real), latent_dim, generator=torch.Generator().manual_seed(1)))
        model.train()
        return _frechet(fake.numpy(), real.numpy())

    before = distance()
    cb = GradwidgetCallback()
    trainer = L.Trainer(
        max_epochs=30,
        callbacks=[cb],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader)
    after = distance()
    return cb.run, Health(
        "pixel Fréchet distance to real digits", before, after, "after <= 0.5x before", after <= 0.5 * before
    )
