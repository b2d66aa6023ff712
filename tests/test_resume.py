"""Resuming a run folder: ``Recorder(..., resume=True)`` continues the steps of a run
directory after a crash (or a finished phase), checked against the model's layers; a different
model is refused clearly and the folder left as it was."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, load_run
from gradwidget.storage import RunReader


def make_model(width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, width), nn.LayerNorm(width), nn.GELU(), nn.Linear(width, 4))


def train(model, opt, rec, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x, y = torch.randn(8, 10, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        rec.log(loss=loss)
        opt.step()


CRASHING_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_resume import make_model, train
    from gradwidget import Recorder

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, log_dir={log_dir!r}, histogram_every=2, trace_nonfinite=False)
    train(model, opt, rec, 5)
    with open(os.path.join({log_dir!r}, "steps.bin"), "ab") as f:
        f.write(b"half a record")  # the crash came mid-write
    os._exit(1)  # no detach, no cleanup
    """
)


def test_a_crashed_run_continues_where_it_stopped(tmp_path):
    log_dir = tmp_path / "run"
    script = CRASHING_SCRIPT.format(tests=str(__import__("pathlib").Path(__file__).parent), log_dir=str(log_dir))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    before = RunReader(log_dir)
    run_id = before._run_id
    assert before.run.n_steps == 5 and before.truncated_bytes

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, log_dir=log_dir, resume=True, histogram_every=2, trace_nonfinite=False)
    train(model, opt, rec, 4, seed=1)
    assert rec.run.steps.tolist() == list(range(9))  # in memory: the old steps, then the new ones
    rec.detach()
    after = load_run(log_dir)  # no warning: the half record was cut off before appending
    assert after.steps.tolist() == list(range(9))
    np.testing.assert_array_equal(after.metric("grad_norm")[:5], before.run.metric("grad_norm"))
    np.testing.assert_array_equal(after.metric("grad_norm"), rec.run.metric("grad_norm"))
    assert after.hist_steps.tolist() == [0, 2, 4, 6, 8]  # one histogram every 2 steps, as before
    assert RunReader(log_dir)._run_id == run_id  # the same run, for a reader following the folder


def test_a_finished_phase_continues_and_the_steps_keep_counting(tmp_path):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False) as rec:
        train(model, opt, rec, 3)
    opt2 = torch.optim.SGD(model.parameters(), lr=0.01)  # a second phase, a new optimizer
    with Recorder(model, opt2, log_dir=tmp_path / "run", resume=True, trace_nonfinite=False) as rec2:
        train(model, opt2, rec2, 3)
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == [0, 1, 2, 3, 4, 5]
    assert run.layer_names == rec.run.layer_names
    assert np.isfinite(run.scalar("loss")).all()


def test_resume_on_a_new_folder_starts_a_run(tmp_path):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, log_dir=tmp_path / "new", resume=True, trace_nonfinite=False) as rec:
        train(model, opt, rec, 2)
    assert load_run(tmp_path / "new").steps.tolist() == [0, 1]


def test_a_different_model_is_refused_and_the_folder_left_alone(tmp_path):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False) as rec:
        train(model, opt, rec, 2)
    files = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    other = make_model(width=48)
    with pytest.raises(
        ValueError, match=r"cannot resume .* other layers \(reshaped: 0.weight \(32, 10\) -> \(48, 10\)"
    ):
        Recorder(other, log_dir=tmp_path / "run", resume=True)
    deeper = nn.Sequential(*make_model(), nn.Linear(4, 4))
    with pytest.raises(ValueError, match=r"new in this model: 4.weight, 4.bias"):
        Recorder(deeper, log_dir=tmp_path / "run", resume=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == files
    assert not any(p._post_accumulate_grad_hooks for p in other.parameters())


def test_resume_arguments_are_checked(tmp_path):
    model = make_model()
    with pytest.raises(ValueError, match="resume=True continues the run in log_dir: give a log_dir"):
        Recorder(model, resume=True)
    with pytest.raises(ValueError, match="not overwrite=True"):
        Recorder(model, log_dir=tmp_path / "x", resume=True, overwrite=True)
    with pytest.raises(TypeError, match="resume must be True, False or the step number"):
        Recorder(model, log_dir=tmp_path / "x", resume="yes")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a gradwidget run"):
        Recorder(model, log_dir=tmp_path / "notes", resume=True)


def test_a_run_being_written_cannot_be_resumed_by_another_recorder(tmp_path):
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False)
    train(model, opt, rec, 1)
    with pytest.raises(FileExistsError, match="being written by another Recorder"):
        Recorder(make_model(), log_dir=tmp_path / "run", resume=True)
    rec.detach()
