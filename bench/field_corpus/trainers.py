"""Trainers that run the loop themselves: skorch's ``NeuralNetClassifier.partial_fit`` (its
documented module ending in a softmax, which skorch's default ``NLLLoss`` criterion takes the log
of; its internal 20% validation split) and pytorch-ignite's ``create_supervised_trainer`` (the
convolutional net and ``nll_loss`` of ignite's MNIST example, at SGD 0.05 with momentum 0.9:
the example's 0.01 and 0.5 are for 60,000 images), both on scikit-learn's digits. The
loss is logged where each trainer computes it, before its backward: skorch's ``get_loss`` (the
method its documentation says to override), ignite's ``loss_fn``. Healthy: validation accuracy."""

from __future__ import annotations

from .case import Health


def skorch_digits():
    import torch
    from skorch import NeuralNetClassifier
    from torch import nn

    from gradwidget import Recorder

    from .data import digits

    class MyModule(nn.Module):
        def __init__(self, num_units=64, nonlin=nn.ReLU()):
            super().__init__()
            self.dense0 = nn.Linear(64, num_units)
            self.nonlin = nonlin
            self.dropout = nn.Dropout(0.5)
            self.dense1 = nn.Linear(num_units, num_units)
            self.output = nn.Linear(num_units, 10)
            self.softmax = nn.Softmax(dim=-1)

        def forward(self, X, **kwargs):
            X = self.nonlin(self.dense0(X))
            X = self.dropout(X)
            X = self.nonlin(self.dense1(X))
            return self.softmax(self.output(X))

    Net = _skorch_logging(NeuralNetClassifier)
    torch.manual_seed(0)
    x, y, order = digits()
    net = Net(MyModule, max_epochs=40, lr=0.1, iterator_train__shuffle=True, verbose=0)
    net.initialize()
    with Recorder(net.module_, net.optimizer_) as rec:
        Net.holder["rec"] = rec
        net.partial_fit(x[order].numpy(), y[order].numpy())
    acc = [float(a) for a in net.history[:, "valid_acc"]]
    return rec.run, Health("validation accuracy (epoch 1 -> last)", acc[0], acc[-1], "after >= 0.9", acc[-1] >= 0.9)


def ignite_digits():
    import torch
    import torch.nn.functional as F
    from ignite.engine import create_supervised_evaluator, create_supervised_trainer
    from ignite.metrics import Accuracy
    from torch import nn

    from gradwidget import Recorder

    from .data import digits

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 10, kernel_size=3, padding=1)
            self.conv2 = nn.Conv2d(10, 20, kernel_size=3, padding=1)
            self.conv2_drop = nn.Dropout2d()
            self.fc1 = nn.Linear(80, 50)
            self.fc2 = nn.Linear(50, 10)

        def forward(self, x):
            x = F.relu(F.max_pool2d(self.conv1(x), 2))
            x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
            x = x.view(-1, 80)
            x = F.relu(self.fc1(x))
            x = F.dropout(x, training=self.training)
            x = self.fc2(x)
            return F.log_softmax(x, dim=-1)

    torch.manual_seed(0)
    x, y, order = digits()
    images = x.reshape(-1, 1, 8, 8)
    train_idx, val_idx = order[:1400], order[1400:]
    train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images[train_idx], y[train_idx]), batch_size=64, shuffle=True
    )
    val_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images[val_idx], y[val_idx]), batch_size=256
    )
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loss_fn(y_pred, y):
        loss = F.nll_loss(y_pred, y)
        rec.log(loss=loss)
        return loss

    trainer = create_supervised_trainer(model, optimizer, loss_fn)
    evaluator = create_supervised_evaluator(model, metrics={"accuracy": Accuracy()})

    def accuracy() -> float:
        return float(evaluator.run(val_loader).metrics["accuracy"])

    before = accuracy()
    with Recorder(model, optimizer) as rec:
        trainer.run(train_loader, max_epochs=15)
    after = accuracy()
    return rec.run, Health("validation accuracy", before, after, "after >= 0.9", after >= 0.9)


def _skorch_logging(base):
    """``base`` (a skorch net class) whose ``get_loss`` logs each training loss to ``holder["rec"]``
    (the override skorch documents for changing the loss)."""

    class Logged(base):
        holder: dict = {}

        def get_loss(self, y_pred, y_true, X=None, training=False):
            loss = super().get_loss(y_pred, y_true, X=X, training=training)
            if training:
                self.holder["rec"].log(loss=loss)
            return loss

    return Logged


def skorch_cancer_small_batch():
    """skorch in a scikit-learn ``Pipeline`` after a ``StandardScaler``: breast cancer data at batch
    size 8, Adam, logits under ``CrossEntropyLoss``, and skorch's ``LRScheduler`` callback running
    ``ReduceLROnPlateau`` on the validation loss (``warm_start`` so the pipeline's ``fit`` keeps the
    recorded module). Healthy: validation accuracy."""
    import numpy as np
    import torch
    from sklearn.datasets import load_breast_cancer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler
    from skorch import NeuralNetClassifier
    from skorch.callbacks import LRScheduler
    from torch import nn

    from gradwidget import Recorder

    torch.manual_seed(0)
    X, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order], y[order]
    module = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))
    Net = _skorch_logging(NeuralNetClassifier)
    net = Net(
        module,
        criterion=nn.CrossEntropyLoss,
        optimizer=torch.optim.Adam,
        lr=1e-3,
        batch_size=8,
        max_epochs=25,
        iterator_train__shuffle=True,
        callbacks=[LRScheduler(policy=torch.optim.lr_scheduler.ReduceLROnPlateau, monitor="valid_loss", patience=2)],
        warm_start=True,
        verbose=0,
    )
    pipe = Pipeline(
        [("scale", StandardScaler()), ("f32", FunctionTransformer(lambda a: a.astype(np.float32))), ("net", net)]
    )
    net.initialize()
    with Recorder(net.module_, net.optimizer_) as rec:
        Net.holder["rec"] = rec
        pipe.fit(X, y)
    acc = [float(a) for a in net.history[:, "valid_acc"]]
    return rec.run, Health("validation accuracy (epoch 1 -> last)", acc[0], acc[-1], "after >= 0.95", acc[-1] >= 0.95)


def skorch_lbfgs_regression():
    """skorch's ``NeuralNetRegressor`` with ``torch.optim.LBFGS`` (skorch passes its closure), full
    batch, fitting scikit-learn's noise-free Friedman #1 function (``make_friedman1``) with a tanh
    MLP until the fit is close. Healthy: the training MSE against the targets' variance."""
    import torch
    from sklearn.datasets import make_friedman1
    from skorch import NeuralNetRegressor
    from torch import nn

    from gradwidget import Recorder

    torch.manual_seed(0)
    X, y = make_friedman1(n_samples=400, noise=0.0, random_state=0)
    X, y = X.astype("float32"), ((y - y.mean()) / y.std()).astype("float32").reshape(-1, 1)
    module = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    Net = _skorch_logging(NeuralNetRegressor)
    net = Net(module, optimizer=torch.optim.LBFGS, lr=1.0, batch_size=-1, max_epochs=60, train_split=None, verbose=0)
    net.initialize()
    with Recorder(net.module_, net.optimizer_) as rec:
        Net.holder["rec"] = rec
        net.partial_fit(X, y)
    loss = [float(v) for v in net.history[:, "train_loss"]]
    return rec.run, Health("training MSE (targets' variance 1)", loss[0], loss[-1], "after <= 0.01", loss[-1] <= 0.01)


def skorch_regressor_diabetes():
    """skorch's ``NeuralNetRegressor`` on scikit-learn's diabetes data as it loads: its features
    already scaled, its targets (disease progression, 25 to 346) not, so the output layer's weights
    must grow far beyond their initial scale; Adam at 0.01, batches of 32, skorch's 20% validation
    split. Healthy: R^2 on 100 held-out patients, at least 0.9x a least-squares linear fit's."""
    import numpy as np
    import torch
    from sklearn.datasets import load_diabetes
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score
    from skorch import NeuralNetRegressor
    from torch import nn

    from gradwidget import Recorder

    torch.manual_seed(0)
    X, y = load_diabetes(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order].astype(np.float32), y[order].astype(np.float32).reshape(-1, 1)
    module = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
    Net = _skorch_logging(NeuralNetRegressor)
    net = Net(module, optimizer=torch.optim.Adam, lr=0.01, batch_size=32, max_epochs=150, verbose=0)
    net.initialize()
    before = r2_score(y[-100:], net.predict(X[-100:]))
    with Recorder(net.module_, net.optimizer_) as rec:
        Net.holder["rec"] = rec
        net.partial_fit(X[:-100], y[:-100])
    after = r2_score(y[-100:], net.predict(X[-100:]))
    linear = LinearRegression().fit(X[:-100], y[:-100]).score(X[-100:], y[-100:])
    return rec.run, Health(
        f"held-out R^2 (a linear fit's {linear:.3f})", before, after, "after >= 0.9x linear", after >= 0.9 * linear
    )


def skorch_wine_converged():
    """skorch in a ``Pipeline`` after a ``StandardScaler`` on scikit-learn's wine data (178 wines,
    3 cultivars), logits under ``CrossEntropyLoss``, Adam at 0.01 for 300 epochs of 9 batches: the
    training loss goes to ~1e-5 (separable data), where every gradient is tiny. Healthy: validation
    accuracy."""
    import numpy as np
    import torch
    from sklearn.datasets import load_wine
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import FunctionTransformer, StandardScaler
    from skorch import NeuralNetClassifier
    from torch import nn

    from gradwidget import Recorder

    torch.manual_seed(0)
    X, y = load_wine(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    X, y = X[order], y[order]
    module = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 3))
    Net = _skorch_logging(NeuralNetClassifier)
    net = Net(
        module,
        criterion=nn.CrossEntropyLoss,
        optimizer=torch.optim.Adam,
        lr=0.01,
        batch_size=16,
        max_epochs=300,
        warm_start=True,
        verbose=0,
    )
    pipe = Pipeline(
        [("scale", StandardScaler()), ("f32", FunctionTransformer(lambda a: a.astype(np.float32))), ("net", net)]
    )
    net.initialize()
    with Recorder(net.module_, net.optimizer_) as rec:
        Net.holder["rec"] = rec
        pipe.fit(X, y)
    acc = [float(a) for a in net.history[:, "valid_acc"]]
    last = float(net.history[-1, "train_loss"])
    return rec.run, Health(
        f"validation accuracy (epoch 1 -> last; final training loss {last:.1e})",
        acc[0],
        acc[-1],
        "after >= 0.95",
        acc[-1] >= 0.95,
    )
