"""gpytorch: an exact GP regression trained on its marginal likelihood, the loop of gpytorch's
"simple GP regression" tutorial (``ExactGP`` with a scaled RBF kernel, a Gaussian likelihood,
Adam at 0.1 on every hyperparameter, ``loss = -mll(output, y)``), on scikit-learn's diabetes data
(300 patients to fit, 142 held out). Healthy: the held-out error falls below the targets' spread."""

from __future__ import annotations

from .case import Health


def exact_gp_diabetes():
    import gpytorch
    import torch

    from gradwidget import Recorder

    from .data import diabetes

    x, y = diabetes()
    x, y = torch.from_numpy(x * 10), torch.from_numpy(y)  # sklearn's copy is scaled to unit norm per column
    train_x, train_y, test_x, test_y = x[:300], y[:300], x[300:], y[300:]

    class ExactGPModel(gpytorch.models.ExactGP):
        def __init__(self, train_x, train_y, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def rmse() -> float:
        model.eval()
        likelihood.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            pred = likelihood(model(test_x)).mean
        model.train()
        likelihood.train()
        return float(torch.sqrt(torch.mean((pred - test_y) ** 2)))

    torch.manual_seed(0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(train_x, train_y, likelihood)
    before = rmse()
    model.train()
    likelihood.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)  # includes GaussianLikelihood parameters
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with Recorder(model, optimizer) as rec:
        for _ in range(100):
            optimizer.zero_grad()
            output = model(train_x)
            loss = -mll(output, train_y)
            loss.backward()
            rec.log(loss=loss)
            optimizer.step()
    after = rmse()
    return rec.run, Health(
        "held-out RMSE (targets' std 1)", before, after, "after <= 0.8 and < before", after <= 0.8 and after < before
    )


def svgp_diabetes():
    """gpytorch's stochastic variational GP ("SVGP" tutorial): 32 inducing points learnt, a
    Cholesky variational distribution, ``VariationalELBO`` over minibatches of 32, Adam at 0.01
    on the model's and the likelihood's parameters. Healthy: held-out error."""
    import gpytorch
    import torch

    from gradwidget import Recorder

    from .data import diabetes

    x, y = diabetes()
    x, y = torch.from_numpy(x * 10), torch.from_numpy(y)
    train_x, train_y, test_x, test_y = x[:300], y[:300], x[300:], y[300:]

    class GPModel(gpytorch.models.ApproximateGP):
        def __init__(self, inducing_points):
            variational_distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.size(0))
            variational_strategy = gpytorch.variational.VariationalStrategy(
                self, inducing_points, variational_distribution, learn_inducing_locations=True
            )
            super().__init__(variational_strategy)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    torch.manual_seed(0)
    model = GPModel(inducing_points=train_x[:32])
    likelihood = gpytorch.likelihoods.GaussianLikelihood()

    def rmse() -> float:
        model.eval()
        likelihood.eval()
        with torch.no_grad():
            pred = likelihood(model(test_x)).mean
        model.train()
        likelihood.train()
        return float(torch.sqrt(torch.mean((pred - test_y) ** 2)))

    before = rmse()
    optimizer = torch.optim.Adam([{"params": model.parameters()}, {"params": likelihood.parameters()}], lr=0.01)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=train_y.size(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x, train_y), batch_size=32, shuffle=True)
    with Recorder(model, optimizer) as rec:
        for _ in range(30):
            for x_batch, y_batch in loader:
                optimizer.zero_grad()
                output = model(x_batch)
                loss = -mll(output, y_batch)
                loss.backward()
                rec.log(loss=loss)
                optimizer.step()
    after = rmse()
    return rec.run, Health(
        "held-out RMSE (targets' std 1)", before, after, "after <= 0.8 and < before", after <= 0.8 and after < before
    )
