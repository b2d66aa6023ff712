"""Writing a run directory never loses a user's file and never fails silently: folders that are not
runs, planted symlinks, an unwritable folder, a disk that fills up while training."""

import errno
import os
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import files
from gradwidget.collect.torch import Recorder
from gradwidget.outputs import export_csv
from gradwidget.storage import RunWriteWarning, load_run, save_run

from conftest import make_run as small_run


def setup(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def train(model, opt, steps):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 6, generator=g)).pow(2).mean()
        loss.backward()
        opt.step()


def snapshot(folder):
    return {
        p.name: (p.read_bytes() if p.is_file() and not p.is_symlink() else os.readlink(p)) for p in folder.iterdir()
    }


USER_FILES = {"steps.bin": b"my steps", "hist.bin": b"my histogram", "history.bin": b"my history"}


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_folder_of_the_users_files_with_run_names_is_refused_up_front(tmp_path, overwrite):
    d = tmp_path / "mine"
    d.mkdir()
    for name, data in USER_FILES.items():
        (d / name).write_bytes(data)
    before = snapshot(d)
    model, opt = setup()
    with pytest.raises(FileExistsError, match="is not a gradwidget run but holds steps.bin, hist.bin, history.bin"):
        Recorder(model, opt, log_dir=d, overwrite=overwrite)
    train(model, opt, 2)
    with pytest.raises(FileExistsError, match="never writes over files it did not create"):
        save_run(small_run(), d, overwrite=overwrite)
    assert snapshot(d) == before


def test_a_folder_of_other_files_needs_overwrite_and_keeps_them(tmp_path):
    d = tmp_path / "outputs"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    model, opt = setup()
    with pytest.raises(FileExistsError, match="holds other files and is not a gradwidget run"):
        Recorder(model, opt, log_dir=d)
    with Recorder(model, opt, log_dir=d, overwrite=True) as rec:
        train(model, opt, 3)
    assert (d / "notes.txt").read_text() == "keep me"
    assert load_run(d).n_steps == rec.run.n_steps == 3


def test_a_symlink_planted_in_a_run_folder_is_never_written_through(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("not yours")
    d = tmp_path / "run"
    model, opt = setup()
    with Recorder(model, opt, log_dir=d) as rec:
        train(model, opt, 1)
        (d / "meta.json.tmp").symlink_to(outside)  # planted while the run is being written
        rec._writer.write_meta()  # meta.json is rewritten (as for late layers)
        train(model, opt, 2)
    assert outside.read_text() == "not yours"
    assert load_run(d).n_steps == 3
    # a new run over the old one (overwrite=True) removes the links at the run's names, never their targets
    (d / "steps.bin").rename(d / "old")
    (d / "steps.bin").symlink_to(outside)
    model, opt = setup(1)
    with Recorder(model, opt, log_dir=d, overwrite=True):
        train(model, opt, 2)
    assert outside.read_text() == "not yours"
    assert not (d / "steps.bin").is_symlink() and load_run(d).n_steps == 2


def test_outputs_never_write_through_a_planted_temporary(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("not yours")
    (tmp_path / "t.csv.tmp").symlink_to(outside)
    export_csv(small_run(), tmp_path / "t.csv")
    assert outside.read_text() == "not yours" and (tmp_path / "t.csv").read_text().startswith("step,layer")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt", "t.csv", "t.csv.tmp"]


def test_an_unwritable_log_dir_is_refused_at_construction(tmp_path, monkeypatch):
    """(Permission bits do not stop root, who runs CI here: the check is os.access, as for a
    read-only mount, so it is stubbed to say what a read-only file system says.)"""
    monkeypatch.setattr(files.os, "access", lambda path, mode: False)
    model, opt = setup()
    with pytest.raises(PermissionError, match="cannot record to log_dir .*not writable"):
        Recorder(model, opt, log_dir=tmp_path / "ro" / "run")
    assert not (tmp_path / "ro").exists()


class FullDisk:
    """os.write that fails with ENOSPC (after writing part of what it was given) for the run's
    record files while ``full`` is set; every other write goes through."""

    def __init__(self, monkeypatch):
        self.full, self.real = False, os.write
        monkeypatch.setattr(os, "write", self)

    def __call__(self, fd, data):
        if self.full and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) in ("steps.bin", "hist.bin"):
            self.real(fd, bytes(data[: max(1, len(data) // 2)]))  # half a record lands first
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


def test_a_full_disk_mid_training_warns_once_and_loses_no_record(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch)
    d = tmp_path / "run"
    model, opt = setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rec = Recorder(model, opt, log_dir=d, histogram_every=1)
        train(model, opt, 3)
        disk.full = True
        w0 = model[0].weight.detach().clone()
        train(model, opt, 4)  # the updates still happen: no exception inside optimizer.step
        assert not torch.equal(w0, model[0].weight)
        assert rec._writer.pending_steps == 4
        on_disk = load_run(d)  # meanwhile the folder is a consistent run of the first 3 steps
        assert on_disk.n_steps == 3 and len(on_disk.hist_steps) == 3
        disk.full = False
        train(model, opt, 2)
        rec.detach()
    msgs = [str(w.message) for w in caught if issubclass(w.category, RunWriteWarning)]
    assert not any("unfinished" in str(w.message) for w in caught)  # half records were cut back
    assert len(msgs) == 2, msgs
    assert "cannot write" in msgs[0] and "No space left on device" in msgs[0]
    assert "works again" in msgs[1] and "from step 3 on" in msgs[1]
    back = load_run(d)
    assert back.n_steps == 9 and len(back.hist_steps) == 9  # every step, every histogram
    np.testing.assert_array_equal(back.metric("grad_norm"), rec.run.metric("grad_norm"))
    np.testing.assert_array_equal(back.hist, rec.run.hist)


def test_a_disk_that_stays_full_stops_recording_explicitly(tmp_path, monkeypatch):
    from gradwidget import storage

    monkeypatch.setattr(storage.writer, "BACKLOG_MAX_BYTES", 2000)
    disk = FullDisk(monkeypatch)
    d = tmp_path / "run"
    model, opt = setup()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(model, opt, log_dir=d, histogram_every=0) as rec:
            train(model, opt, 2)
            disk.full = True
            train(model, opt, 20)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RunWriteWarning)]
    assert len(msgs) == 2 and "stopped recording to" in msgs[1] and "recorder.run.save" in msgs[1], msgs
    assert rec._writer.stopped and rec.run.n_steps == 22
    assert load_run(d).n_steps == 2  # what was written stays a whole, readable run


def test_unwritten_steps_at_detach_are_reported(tmp_path, monkeypatch):
    disk = FullDisk(monkeypatch)
    d = tmp_path / "run"
    model, opt = setup()
    rec = Recorder(model, opt, log_dir=d)
    train(model, opt, 1)
    disk.full = True
    with pytest.warns(RunWriteWarning, match="cannot write"):
        train(model, opt, 2)
    with pytest.warns(RunWriteWarning, match="2 steps, from step 1 on, were never written"):
        rec.detach()


def test_a_log_dir_gone_by_the_first_step_is_a_warning_not_a_skipped_update(tmp_path):
    d = tmp_path / "run"
    model, opt = setup()
    rec = Recorder(model, opt, log_dir=d)
    d.write_text("a file took its place")
    w0 = model[0].weight.detach().clone()
    with pytest.warns(RunWriteWarning, match="not recording to .*kept in memory only"):
        train(model, opt, 2)
    assert not torch.equal(w0, model[0].weight) and rec.run.n_steps == 2
    rec.detach()
