"""A histogram counts every entry in its bin whatever else the tensor holds, and a mean that fits
float32 is finite: subnormals beside NaN/Inf, finite float64 values beyond float32's range (top bin,
not the Inf/NaN count), a non-zero count never rounded through the float32 zero fraction, bfloat16
gradients at the dtype's max. Recorded through real backwards of a small model, by PyTorch's eager
kernels and by the Triton kernel (its interpreter on CPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator
from gradwidget import Recorder
from gradwidget.collect import _fused
from gradwidget.schema import HIST_LOG2_LO, N_BINS


class Gate(nn.Module):
    """y = x * w (w one value per feature), then a linear read-out: the gradient of ``w`` at
    ``x = v`` and a read-out of ones is ``v`` itself, entry by entry."""

    def __init__(self, n: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(n, dtype=dtype))
        self.out = nn.Linear(n, 1, bias=False, dtype=dtype)
        nn.init.ones_(self.out.weight)

    def forward(self, x):
        return self.out(x * self.w)


BACKENDS = ["eager", "triton"]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    if request.param == "eager":
        monkeypatch.setattr(_fused, "ENABLED", False)  # PyTorch's own kernels
        return False
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off")
    as_accelerator(monkeypatch)  # the accelerator's path: Triton's kernel under its interpreter
    return True


def record(values, dtype, accelerator):
    """The Gate's ``w`` gradient row (histogram by octave exponent, metrics) after one step."""
    v = torch.tensor(values, dtype=dtype)
    model = Gate(len(v), dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(model, opt, histogram_every=1, trace_nonfinite=False, noise_scale=False) as rec:
        model(v.unsqueeze(0)).sum().backward()
        opt.step()
    run = rec.run
    col = run.layer_index("w")
    h = run.hist[0, col]
    bins = {int(k) + HIST_LOG2_LO: int(h[k]) for k in np.flatnonzero(h)}
    return bins, {m: float(run.metric(m)[0, col]) for m in ("nonfinite", "mean_abs", "zero_frac")}


@pytest.mark.parametrize(
    "values, bins, nonfinite",
    [
        ([1e-45, 0.0, float("inf")], {HIST_LOG2_LO: 1}, 1),  # the subnormal beside an Inf
        ([1e-40, 1e-45, 0.0, float("nan"), 2.0], {HIST_LOG2_LO: 2, 1: 1}, 1),
        ([1e-45, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], {HIST_LOG2_LO: 1, 0: 1}, 0),  # zero_frac 5/7: not exact in float32
    ],
)
def test_subnormals_are_counted_whatever_else_the_tensor_holds(backend, values, bins, nonfinite):
    got, metrics = record(values, torch.float32, backend)
    assert got == bins
    assert metrics["nonfinite"] == nonfinite


def test_finite_float64_beyond_float32_lands_in_the_top_bin_not_in_none(monkeypatch):
    monkeypatch.setattr(_fused, "ENABLED", False)  # float64 is read by PyTorch's own kernels
    got, metrics = record([1e300, 1e-300, 1.0, -1e39], torch.float64, False)
    top = HIST_LOG2_LO + N_BINS - 1
    assert got == {top: 2, HIST_LOG2_LO: 1, 0: 1}  # 1e-300: below every bin, in the lowest
    assert metrics["nonfinite"] == 0


def test_bfloat16_gradients_at_the_dtypes_max_have_a_finite_mean(backend):
    big = float(torch.finfo(torch.bfloat16).max)
    got, metrics = record([big] * 4 + [-big] * 4, torch.bfloat16, backend)
    assert metrics["mean_abs"] == pytest.approx(big, rel=1e-6)  # 3.39e38 fits float32
    assert np.isfinite(metrics["mean_abs"]) and metrics["nonfinite"] == 0
    assert got == {HIST_LOG2_LO + N_BINS - 1: 8}


def test_merged_histograms_count_in_64_bits_and_are_saved_unwrapped(tmp_path):
    """Two layers of 3e9 entries in one bin: their group holds 6e9 (it wrapped to 1.7e9 in 32
    bits); a run directory keeps 64-bit counts (format 2), so the merged run saves and loads whole."""
    from gradwidget import Run, load_run
    from gradwidget.schema import METRICS

    run = Run(["enc.weight", "dec.weight"])
    hist = np.zeros((2, N_BINS), np.uint32)
    hist[:, 40] = 3_000_000_000
    run.append(0, np.ones((len(METRICS), 2), np.float32), {"loss": 1.0}, hist)
    merged = run.merge_layers([[0, 1]], ["model"])
    assert int(merged.hist[0, 0, 40]) == 6_000_000_000
    merged.save(tmp_path / "merged")
    assert int(load_run(tmp_path / "merged").hist[0, 0, 40]) == 6_000_000_000
    run.save(tmp_path / "run")  # the layers merge the same after loading
    assert int(load_run(tmp_path / "run").merge_layers([[0, 1]], ["model"]).hist[0, 0, 40]) == 6_000_000_000
