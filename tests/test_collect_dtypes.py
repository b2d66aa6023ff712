"""The torch Recorder's numbers for every floating dtype, against float64 references, and the
parameters it cannot record (complex, integer, meta device, all frozen) and bad ``log`` values."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator

from gradwidget.collect.arrays import log_hist
from gradwidget.collect.torch import Recorder

N = 100_000


class Probe(nn.Module):
    """One parameter whose gradient is exactly ``target`` (d/dw sum(w * target) = target)."""

    def __init__(self, target: torch.Tensor, weight: float = 1.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full_like(target, weight))
        self.register_buffer("target", target)

    def forward(self):
        return (self.w * self.target).sum()


def _targets(dtype):
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(N, generator=g, dtype=torch.float64)
    return {
        # every entry finite in float16, but a float16 sum of squares (or of values) overflows
        "constant_300": torch.full((N,), 300.0, dtype=dtype),
        "normal_mean_100_std_300": (100 + 300 * normal).to(dtype),
        "tiny_1e-5": (1e-5 * normal).to(dtype),
        "with_zeros": torch.where(normal > 0, 2.0 * normal, torch.zeros_like(normal)).to(dtype),
        # -0.0 is a zero though its sign bit is set (zeros are counted over |g|'s bits)
        "with_negative_zeros": torch.where(normal > 0, 2.0 * normal, torch.full_like(normal, -0.0)).to(dtype),
    }


CASES = [(dt, name) for dt in (torch.float16, torch.bfloat16, torch.float32) for name in _targets(dt)]


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu-kernels", "accelerator-kernels"])
@pytest.mark.parametrize("dtype,case", CASES, ids=[f"{str(d)[6:]}-{c}" for d, c in CASES])
def test_statistics_match_a_float64_reference(dtype, case, accelerator, monkeypatch):
    as_accelerator(monkeypatch, accelerator)
    target = _targets(dtype)[case]
    model = Probe(target, weight=300.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(model, opt, histogram_every=1) as rec:
        opt.zero_grad()
        model().backward()
        assert model.w.grad.dtype == dtype and torch.equal(model.w.grad, target)
        opt.step()
    run = rec.run
    ref = target.double().numpy()  # the gradient's exact values
    a = np.abs(ref)
    w = model.w.detach().double().numpy()

    def got(metric):
        return float(run.metric(metric)[0, 0])

    assert np.isfinite([got(m) for m in ("grad_norm", "mean_abs", "max_abs", "std", "weight_norm")]).all()
    assert got("grad_norm") == pytest.approx(np.sqrt((ref * ref).sum()), rel=1e-3)
    assert got("mean_abs") == pytest.approx(a.mean(), rel=1e-3)
    assert got("max_abs") == pytest.approx(a.max(), rel=1e-6)
    # std from sums: float32 rounding of the sum of squares costs at most ~1e-2 of the rms value
    assert got("std") == pytest.approx(ref.std(), rel=1e-3, abs=1e-2 * np.sqrt((ref * ref).mean()))
    assert got("zero_frac") == pytest.approx((ref == 0).mean(), abs=1e-6)
    assert got("nonfinite") == 0
    assert got("weight_norm") == pytest.approx(np.sqrt((w * w).sum()), rel=1e-3)
    assert run.scalar("global_norm")[0] == pytest.approx(np.sqrt((ref * ref).sum()), rel=1e-3)
    np.testing.assert_array_equal(run.hist[0, 0], log_hist(ref))
    assert not run.nonfinite().any()
    assert run.exploding()[0, 0] == (a.max() > run.thresholds.exploding)  # 300 is not exploding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_nonzero_counts_over_bits_equal_counts_over_values(dtype):
    """``count_nonzero_abs`` counts |g| as integers: -0.0 is a zero, subnormals, NaN and Inf are not."""
    from gradwidget.collect._kernels import count_nonzero_abs

    tiny = torch.finfo(dtype).tiny / 4  # a subnormal
    g = torch.tensor([0.0, -0.0, 1.5, -2.0, tiny, -tiny, float("nan"), float("inf"), -float("inf")], dtype=dtype)
    assert count_nonzero_abs(g.abs()).item() == torch.count_nonzero(g).item() == 7
    rows = torch.stack([g, -g, torch.zeros_like(g)])
    assert count_nonzero_abs(rows.abs(), dim=1).tolist() == [7, 7, 0]


def test_float16_update_norm_does_not_overflow():
    target = torch.full((N,), 1.0, dtype=torch.float16)
    model = Probe(target)
    opt = torch.optim.SGD(model.parameters(), lr=300.0)
    with Recorder(model, opt, update_every=1) as rec:
        opt.zero_grad()
        model().backward()
        opt.step()
    # each entry moves by exactly 300: the update's norm is 300 * sqrt(N), past float16's 65504
    assert rec.run.metric("update_norm")[0, 0] == pytest.approx(300 * np.sqrt(N), rel=1e-3)


class Mixed(nn.Module):
    """A real layer beside parameters no gradient statistic applies to."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)
        self.phase = nn.Parameter(torch.ones(3, dtype=torch.complex64))
        self.count = nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
        self.lazy = nn.Parameter(torch.empty(5, device="meta"))

    def forward(self, x):
        return self.lin(x).sum() + self.phase.abs().sum()


def test_complex_integer_and_meta_parameters_are_listed_and_skipped_with_one_warning():
    model = Mixed()
    opt = torch.optim.SGD([model.lin.weight, model.lin.bias, model.phase], lr=0.1)
    with pytest.warns(UserWarning, match="3 parameter") as caught:
        rec = Recorder(model, opt)
    text = str([w.message for w in caught if "cannot be recorded" in str(w.message)][0])
    assert "phase (complex (complex64))" in text and "count (not floating point (int64))" in text
    assert "lazy (on the meta device)" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no error inside optimizer.step
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).backward()
            opt.step()
    rec.detach()
    assert rec.run.n_steps == 3 and sorted(rec.run.layer_names) == ["lin.bias", "lin.weight"]
    assert set(rec.run.meta["skipped"]) == {"phase", "count", "lazy"}
    assert np.isfinite(rec.run.metric("grad_norm")).all()


def test_a_model_with_only_unrecordable_parameters_is_refused():
    model = nn.Module()
    model.z = nn.Parameter(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="no parameter of Module can be recorded: z"):
        Recorder(model)


def test_an_all_frozen_model_is_refused_up_front():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)).requires_grad_(False)
    with pytest.raises(ValueError, match="every parameter of Sequential is frozen"):
        Recorder(model)


@pytest.mark.parametrize(
    "kw,err",
    [
        ({"loss": "abc"}, TypeError),
        ({"loss": [1.0]}, TypeError),
        ({"loss": torch.ones(2, dtype=torch.complex64)}, TypeError),
        ({"lr": "0.1"}, TypeError),
        ({"step": "x"}, ValueError),
        ({"step": 2.5}, ValueError),
    ],
)
def test_log_refuses_values_that_are_not_numbers(kw, err):
    model = nn.Linear(3, 1)
    rec = Recorder(model)
    with pytest.raises(err, match=next(iter(kw))):
        rec.log(**kw)
    rec.log(loss=torch.tensor(1.5), lr=np.float32(0.1), step=np.int64(7))  # the good ones still work
    model(torch.ones(1, 3)).sum().backward()
    rec.detach()
    assert rec.run.steps.tolist() == [7] and rec.run.scalar("loss")[0] == 1.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cpu_statistics_equal_the_foreach_ones_on_the_edges_of_counting(dtype, monkeypatch):
    """CPU's ``grad_rows`` takes max |g| from ``aminmax`` over |g|'s bits and counts non-zeros only
    when the smallest |g| is 0; the foreach path (an accelerator's) counts every tensor. Both agree
    on gradients without zeros, with one, all zeros, only -0.0, only subnormals, NaN and Inf."""
    from gradwidget.collect._kernels import grad_rows

    tiny = torch.finfo(dtype).tiny / 4  # a subnormal: not zero, though its exponent bits are
    cases = [
        [1.5, -2.0, 0.25, 3.0],
        [1.5, 0.0, -2.0, 3.0],
        [0.0, 0.0, 0.0, 0.0],
        [-0.0, -0.0, 1.0, -0.0],
        [tiny, -tiny, tiny, -tiny],
        [1.0, float("nan"), -2.0, 0.0],
        [1.0, -float("inf"), 2.0, 5.0],
        [float("nan"), -0.0, float("inf"), 1.0],
    ]
    grads = [torch.tensor(c, dtype=dtype) for c in cases]
    cpu = grad_rows(grads)
    as_accelerator(monkeypatch)
    foreach = grad_rows(grads)
    assert cpu.dtype == foreach.dtype == torch.float64 and cpu.shape == (5, len(cases))
    np.testing.assert_array_equal(cpu[3].numpy(), [4, 3, 0, 1, 4, 3, 4, 3])  # non-zero counts
    np.testing.assert_allclose(cpu.numpy(), foreach.numpy(), rtol=1e-6, equal_nan=True)
    ref_max = [max(abs(v) for v in c) if not any(v != v for v in c) else float("nan") for c in cases]
    np.testing.assert_allclose(cpu[2].numpy(), torch.tensor(ref_max, dtype=dtype).double().numpy(), equal_nan=True)
