import os
import sys

import numpy as np
import pytest
import triton_interpreter

os.environ.setdefault("MPLBACKEND", "Agg")
# Triton (where installed) runs in its interpreter, on CPU tensors: a test that takes the
# accelerator's path on CPU (``as_accelerator``) then runs the fused kernel a GPU runs
# (collect/_fused.py). Set before anything imports triton: its own helpers are made at import.
os.environ.setdefault("TRITON_INTERPRET", "1")
triton_interpreter.mend()  # (the distributed tests' workers mend it too)


# bench/ holds the diagnosis zoo (``import zoo``), which tests score and check; appended, so that its
# scripts never shadow an installed module
sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))


def as_accelerator(monkeypatch, on: bool = True) -> None:
    """Take the statistics of CPU tensors as on an accelerator (``_kernels.as_accelerator``): the
    fused kernel under Triton's interpreter, else ``_foreach_norm`` for every order."""
    from gradwidget.collect import _kernels

    monkeypatch.setattr(_kernels, "_CPU_AS_ACCELERATOR", on)


@pytest.fixture(scope="session")
def zoo_cache(tmp_path_factory):
    """One cache of zoo runs for the whole session (test_zoo trains them, test_diagnosis scores them)."""
    return tmp_path_factory.mktemp("zoo-cache")


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests share 2 cores: keep torch to one thread so parallel test jobs do not thrash."""
    try:
        import torch
    except ImportError:
        yield
        return
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make_run(n_steps=10, layers=("a", "b", "c"), value=0.1, **kw):
    """A synthetic Run whose every metric is derived from one constant gradient value."""
    from gradwidget.collect.arrays import ArrayRecorder

    rec = ArrayRecorder(**kw)
    for s in range(n_steps):
        rec.record(s, {n: np.full(4, value) for n in layers})
    return rec.run


def assert_same_records(fused, eager, steps: int) -> None:
    """Two runs of one training, recorded through a fused statistics kernel and through the eager
    kernels, hold the same steps, layers, metrics (to float32 sums' rounding) and histograms."""
    assert fused.n_steps == eager.n_steps == steps and fused.layer_names == eager.layer_names
    for name, values in eager.metrics.items():
        np.testing.assert_allclose(fused.metric(name), values, rtol=2e-5, atol=1e-7, err_msg=name)
    assert np.isfinite(eager.metric("weight_norm")).all() and np.isfinite(eager.metric("grad_norm")).all()
    assert np.array_equal(fused.hist, eager.hist) and fused.hist.sum() > 0
