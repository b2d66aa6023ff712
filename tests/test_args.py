"""Every argument is checked where it is given, naming the argument and what it may be:
thresholds when a Thresholds is made (so the Recorder, analyze and ArrayRecorder share it), yes/no
options, a run's slice and downsampling, compare's labels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, Thresholds, analyze, compare
from gradwidget.collect.arrays import ArrayRecorder


class GRUTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(5, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.rnn(x)[0])


def _run(n=6):
    rec = ArrayRecorder()
    rng = np.random.default_rng(1)
    for s in range(n):
        rec.record(s, {"emb": rng.normal(size=10), "head": rng.normal(size=4)})
    return rec.run


BAD_THRESHOLDS = [
    ({"convergence_window": 0}, "convergence_window must be a whole number of at least 3"),
    ({"convergence_window": 2.5}, "convergence_window must be a whole number"),
    ({"dead_zero_fraction": 5}, "dead_zero_fraction must be between 0 and 1"),
    ({"critical_issue_ratio": 1.5}, "critical_issue_ratio must be between 0 and 1"),
    ({"relative_vanishing": 2.0}, r"relative_vanishing must be in \(0, 1\]"),
    ({"bottleneck_gain": 0}, r"bottleneck_gain must be in \(0, 1\]"),
    ({"relative_exploding": 0}, "relative_exploding must be above 0"),
    ({"chance_tolerance": 2.0}, "chance_tolerance must be between 0 and 1"),
    ({"weight_blowup": 0}, "weight_blowup must be above 0"),
    ({"summed_loss_start": 0.0}, "summed_loss_start must be above 0"),
    ({"mean_loss_bias_grad": -1.0}, "mean_loss_bias_grad must be a non-negative number"),
    ({"mean_loss_bias_grad": 0}, "mean_loss_bias_grad must be above 0"),
    ({"update_ratio_low": 0}, "update_ratio_low must be above 0"),
    ({"vanishing": True}, "vanishing must be a non-negative number"),
    ({"exploding": "big"}, "exploding must be a non-negative number"),
    ({"vanishing": float("nan")}, "vanishing must be a non-negative number"),
    (
        {"update_ratio_low": 0.5, "update_ratio_high": 0.1},
        "update_ratio_low .* must be below Thresholds.update_ratio_high",
    ),
    ({"minor_issue_ratio": 0.4}, "minor_issue_ratio .* must be below Thresholds.problem_issue_ratio"),
    ({"unstable": 0.9}, "unstable .* must be below Thresholds.stable_network"),
    ({"vanishing": 1e4}, "vanishing .* must be below Thresholds.exploding"),
]


@pytest.mark.parametrize("bad,message", BAD_THRESHOLDS)
def test_a_threshold_out_of_its_range_is_refused_where_it_is_given(bad, message):
    with pytest.raises(ValueError, match=message):
        Thresholds(**bad)
    with pytest.raises(ValueError, match=message):  # the Recorder, before any hook is installed
        Recorder(GRUTagger(), thresholds=bad)
    with pytest.raises(ValueError, match=message):
        ArrayRecorder(thresholds=bad)
    with pytest.raises(ValueError, match=message):
        analyze(_run(), thresholds=bad)


def test_thresholds_in_range_are_kept():
    t = Thresholds(dead_zero_fraction=0.5, relative_vanishing=0.01, convergence_window=3, minor_issue_ratio=0.0)
    assert t.convergence_window == 3 and Thresholds.from_dict(t.to_dict()) == t
    assert analyze(_run(), thresholds={"convergence_window": 4}).overall_health in ("Healthy", "Warning", "Critical")


@pytest.mark.parametrize("name", ["step_hooks", "track_updates", "overwrite"])
@pytest.mark.parametrize("value", [None, 1, "yes"])
def test_yes_no_options_take_true_or_false_only(name, value):
    model = GRUTagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=f"{name} must be True or False, got"):
        Recorder(model, opt, **{name: value})
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())  # nothing left behind


def test_overwrite_is_checked_by_every_writer(tmp_path):
    with pytest.raises(TypeError, match="overwrite must be True or False"):
        ArrayRecorder(log_dir=tmp_path / "a", overwrite="no")
    with pytest.raises(TypeError, match="overwrite must be True or False"):
        _run().save(tmp_path / "b", overwrite=None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_slice_takes_a_slice_of_rows_and_a_list_of_layers():
    run = _run()
    with pytest.raises(TypeError, match=r"steps must be a slice of step rows .* got int 5"):
        run.slice(steps=5)
    with pytest.raises(TypeError, match="layers must be a list of layer names or indices, got str"):
        run.slice(layers="emb")
    assert run.slice(steps=slice(-2, None), layers=["head"]).metric("grad_norm").shape == (2, 1)


@pytest.mark.parametrize("k", [0, -1, 1.5, True, None])
def test_downsampling_needs_a_positive_whole_number(k):
    run = _run()
    with pytest.raises((TypeError, ValueError), match="must be a positive int"):
        run.downsample(k)
    with pytest.raises((TypeError, ValueError), match="k must be a positive int"):
        run.downsample_by(k)
    assert run.downsample(3).n_steps == 3 and run.downsample_by(2).n_steps == 3


def test_compare_labels_are_a_list_not_a_string():
    a, b = _run(), _run(8)
    with pytest.raises(TypeError, match="labels must be a list of one name per run"):
        compare(a, b, labels="ab")
    assert compare(a, b, labels=("before", "after")).labels == ["before", "after"]
