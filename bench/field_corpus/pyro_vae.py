"""pyro: a variational autoencoder trained by ``SVI.step`` on ``Trace_ELBO``, written as pyro's VAE
tutorial writes it (an encoder and decoder in one ``nn.Module``, ``pyro.module`` registering the
decoder, a Bernoulli likelihood on pixels in [0, 1]), on scikit-learn's digits. ``pyro.optim.Adam``
builds one torch optimizer per parameter, so the Recorder is given the model alone (a step is a
backward pass); ``svi.step`` returns the loss after its step, so each loss is logged with the next
step. A second case trains it with pyro's documented torch-optimizer loop. Healthy: the ELBO loss
per image falls."""

from __future__ import annotations

from .case import Health


def _vae():
    """The tutorial's VAE (its model and guide as methods), for 64-pixel images."""
    import pyro
    import pyro.distributions as dist
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self, z_dim, hidden):
            super().__init__()
            self.fc1 = nn.Linear(64, hidden)
            self.fc21 = nn.Linear(hidden, z_dim)
            self.fc22 = nn.Linear(hidden, z_dim)
            self.softplus = nn.Softplus()

        def forward(self, x):
            hidden = self.softplus(self.fc1(x))
            return self.fc21(hidden), torch.exp(self.fc22(hidden))

    class Decoder(nn.Module):
        def __init__(self, z_dim, hidden):
            super().__init__()
            self.fc1 = nn.Linear(z_dim, hidden)
            self.fc21 = nn.Linear(hidden, 64)
            self.softplus = nn.Softplus()

        def forward(self, z):
            return torch.sigmoid(self.fc21(self.softplus(self.fc1(z))))

    class VAE(nn.Module):
        def __init__(self, z_dim=8, hidden=128):
            super().__init__()
            self.encoder = Encoder(z_dim, hidden)
            self.decoder = Decoder(z_dim, hidden)
            self.z_dim = z_dim

        def model(self, x):
            pyro.module("decoder", self.decoder)
            with pyro.plate("data", x.shape[0]):
                z_loc = x.new_zeros(torch.Size((x.shape[0], self.z_dim)))
                z_scale = x.new_ones(torch.Size((x.shape[0], self.z_dim)))
                z = pyro.sample("latent", dist.Normal(z_loc, z_scale).to_event(1))
                loc_img = self.decoder(z)
                pyro.sample("obs", dist.Bernoulli(loc_img, validate_args=False).to_event(1), obs=x)

        def guide(self, x):
            pyro.module("encoder", self.encoder)
            with pyro.plate("data", x.shape[0]):
                z_loc, z_scale = self.encoder(x)
                pyro.sample("latent", dist.Normal(z_loc, z_scale).to_event(1))

    return VAE()


def _health(per_epoch: list) -> Health:
    return Health(
        "ELBO loss per image (epoch mean)",
        per_epoch[0],
        per_epoch[-1],
        "after <= 0.8x before",
        per_epoch[-1] <= 0.8 * per_epoch[0],
    )


def vae_digits():
    import pyro
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import Adam

    from gradwidget import Recorder

    from .data import digits

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, _, order = digits()
    vae = _vae()
    svi = SVI(vae.model, vae.guide, Adam({"lr": 1e-3}), loss=Trace_ELBO())
    per_epoch = []
    with Recorder(vae) as rec:
        for epoch in range(25):
            total = 0.0
            for i in range(0, len(order), 128):
                batch = x[order[i : i + 128]]
                loss = svi.step(batch)
                rec.log(loss=loss)
                total += loss
            per_epoch.append(total / len(order))
    return rec.run, _health(per_epoch)


def vae_digits_torch_optimizer():
    """The same VAE on pyro's documented loop with a torch optimizer: ``Trace_ELBO().
    differentiable_loss(model, guide, x)`` backpropagated by hand, ``torch.optim.Adam`` stepping,
    so the Recorder gets the optimizer and the loss as a tensor."""
    import pyro
    import torch
    from pyro.infer import Trace_ELBO

    from gradwidget import Recorder

    from .data import digits

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, _, order = digits()
    vae = _vae()
    loss_fn = Trace_ELBO().differentiable_loss
    optimizer = torch.optim.Adam(vae.parameters(), lr=1e-3)
    per_epoch = []
    with Recorder(vae, optimizer) as rec:
        for epoch in range(25):
            total = 0.0
            for i in range(0, len(order), 128):
                batch = x[order[i : i + 128]]
                loss = loss_fn(vae.model, vae.guide, batch)
                optimizer.zero_grad()
                loss.backward()
                rec.log(loss=loss)
                optimizer.step()
                total += loss.item()
            per_epoch.append(total / len(order))
    return rec.run, _health(per_epoch)


def bayesian_regression_diabetes():
    """pyro's Bayesian regression tutorial: a ``PyroModule[nn.Linear]`` with Normal priors on its
    weight and bias, a learnt noise scale, an ``AutoDiagonalNormal`` guide (a ``PyroModule``: the
    Recorder watches it, built by one step first), ``SVI`` with ``pyro.optim.Adam`` at 0.03 on
    ``Trace_ELBO``, on scikit-learn's diabetes data. Healthy: the posterior mean's held-out error."""
    import pyro
    import pyro.distributions as dist
    import torch
    from pyro.infer import SVI, Predictive, Trace_ELBO
    from pyro.infer.autoguide import AutoDiagonalNormal
    from pyro.nn import PyroModule, PyroSample
    from torch import nn

    from gradwidget import Recorder

    from .data import diabetes

    x, y = diabetes()
    x, y = torch.from_numpy(x * 10), torch.from_numpy(y)
    train_x, train_y, test_x, test_y = x[:300], y[:300], x[300:], y[300:]

    class BayesianRegression(PyroModule):
        def __init__(self, in_features, out_features):
            super().__init__()
            self.linear = PyroModule[nn.Linear](in_features, out_features)
            self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([out_features, in_features]).to_event(2))
            self.linear.bias = PyroSample(dist.Normal(0.0, 10.0).expand([out_features]).to_event(1))

        def forward(self, x, y=None):
            sigma = pyro.sample("sigma", dist.Uniform(0.0, 10.0))
            mean = self.linear(x).squeeze(-1)
            with pyro.plate("data", x.shape[0]):
                pyro.sample("obs", dist.Normal(mean, sigma), obs=y)
            return mean

    def rmse() -> float:
        predictive = Predictive(model, guide=guide, num_samples=200, return_sites=("_RETURN",))
        pred = predictive(test_x)["_RETURN"].mean(0)
        return float(torch.sqrt(torch.mean((pred - test_y) ** 2)))

    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = BayesianRegression(10, 1)
    guide = AutoDiagonalNormal(model)
    svi = SVI(model, guide, pyro.optim.Adam({"lr": 0.03}), loss=Trace_ELBO())
    first = svi.step(train_x, train_y)  # builds the guide's parameters
    before = rmse()
    with Recorder(guide) as rec:
        for _ in range(500):
            loss = svi.step(train_x, train_y)
            rec.log(loss=loss)
    after = rmse()
    return rec.run, Health(
        f"held-out RMSE of the posterior mean (ELBO loss {first:.0f} -> {loss:.0f})",
        before,
        after,
        "after <= 0.8 and < before",
        after <= 0.8 and after < before,
    )
