"""Norms without overflow or underflow wherever the value fits float32: finite gradients
whose squares leave float32's range still get their true norm, max |g| is never altered, and tiny
gradients are not read as zeros (no dead units)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator

from gradwidget import Recorder, analyze


class ConvNet(nn.Module):
    """A 1-d conv net with a norm layer: stacked small tensors and larger ones, both paths."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 12, 5)
        self.norm = nn.GroupNorm(3, 12)
        self.fc = nn.Linear(12 * 12, 300)
        self.out = nn.Linear(300, 2)

    def forward(self, x):
        h = self.norm(torch.relu(self.conv(x))).flatten(1)
        return self.out(torch.relu(self.fc(h)))


def _record(scale: float, dtype=torch.float32, steps: int = 12):
    torch.manual_seed(0)
    model = ConvNet().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay as they are
    rec = Recorder(model, opt, trace_nonfinite=False, histogram_every=1)
    g = torch.Generator().manual_seed(1)
    expected = []
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 3, 16, generator=g).to(dtype)).sum().backward()
        grads = {}
        for name, p in model.named_parameters():  # gradients of this magnitude, signs and sizes mixed
            p.grad.copy_((p.grad.float().sign() + 0.5) * scale)
            grads[name] = p.grad
        expected.append(
            {n: (float(torch.linalg.vector_norm(t.double())), float(t.abs().max())) for n, t in grads.items()}
        )
        opt.step()
    rec.detach()
    return rec.run, expected


@pytest.mark.parametrize(
    "scale,path",
    [(s, p) for s in (1e18, 3e16, 1e-23, 1e-30) for p in ("cpu", "foreach")] + [(1e18, "fused"), (1e-30, "fused")],
)
def test_norms_of_finite_float32_gradients_are_their_true_values(scale, path, monkeypatch):
    """Each path: CPU's eager kernels, the accelerator's eager ones (``_foreach_norm``, where Triton is not), and the fused
    kernel (collect/_fused.py, in Triton's interpreter: three steps, two scales)."""
    from gradwidget.collect import _fused

    steps = 12
    if path != "cpu":
        as_accelerator(monkeypatch)
    if path == "fused":
        if not _fused.takes(torch.device("cpu"), torch.float32):
            pytest.skip("the fused kernel runs here only under Triton's interpreter")
        steps = 3
    elif path == "foreach":
        monkeypatch.setattr(_fused, "ENABLED", False)
    run, expected = _record(scale, steps=steps)
    for row, exp in enumerate(expected):
        for name, (norm, top) in exp.items():
            j = run.layer_index(name)
            assert run.metric("grad_norm")[row, j] == pytest.approx(norm, rel=1e-4)  # float32 sums of 43,200 squares
            assert run.metric("max_abs")[row, j] == pytest.approx(top, rel=1e-6)  # never forced to inf
    assert np.isfinite(run.metric("grad_norm")).all() and (run.metric("grad_norm") > 0).all()
    assert (run.metric("nonfinite") == 0).all() and (run.metric("zero_frac") == 0).all()
    assert np.isfinite(run.metric("std")).all()
    causes = {r.cause for r in analyze(run).diagnoses}
    assert "dead_units" not in causes and "nonfinite" not in causes
    if scale > 1:
        assert np.isfinite(run.scalar("global_norm")).all()


def test_bfloat16_gradients_too():
    run, expected = _record(1e18, dtype=torch.bfloat16, steps=3)
    j = run.layer_index("fc.weight")
    assert run.metric("grad_norm")[-1, j] == pytest.approx(expected[-1]["fc.weight"][0], rel=1e-3)


def test_a_gradient_that_is_not_finite_still_counts_and_marks_max_abs():
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    rec = Recorder(model, opt, trace_nonfinite=False)
    opt.zero_grad()
    model(torch.randn(2, 3, 16)).sum().backward()
    model.fc.weight.grad[0, :3] = torch.tensor([float("nan"), float("inf"), 1e18])
    opt.step()
    rec.detach()
    j = rec.run.layer_index("fc.weight")
    assert rec.run.metric("nonfinite")[0, j] == 2 and rec.run.metric("max_abs")[0, j] == np.inf
    k = rec.run.layer_index("out.weight")
    assert rec.run.metric("nonfinite")[0, k] == 0 and np.isfinite(rec.run.metric("max_abs")[0, k])
