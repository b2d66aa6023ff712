"""CPU's fused statistics (``collect/_cpu_fused``: a C loop compiled once per machine, called
through ctypes): its rows and exponent counts against a float64 reference and the eager kernels,
its build (cached, shared by processes, refused without a compiler), and a Recorder taking it
against one that takes the eager kernels."""

from __future__ import annotations

import subprocess
import threading

import numpy as np
import pytest
import torch
from torch import nn

from conftest import assert_same_records

from gradwidget import Recorder
from gradwidget.collect import _cpu_fused, _fused
from gradwidget.collect._kernels import biased_exponents, count_values, grad_rows

if not _cpu_fused.takes(torch.float32):
    pytest.skip(f"no C compiler here: {_cpu_fused.broken}", allow_module_level=True)


def _reference(t: torch.Tensor) -> list[float]:
    x = t.detach().double().reshape(-1)
    return [float(x.norm()), float(x.abs().sum()), float(x.abs().max()), float((x != 0).sum()), float(x.sum())]


def _cases(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    big = torch.randn(100_003, generator=g)  # an odd length: the vector loop's tail
    big[:40] = 0.0
    big[40] = -0.0  # zero: not counted
    tiny = torch.full(
        (7,), 1e-40 if dtype == torch.float32 else 1e-310, dtype=dtype
    )  # subnormal: non-zero, squares in range
    huge = torch.full(
        (1000,), 1e37 if dtype == torch.float32 else 1e300, dtype=dtype
    )  # float32's squares would overflow
    wide = torch.randn(40, 50, generator=g).t()  # transposed: read through a contiguous copy
    conv = torch.randn(4, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)
    strided = torch.randn(30, generator=g)[::3]
    negated = torch._neg_view(torch.arange(1.0, 6.0))  # stored unnegated, with a flag
    out = [t.to(dtype) for t in (big, wide, conv, strided, negated)]
    return out[:1] + [tiny, huge] + out[1:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rows_match_a_float64_reference(dtype):
    tensors = _cases(dtype)
    rows, counts = _cpu_fused.rows(tensors, n_full=len(tensors))
    assert counts is None and rows.dtype == torch.float64 and rows.shape == (5, len(tensors))
    for k, t in enumerate(tensors):
        want = _reference(t)
        if dtype == torch.float64 and k == 2:
            want[0] = float("inf")  # 1e300 squared: past float64 (as torch's float64 norm has it)
        np.testing.assert_allclose(rows[:, k].numpy(), want, rtol=1e-12, atol=1e-300, err_msg=f"tensor {k}")
    # max |x| and the non-zero count are exact on both paths
    eager = grad_rows(tensors, foreach_all=False)
    assert torch.equal(rows[2:4], eager[2:4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dots_match_a_float64_reference(dtype):
    """The noise probe's call: g.g, g.a, a.a of an increment and the gradient it is added to (odd
    lengths: the lanes' tail), in float64."""
    gen = torch.Generator().manual_seed(0)
    g, a = (torch.randn(1001, 37, generator=gen).to(dtype) for _ in range(2))
    g64, a64 = g.double(), a.double()
    gg, ga, aa = _cpu_fused.dots(g, a)
    want = [float((g64 * g64).sum()), float((g64 * a64).sum()), float((a64 * a64).sum())]
    assert [gg, ga, aa] == pytest.approx(want, rel=1e-12)
    assert aa + 2 * ga + gg == pytest.approx(float((g64 + a64).pow(2).sum()), rel=1e-12)
    gt, at = g.T.contiguous().T, a.T.contiguous().T  # column-major, both: read alike in place
    assert _cpu_fused.dots(gt, at) == pytest.approx(want, rel=1e-12)


def test_dots_refuses_tensors_it_cannot_pair_entry_by_entry():
    """Entries stored in different orders, a strided view, another dtype: refused (the probe then
    takes PyTorch's norm), never paired wrongly."""
    g = torch.randn(6, 5)
    for a in (g.T.contiguous().T, g.double(), torch.randn(5, 6)):
        with pytest.raises(TypeError):
            _cpu_fused.dots(g, a)
    with pytest.raises(TypeError):
        _cpu_fused.dots(g[:, ::2], g[:, 1::2])  # alike, but not one block each
    assert _fused.dots(g, g.double()) is None


def test_weights_past_n_full_get_only_their_norm():
    tensors = _cases(torch.float32)
    rows, _ = _cpu_fused.rows(tensors, n_full=2)
    assert rows[0, 2:].tolist() == pytest.approx([_reference(t)[0] for t in tensors[2:]], rel=1e-12)
    assert (rows[1:, 2:] == 0).all()


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        pytest.param(
            torch.float64,
            marks=pytest.mark.xfail(
                strict=True,
                reason="the C pass gives finite float64 entries beyond float32's range Inf's exponent; "
                "the eager kernels give them the top bin (tests/test_histogram_edges.py)",
            ),
        ),
    ],
)
def test_exponent_counts_match_the_eager_counts(dtype):
    tensors = _cases(dtype)
    _, counts = _cpu_fused.rows(tensors, n_full=len(tensors), n_hist=4)
    assert counts is not None and counts.shape == (4, 256)
    want = torch.stack([count_values(biased_exponents(t).reshape(-1), 256) for t in tensors[:4]])
    assert torch.equal(counts, want)  # column 0 too: zeros and subnormals, counted exactly here


def test_nan_and_inf_show_in_the_norm_and_the_maximum():
    x = torch.ones(1000)
    x[10], y = float("inf"), torch.ones(1000)
    y[500] = float("nan")
    rows, _ = _cpu_fused.rows([x, y], n_full=2)
    assert rows[0, 0] == np.inf and rows[2, 0] == np.inf
    assert rows[0, 1].isnan() and rows[2, 1].isnan()  # a NaN's bits are above Inf's: the largest


def test_a_tensor_of_another_dtype_is_refused_not_misread():
    with pytest.raises(TypeError, match="dtype or device changed"):
        _cpu_fused.rows([torch.ones(3), torch.ones(3, dtype=torch.float64)], n_full=2)
    with pytest.raises(TypeError, match="no CPU statistics library"):
        _cpu_fused.rows([torch.ones(3, dtype=torch.bfloat16)], n_full=1)
    assert not _cpu_fused.takes(torch.float16) and not _cpu_fused.takes(torch.bfloat16)


def test_threads_share_a_large_pass_and_give_the_same_bits(monkeypatch):
    tensors = _cases(torch.float32) + [torch.randn(300, 40), torch.randn(5000)]
    one, one_counts = _cpu_fused.rows(tensors, n_full=6, n_hist=3)
    monkeypatch.setattr(_cpu_fused, "SHARE_ENTRIES", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        shared, shared_counts = _cpu_fused.rows(tensors, n_full=6, n_hist=3)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(shared, one) and torch.equal(shared_counts, one_counts)


def test_shares_balance_the_entries_and_keep_each_tensor_once(monkeypatch):
    numels = np.array([100, 5, 60, 50, 7, 40, 3])
    assert len(_cpu_fused._shares(numels, threads=8)) == 1  # less than two shares' entries: one thread
    monkeypatch.setattr(_cpu_fused, "SHARE_ENTRIES", 100)
    assert len(_cpu_fused._shares(numels, threads=8)) == 2  # 265 entries: two shares of at least 100
    monkeypatch.setattr(_cpu_fused, "SHARE_ENTRIES", 1)
    shares = _cpu_fused._shares(numels, threads=3)
    assert sorted(np.concatenate(shares).tolist()) == list(range(7))
    assert all((np.diff(s) > 0).all() for s in shares)  # ascending: gradients before weights
    assert sorted(int(numels[s].sum()) for s in shares) == [75, 90, 100]  # largest first, to the least loaded
    assert [s.tolist() for s in _cpu_fused._shares(numels, threads=1)] == [list(range(7))]
    assert len(_cpu_fused._shares(numels[:2], threads=8)) == 2  # no more threads than tensors


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty cache folder and no library loaded yet in this process; restored afterwards."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(_cpu_fused, "broken", None)
    _cpu_fused._library.cache_clear()
    yield tmp_path
    _cpu_fused._library.cache_clear()


def test_the_library_is_built_once_and_loaded_from_the_cache(fresh_build, monkeypatch):
    assert _cpu_fused._library() is not None
    built = list((fresh_build / "gradwidget").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"  # no temporary file left beside it
    _cpu_fused._library.cache_clear()

    def no_compiler(*args, **kwargs):
        raise AssertionError("compiled again")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert _cpu_fused._library() is not None and _cpu_fused.broken is None


def test_a_cache_folder_that_cannot_be_written_builds_in_a_temporary_one(fresh_build, monkeypatch):
    blocked = fresh_build / "blocked"
    blocked.write_text("the user's own file, where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))  # a file: no folder can be made under it
    assert _cpu_fused.takes(torch.float32)
    assert blocked.read_text().startswith("the user's own file")


def test_processes_building_at_once_share_one_whole_library(fresh_build):
    paths: list = []
    threads = [threading.Thread(target=lambda: paths.append(_cpu_fused._built())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(list((fresh_build / "gradwidget").iterdir())) == 1


def test_without_a_compiler_the_eager_kernels_take_the_statistics(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", str(fresh_build / "no-such-cc"))
    assert not _cpu_fused.takes(torch.float32)
    assert _cpu_fused.broken is not None and "no-such-cc" in _cpu_fused.broken
    assert not _fused.takes(torch.device("cpu"), torch.float32, foreach_all=False)
    run = _train(fused=True, steps=2)  # records through the eager kernels
    assert np.isfinite(run.metric("grad_norm")).all()


def test_a_compiler_that_fails_is_reported_and_leaves_nothing_behind(fresh_build, monkeypatch):
    monkeypatch.setattr(_cpu_fused, "FLAGS", _cpu_fused.FLAGS + ("-fno-such-flag",))
    assert not _cpu_fused.takes(torch.float32)
    assert "failed" in str(_cpu_fused.broken)
    assert list((fresh_build / "gradwidget").iterdir()) == []


class Mixed(nn.Module):
    """Large tensors (the library), small ones of one shape (stacked), a small one of its own shape,
    a channels-last conv and a sparse embedding gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8, sparse=True)
        self.conv = nn.Conv2d(8, 16, 3).to(memory_format=torch.channels_last)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.odd = nn.Linear(16, 7)
        self.head = nn.Linear(7 * 36, 300)

    def forward(self, ids):
        h = self.emb(ids).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        h = torch.relu(self.conv(h)).permute(0, 2, 3, 1)
        for b in self.blocks:
            h = torch.tanh(b(h))
        return self.head(self.odd(h).flatten(1))


def _train(fused: bool, steps: int = 4, dtype=torch.float32):
    torch.manual_seed(0)
    model = Mixed().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    was = _fused.ENABLED
    _fused.ENABLED = fused
    try:
        rec = Recorder(model, opt, trace_nonfinite=False, histogram_every=2)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randint(0, 50, (4, 8, 8), generator=g)).square().mean().backward()
            opt.step()
        rec.detach()
    finally:
        _fused.ENABLED = was
    return rec.run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_recorder_taking_the_library_records_what_the_eager_kernels_do(dtype, monkeypatch):
    calls = []
    rows = _cpu_fused.rows
    monkeypatch.setattr(
        _cpu_fused,
        "rows",
        lambda ts, n_full, n_hist=0: calls.append((len(ts), n_full, n_hist)) or rows(ts, n_full, n_hist),
    )
    fused = _train(True, dtype=dtype)
    # one call a step: all 13 gradients (the sparse embedding gradient's stored values among them;
    # the three 16 x 16 weights and the four biases of 16 too, too few of a shape to stack: _fused's
    # LIBRARY_STACK_MEMBERS), with their 13 weights, and the gradients' exponents on histogram steps
    assert calls == [(26, 13, 13), (26, 13, 0)] * 2, calls
    eager = _train(False, dtype=dtype)
    assert len(calls) == 4
    assert_same_records(fused, eager, steps=4)
