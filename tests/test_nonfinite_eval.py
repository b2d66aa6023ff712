"""A NaN that never reaches the gradients is not the run's non-finite origin: a
validation forward under torch.no_grad(), or a validation loss logged to the Recorder, while every
recorded gradient stays finite. A NaN that does reach them is still traced to its origin."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze


class LSTMRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 10, batch_first=True)
        self.head = nn.Linear(10, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0][:, -1])


def _batch(g, nan=False):
    x = torch.randn(6, 5, 3, generator=g)
    if nan:
        x[2, 1, 0] = float("nan")
    return x, torch.randn(6, 1, generator=g)


@pytest.mark.parametrize("mode", [True, "auto"])  # "auto": the per-module tracer or the step's replay
@pytest.mark.parametrize("where", ["validation_forward", "validation_loss_logged", "inference_mode"])
def test_a_nan_outside_training_is_no_origin(where, mode):
    torch.manual_seed(0)
    model = LSTMRegressor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, trace_nonfinite=mode)
    g = torch.Generator().manual_seed(0)
    for _ in range(6):
        opt.zero_grad()
        x, y = _batch(g)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        rec.log(loss=loss)
        xv, yv = _batch(g, nan=True)
        ctx = torch.inference_mode() if where == "inference_mode" else torch.no_grad()
        with ctx:
            val = nn.functional.mse_loss(model(xv), yv)
        assert torch.isnan(val)
        if where == "validation_loss_logged":
            rec.log(loss=val)  # logged in place of the training loss: the gradients stay finite
        opt.step()
    rec.detach()
    run = rec.run
    assert (run.metric("nonfinite") == 0).all()
    assert run.nonfinite_origin is None
    rep = analyze(run)
    assert rep.nonfinite_origin is None
    assert "nonfinite" not in {r.cause for r in rep.diagnoses}


@pytest.mark.parametrize("mode", [True, "auto"])
def test_a_nan_in_the_training_batch_is_still_traced_to_the_input(mode):
    torch.manual_seed(0)
    model = LSTMRegressor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, trace_nonfinite=mode)
    g = torch.Generator().manual_seed(0)
    for i in range(4):
        opt.zero_grad()
        x, y = _batch(g, nan=i == 2)
        with torch.no_grad():  # a validation forward in the same step changes nothing
            model(_batch(g)[0])
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    origin = rec.run.nonfinite_origin
    assert origin is not None and origin.phase == "input" and origin.step == 2
    assert np.all(rec.run.metric("nonfinite")[2] > 0)
