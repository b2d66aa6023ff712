"""The built-in demo: a deep sigmoid MLP trained on synthetic data, whose first layers vanish.

Sigmoid's derivative is at most 1/4, so every layer shrinks the backward signal; twelve of them
starve the first layers (mean |g| falls below the 1e-7 vanishing threshold) while the last layers
learn. It trains on CPU in a few seconds and shows the pathology gradwidget is built to see.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterator

import torch
from torch import nn


def build_demo(
    depth: int = 12,
    width: int = 64,
    n_features: int = 16,
    seed: int = 0,
    lr: float = 0.05,
    activation: type[nn.Module] = nn.Sigmoid,
):
    """Model, optimizer and an endless iterator of (x, y) batches of a synthetic task."""
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(n_features, width), activation()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), activation()]
    layers.append(nn.Linear(width, 1))
    model = nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    w_true = torch.randn(n_features, 1, generator=g)

    def batches(batch_size: int = 128) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            x = torch.randn(batch_size, n_features, generator=g)
            y = torch.tanh(x @ w_true) + 0.05 * torch.randn(batch_size, 1, generator=g)
            yield x, y

    return model, optimizer, batches()


def _progress(i: int, n: int, t0: float, loss: float, stream=sys.stderr) -> None:
    width = 30
    done = int(width * i / n)
    rate = i / max(time.perf_counter() - t0, 1e-9)
    stream.write(f"\rtraining [{'#' * done}{'.' * (width - done)}] {i}/{n} steps  loss {loss:.4f}  {rate:.0f} steps/s")
    if i == n:
        stream.write("\n")
    stream.flush()


def train_demo(
    steps: int = 300,
    *,
    recorder=None,
    log_dir=None,
    progress: bool = False,
    callback: Callable[[int, float], None] | None = None,
    model=None,
    optimizer=None,
    data=None,
    histogram_every: int = 10,
    overwrite: bool = False,
):
    """Train the demo model for ``steps`` optimizer steps under a Recorder; return the Recorder.

    Pass your own ``recorder`` (e.g. a GradientPanel's) or let one be created (with ``log_dir``;
    a run already there is replaced only with ``overwrite=True``).
    """
    from .collect.torch import Recorder

    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if model is None:
        model, optimizer, data = build_demo()
    own = recorder is None
    if own:
        recorder = Recorder(model, optimizer, log_dir=log_dir, histogram_every=histogram_every, overwrite=overwrite)
    loss_fn = nn.MSELoss()
    t0 = time.perf_counter()
    try:
        for i in range(steps):
            x, y = next(data)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            recorder.log(loss=loss)
            optimizer.step()
            if progress and (i % 10 == 9 or i == steps - 1):
                _progress(i + 1, steps, t0, loss.item())
            if callback is not None:
                callback(i, loss.item())
    finally:
        if own:
            recorder.detach()
    return recorder
