"""The fused statistics kernel (``collect/_fused``, a Triton kernel the Recorder runs on CUDA), run
here by Triton's interpreter on CPU tensors (switched on in conftest.py): its rows and exponent counts against a float64
reference and the eager kernels, and a Recorder taking it (the accelerator's path on CPU,
``conftest.as_accelerator``) against one that does not. bench/gpu.py checks it compiled on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("triton")

from conftest import as_accelerator, assert_same_records

from gradwidget import Recorder  # noqa: E402
from gradwidget._warnings import GradwidgetWarning  # noqa: E402
from gradwidget.collect import _fused  # noqa: E402
from gradwidget.collect._kernels import biased_exponents, count_values, grad_rows  # noqa: E402


@pytest.fixture
def interpreted():
    """Triton's interpreter (conftest.py switches it on for the session), a fresh table cache."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET is not 1)")
    _fused._last_table.clear()
    yield
    _fused._last_table.clear()


def _reference(t: torch.Tensor) -> list[float]:
    x = t.detach().double().reshape(-1)
    return [
        float(x.norm()),
        float(x.abs().sum()),
        float(x.abs().max()),
        float((x != 0).sum()),
        float(x.sum()),
    ]


def _cases(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(3 * _fused.BLOCK + 5, generator=g)  # several programs, a ragged last block
    big[:40] = 0.0
    big[40] = -0.0
    # subnormal in float32 and float16 (non-zero, no octave); a normal in bfloat16, whose
    # subnormals Triton's interpreter flushes to zero on the way to float32 (a GPU shifts the bits)
    tiny = torch.full((7,), {torch.float32: 1e-40, torch.float16: 1e-6}.get(dtype, 1e-30))
    zeros = torch.zeros(5)
    one = torch.tensor([-3.5])
    wide = torch.randn(40, 50, generator=g).t()  # transposed: dense, not contiguous
    conv = torch.randn(4, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)
    strided = torch.randn(30, generator=g)[::3]  # neither: read through a contiguous copy
    return [t.to(dtype) for t in (big, tiny.to(dtype), zeros, one, wide, conv, strided)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rows_match_a_float64_reference(interpreted, dtype):
    tensors = _cases(dtype)
    rows, counts = _fused.rows(tensors)
    assert counts is None and rows.dtype == torch.float64 and rows.shape == (5, len(tensors))
    for k, t in enumerate(tensors):
        want = _reference(t)
        np.testing.assert_allclose(rows[:, k].numpy(), want, rtol=1e-12, atol=1e-300, err_msg=f"tensor {k}")
    # max |x| and the non-zero count are exact on both paths (the eager sums are float32's: the
    # subnormals' L2 underflows there, and _norm_range takes it again)
    eager = grad_rows(tensors)
    assert torch.equal(rows[2:4], eager[2:4])


def test_exponent_counts_match_the_eager_counts(interpreted):
    tensors = _cases(torch.float32)
    rows, counts = _fused.rows(tensors, n_hist=4)
    assert counts is not None and counts.shape == (4, 256)
    want = torch.stack([count_values(biased_exponents(t).reshape(-1), 256) for t in tensors[:4]])
    # column 0 (zeros, subnormals, and the ragged block's padding) is derived by octave_bins
    assert torch.equal(counts[:, 1:], want[:, 1:])
    assert torch.equal(rows, _fused.rows(tensors)[0])  # the histogram changes no row


def test_a_non_finite_entry_shows_in_the_norm(interpreted):
    nan, inf = torch.randn(2000), torch.randn(10)
    nan[1500] = float("nan")
    inf[3] = float("-inf")
    rows, _ = _fused.rows([nan, inf, torch.ones(3)])
    assert np.isnan(rows[0, 0].item()) and np.isinf(rows[0, 1].item())
    assert rows[:, 2].tolist() == [3**0.5, 3.0, 1.0, 3.0, 3.0]


def test_a_lazily_negated_tensor_is_read_as_its_values(interpreted):
    negated = torch._neg_view(torch.arange(1.0, 6.0))  # stored unnegated, with a flag
    rows, _ = _fused.rows([negated])
    np.testing.assert_allclose(rows[:, 0].numpy(), _reference(negated), rtol=1e-12)


def test_mixed_dtypes_are_refused_not_misread(interpreted):
    with pytest.raises(TypeError, match="dtype or device changed"):
        _fused.rows([torch.ones(3), torch.ones(3, dtype=torch.float16)])
    with pytest.raises(TypeError, match="dtype or device changed"):  # recast to a dtype it cannot read
        _fused.rows([torch.ones(3, dtype=torch.float64)])


def test_a_model_recast_to_float64_mid_run_is_planned_again(interpreted, monkeypatch):
    as_accelerator(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    with Recorder(model, opt, trace_nonfinite=False) as rec:
        for i in range(4):
            if i == 2:
                model.double()  # the same parameters, float64 data: the eager path from here
                x = x.double()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    run = rec.run
    assert run.n_steps == 4
    want = [float(p.grad.double().norm()) for p in model.parameters()]
    got = [run.metric("grad_norm")[-1, run.layer_index(n)] for n, _ in model.named_parameters()]
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_what_it_takes(interpreted, monkeypatch):
    cpu = torch.device("cpu")
    assert not _fused.takes(cpu, torch.float32)  # CPU's own eager kernels unless a test asks
    as_accelerator(monkeypatch)
    assert _fused.takes(cpu, torch.float32) and _fused.takes(cpu, torch.bfloat16)
    assert not _fused.takes(cpu, torch.float64)  # read in float32: keeps the eager path
    assert not _fused.takes(torch.device("cuda"), torch.float32)  # the interpreter reads addresses on the host
    monkeypatch.setattr(_fused, "ENABLED", False)
    assert not _fused.takes(cpu, torch.float32)
    monkeypatch.setattr(_fused, "ENABLED", True)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not _fused.takes(cpu, torch.float32)  # CPU tensors only under the interpreter
    assert _fused.takes(torch.device("cuda"), torch.float16)  # a GPU's, where Triton imports


def _train(fused: bool, monkeypatch, steps: int = 4):
    as_accelerator(monkeypatch, fused)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 6), torch.randint(0, 3, (32,))
    with Recorder(model, opt, histogram_every=1, trace_nonfinite=False) as rec:
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return rec.run


def test_a_recorder_taking_the_fused_kernel_records_what_the_eager_one_does(interpreted, monkeypatch):
    calls = []
    rows = _fused.rows
    monkeypatch.setattr(_fused, "rows", lambda ts, n_hist=0: calls.append((len(ts), n_hist)) or rows(ts, n_hist))
    fused = _train(True, monkeypatch)
    assert calls == [(12, 6)] * 4  # one launch a step: 6 gradients (counted by exponent), 6 weights
    eager = _train(False, monkeypatch)
    assert len(calls) == 4
    assert_same_records(fused, eager, steps=4)


def test_a_kernel_that_fails_hands_the_statistics_to_the_eager_kernels(interpreted, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("no compiler for this GPU")

    class Kernel:
        def __getitem__(self, grid):
            return fails

    tl, _ = _fused._triton()
    monkeypatch.setattr(_fused, "_triton", lambda: (tl, Kernel()))
    monkeypatch.setattr(_fused, "broken", None)
    with pytest.warns(GradwidgetWarning, match="no compiler for this GPU"):
        run = _train(True, monkeypatch, steps=2)
    assert _fused.broken is not None and not _fused.takes(torch.device("cpu"), torch.float32)
    eager = _train(False, monkeypatch, steps=2)
    for name, values in eager.metrics.items():
        np.testing.assert_allclose(run.metric(name), values, rtol=2e-5, atol=1e-7, err_msg=name)


def test_fewer_programs_share_a_tensor_where_the_partial_counts_would_grow_large(interpreted, monkeypatch):
    tensors = _cases(torch.float32)
    want = _fused.rows(tensors, n_hist=2)
    monkeypatch.setattr(_fused, "HIST_PARTIAL_BYTES", 2 * 256 * 4)  # one program a tensor
    got = _fused.rows(tensors, n_hist=2)
    assert torch.allclose(got[0], want[0], rtol=1e-12) and torch.equal(got[1][:, 1:], want[1][:, 1:])


def test_the_address_table_follows_tensors_that_moved(interpreted):
    """The table of addresses is kept while they stay the same: new tensors of the same sizes (a
    fresh gradient after zero_grad) are read where they are, never where the last ones were."""
    first = [torch.full((3000,), 1.0), torch.full((7,), 2.0)]
    _fused.rows(first)
    table = _fused._last_table[torch.device("cpu")][1]
    assert _fused.rows(first) is not None and _fused._last_table[torch.device("cpu")][1] is table  # kept
    moved = [torch.full((3000,), 3.0), torch.full((7,), 4.0)]
    rows, _ = _fused.rows(moved)
    assert rows[4].tolist() == [9000.0, 28.0]  # the new tensors' sums
    assert _fused._last_table[torch.device("cpu")][1] is not table
