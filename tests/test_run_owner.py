"""One owner per run folder, and what is in memory is on disk: a second writer on a folder
a live Recorder is writing is refused (overwrite=True included); a writer whose files were removed
under it stops, saying so, and never rewrites meta.json over the run now there; a step whose
optimizer.step() raised is written like any other."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, load_run
from gradwidget._warnings import GradwidgetWarning
from gradwidget.storage import RunWriteWarning


class Decoder(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(20, 16)
        self.block = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.out = nn.Linear(16, 20)

    def forward(self, x):
        h = self.emb(x)
        return self.out(self.block(h, h))


def _step(model, opt, rec=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 20, (4, 5), generator=g)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    if rec is not None:
        rec.log(loss=loss)
    opt.step()


def test_a_second_recorder_on_a_folder_being_written_is_refused(tmp_path):
    a = Decoder()
    opt_a = torch.optim.Adam(a.parameters())
    rec_a = Recorder(a, opt_a, log_dir=tmp_path / "run", trace_nonfinite=False)
    for i in range(3):
        _step(a, opt_a, rec_a, i)
    b = Decoder(1)
    with pytest.raises(FileExistsError, match="being written by another Recorder now"):
        Recorder(b, torch.optim.Adam(b.parameters()), log_dir=tmp_path / "run", overwrite=True)
    assert not any(p._post_accumulate_grad_hooks for p in b.parameters())  # nothing left on b
    for i in range(3, 5):
        _step(a, opt_a, rec_a, i)
    assert load_run(tmp_path / "run").steps.tolist() == [0, 1, 2, 3, 4]  # a's steps, all of them
    rec_a.detach()
    rec_b = Recorder(b, torch.optim.Adam(b.parameters()), log_dir=tmp_path / "run", overwrite=True)
    rec_b.detach()  # once a is done, the folder may be replaced


def test_rerunning_the_cell_on_the_same_model_hands_the_folder_over(tmp_path):
    model = Decoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False)
    _step(model, opt, rec)
    with pytest.warns(GradwidgetWarning, match="previous Recorder on this Decoder was detached"):
        rec2 = Recorder(model, opt, log_dir=tmp_path / "run", overwrite=True, trace_nonfinite=False)
    for i in range(2):
        _step(model, opt, rec2, i)
    rec2.detach()
    assert load_run(tmp_path / "run").steps.tolist() == [0, 1]


def test_a_writer_whose_files_were_removed_stops_and_leaves_the_new_run_alone(tmp_path):
    model = Decoder()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False)
    _step(model, opt, rec)
    other = Decoder(2)
    opt_o = torch.optim.SGD(other.parameters(), lr=0.01)
    with Recorder(other, opt_o, trace_nonfinite=False) as rec_o:
        _step(other, opt_o, rec_o)
    for name in ("steps.bin", "hist.bin"):  # someone removed the files (no lock on their system)
        (tmp_path / "run" / name).unlink()
    rec_o.run.save(tmp_path / "run", overwrite=True)
    with pytest.warns(RunWriteWarning, match="stopped recording to .*steps.bin was removed"):
        _step(model, opt, rec)
    _step(model, opt, rec)  # said once
    rec.detach()
    on_disk = load_run(tmp_path / "run")  # the new run, readable and whole
    assert on_disk.n_steps == rec_o.run.n_steps
    np.testing.assert_array_equal(on_disk.metric("grad_norm"), rec_o.run.metric("grad_norm"))
    assert rec.run.n_steps == 3  # the first recorder's steps are kept in memory


class FlakySGD(torch.optim.SGD):
    """An SGD whose step raises once, after its pre-hooks ran (a user's optimizer failing)."""

    fail_at = 2

    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == self.fail_at + 1:
            raise RuntimeError("optimizer failed")
        return super().step(closure)


@pytest.mark.parametrize("then", ["more_steps", "detach"])
def test_a_step_whose_optimizer_step_raised_is_in_memory_and_on_disk(tmp_path, then):
    model = Decoder()
    opt = FlakySGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", update_every=1, trace_nonfinite=False)
    for i in range(4 if then == "more_steps" else 3):
        try:
            _step(model, opt, rec, i)
        except RuntimeError:
            pass
    rec.detach()
    disk = load_run(tmp_path / "run")
    assert rec.run.steps.tolist() == disk.steps.tolist() == list(range(len(disk.steps)))
    assert disk.n_steps == (4 if then == "more_steps" else 3)
    np.testing.assert_array_equal(disk.metric("grad_norm"), rec.run.metric("grad_norm"))
    assert np.isnan(disk.metric("update_norm")[2]).all()  # the failed step moved nothing we measured
    assert not np.isnan(disk.metric("update_norm")[1]).all()


def test_a_file_system_without_flock_reads_as_no_writer(tmp_path, monkeypatch):
    import errno

    from gradwidget.storage import _owner

    (tmp_path / "steps.bin").write_bytes(b"")

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(_owner.fcntl, "flock", no_locks)
    assert _owner.held(tmp_path / "steps.bin") is False
    _owner.hold(_owner.os.open(tmp_path / "steps.bin", _owner.os.O_RDONLY))  # no error either
