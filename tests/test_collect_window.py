"""The steps max_steps="auto" keeps in memory are shown to the user, and folding them is said once."""

import warnings

import pytest
import torch
from torch import nn

from gradwidget._warnings import GradwidgetWarning
from gradwidget.collect.torch import Recorder


def test_the_window_is_stated_in_the_repr():
    model = nn.Linear(4, 1)
    rec = Recorder(model, memory_budget=64 << 20)
    per_step = (
        40 * 2 + 32 + 512 * 2 / 10
    )  # two layers (float32 metrics, the exact non-finite count), uint64 histograms every 10 steps
    n = int((64 << 20) / (2 * per_step))
    assert f"keeping the last {n:,} steps in memory (max_steps='auto': a 64 MiB memory_budget)" in repr(rec)
    rec.detach()
    with Recorder(model, max_steps=500) as rec:
        assert "keeping the last 500 steps in memory (max_steps=500)" in repr(rec)
    with Recorder(model, max_steps=None) as rec:
        assert "keeping every step in memory (max_steps=None)" in repr(rec)


def _train(rec, model, opt, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 2)).sum().backward()
        opt.step()


def test_one_warning_when_auto_starts_folding_steps_naming_how_to_keep_more(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Recorder(
        model, opt, memory_budget=1 << 10, histogram_every=0, trace_nonfinite=False, log_dir=tmp_path / "run"
    ) as rec:
        assert "keeping the last 1,000 steps" in repr(rec)  # the floor
        with warnings.catch_warnings():
            warnings.simplefilter("error", GradwidgetWarning)
            _train(rec, model, opt, 1000)  # fills the window: nothing folded, nothing said
        with pytest.warns(GradwidgetWarning) as said:
            _train(rec, model, opt, 30)
    assert len(said) == 1
    text = str(said[0].message)
    assert "keeping the last 1,000 steps in memory" in text and "run.history" in text
    assert "memory_budget=" in text and "max_steps=None" in text and str(tmp_path / "run") in text
    assert rec.run.n_steps == 1000 and rec.run.history is not None


def test_no_warning_for_a_window_the_user_chose():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GradwidgetWarning)
        with Recorder(model, opt, max_steps=5, trace_nonfinite=False) as rec:
            _train(rec, model, opt, 12)
    assert rec.run.n_steps == 5
