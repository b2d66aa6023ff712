"""Values are checked where they are given: ``log()``'s values and step number with the allowed range
in the message (not accepted and then refused by ``load_run``, nor an OverflowError inside
``optimizer.step()``), and a meta.json field of the wrong type refused at load, naming the key, not
an AttributeError deep inside an analysis."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import ArrayRecorder, Recorder, analyze, load_run
from gradwidget.cli import main
from gradwidget.storage import RunFormatError


class LSTMTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.emb = nn.Embedding(16, 8)
        self.lstm = nn.LSTM(8, 12, batch_first=True)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return self.out(self.lstm(self.emb(x))[0])


def train(model, opt, rec, steps, seed=0, **logged):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randint(0, 16, (4, 6), generator=g), torch.randint(0, 3, (4, 6), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        rec.log(loss=loss, **logged)
        opt.step()


BAD = [
    (dict(global_norm=-1.0), r"global_norm must be a number >= 0 \(inf or NaN for non-finite gradients\), got -1.0"),
    (dict(global_norm="2"), "global_norm must be a number"),
    (dict(global_norm=torch.ones(3)), r"global_norm must be one number, got a tensor of shape \(3,\)"),
    (dict(lr=-0.1), r"lr must be a finite number >= 0, got -0.1"),
    (dict(lr=float("nan")), r"lr must be a finite number >= 0, got nan"),
    (dict(lr=float("inf")), r"lr must be a finite number >= 0, got inf"),
    (
        dict(step=2**63),
        r"step must be a whole number from 0 to 2\*\*53 - 1 \(9007199254740991\), got 9223372036854775808",
    ),
    (dict(step=1e300), r"step must be a whole number from 0 to 2\*\*53 - 1 .*got 1e\+300"),
    (dict(step=-3), r"step must be a whole number from 0 to 2\*\*53 - 1 .*got -3"),
    (dict(step=2.5), "step must be a whole number"),
]


@pytest.mark.parametrize("given, match", BAD, ids=[f"{next(iter(k))}={next(iter(k.values()))!r:.12}" for k, _ in BAD])
def test_log_refuses_a_value_out_of_its_range_where_it_is_given(tmp_path, given, match):
    model = LSTMTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False) as rec:
        train(model, opt, rec, 2)
        with pytest.raises((ValueError, TypeError), match=match):
            rec.log(**given)
        train(model, opt, rec, 2, seed=1)  # nothing of the refused value is left: training goes on
    run = load_run(tmp_path / "run")  # and the folder loads
    assert run.steps.tolist() == [0, 1, 2, 3]
    assert np.isfinite(run.scalar("global_norm")).all() and (run.scalar("global_norm") >= 0).all()


def test_the_edges_of_each_range_are_accepted(tmp_path):
    model = LSTMTagger()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False) as rec:
        train(model, opt, rec, 1, global_norm=0.0, lr=0.0)
        rec.log(loss=float("nan"), global_norm=float("inf"), step=2**53 - 1)
        train(model, opt, rec, 1)
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == [0, 2**53 - 1]
    assert run.scalar("global_norm")[0] == 0.0 and np.isinf(run.scalar("global_norm")[1])


def test_array_recorder_and_trainer_callbacks_check_the_same_ranges():
    rec = ArrayRecorder()
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        rec.record(0, {"w": np.ones(3)}, lr=-1.0)
    with pytest.raises(ValueError, match="step must be a whole number from 0 to 2\\*\\*53 - 1"):
        rec.record(2**63, {"w": np.ones(3)})
    assert rec.run is None or rec.run.n_steps == 0
    pytest.importorskip("transformers")
    from gradwidget.integrations.transformers import GradwidgetCallback

    cb = GradwidgetCallback()  # before training starts: checked at once, not at the first step
    with pytest.raises(ValueError, match="step must be a whole number from 0"):
        cb.log(step=1e300)
    with pytest.raises(ValueError, match="lr must be a finite number >= 0"):
        cb.log(lr=float("nan"))


def _recorded(tmp_path):
    model = LSTMTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False) as rec:
        train(model, opt, rec, 3)
    return tmp_path / "run"


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("noise_scale", "first", "meta.noise_scale must be an object, got 'first'"),
        ("noise_scale", {"every": "8"}, "meta.noise_scale.every must be a whole number, got '8'"),
        ("grad_reset", {"checked": "299"}, "meta.grad_reset.checked must be a whole number, got '299'"),
        ("clipped_at", "1.0", "meta.clipped_at must be a number, got '1.0'"),
        ("replicas", [1], r"meta.replicas must be an object, got \[1\]"),
    ],
)
def test_a_meta_field_of_the_wrong_type_is_refused_at_load_naming_the_key(tmp_path, capsys, key, value, match):
    run_dir = _recorded(tmp_path)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["meta"][key] = value
    (run_dir / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(RunFormatError, match=match):
        load_run(run_dir)
    assert main(["report", str(run_dir), "-o", str(tmp_path / "r.html")]) == 2
    assert match.replace("\\", "") in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_a_meta_with_every_field_right_still_loads_and_analyzes(tmp_path):
    run_dir = _recorded(tmp_path)
    meta = json.loads((run_dir / "meta.json").read_text())
    meta["meta"]["clipped_at"] = 1  # a whole number is a number
    meta["meta"]["from_a_newer_gradwidget"] = ["kept"]  # unknown fields are kept unchecked
    (run_dir / "meta.json").write_text(json.dumps(meta))
    run = load_run(run_dir)
    assert run.meta["from_a_newer_gradwidget"] == ["kept"]
    assert analyze(run) is not None
