import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.run import METRICS, Run
from gradwidget.storage import RunFormatError, RunReader, load_run, save_run, step_dtype


def sample_run(n=25):
    rec = ArrayRecorder(histogram_every=5)
    rng = np.random.default_rng(0)
    for s in range(n):
        rec.record(s * 3, {"enc.w": rng.normal(size=(4, 5)) * 1e-3, "dec.w": rng.normal(size=7)},
                   weights={"enc.w": rng.normal(size=(4, 5)), "dec.w": rng.normal(size=7)}, loss=1.0 / (s + 1))
    return rec.run


def assert_runs_equal(a: Run, b: Run):
    assert a.layer_names == b.layer_names
    assert [l.to_dict() for l in a.layers] == [l.to_dict() for l in b.layers]
    np.testing.assert_array_equal(a.steps, b.steps)
    for m in METRICS:
        np.testing.assert_array_equal(a.metric(m), b.metric(m))
    for s in ("loss", "lr", "global_norm"):
        np.testing.assert_array_equal(a.scalar(s), b.scalar(s))
    np.testing.assert_array_equal(a.hist, b.hist)
    np.testing.assert_array_equal(a.hist_steps, b.hist_steps)
    np.testing.assert_array_equal(a.edges, b.edges)
    assert a.thresholds == b.thresholds


def test_save_load_round_trip_is_exact(tmp_path):
    run = sample_run()
    save_run(run, tmp_path / "r")
    assert_runs_equal(run, load_run(tmp_path / "r"))


def test_incremental_writer_equals_save(tmp_path):
    rec = ArrayRecorder(histogram_every=5, log_dir=tmp_path / "live")
    rng = np.random.default_rng(1)
    for s in range(12):
        rec.record(s, {"a": rng.normal(size=3), "b": rng.normal(size=2)})
    rec.close()
    assert_runs_equal(rec.run, load_run(tmp_path / "live"))


def test_pandas_alone_can_read_steps(tmp_path):
    import pandas as pd

    run = sample_run(5)
    save_run(run, tmp_path / "r")
    meta = json.loads((tmp_path / "r" / "meta.json").read_text())
    rec = np.fromfile(tmp_path / "r" / "steps.bin", dtype=step_dtype(len(meta["layers"])))
    df = pd.DataFrame({"step": rec["step"], "loss": rec["loss"]})
    assert df.step.tolist() == run.steps.tolist()
    np.testing.assert_array_equal(rec["grad_norm"], run.metric("grad_norm"))


def test_truncated_last_record_is_ignored(tmp_path):
    run = sample_run(6)
    save_run(run, tmp_path / "r")
    with open(tmp_path / "r" / "steps.bin", "ab") as f:
        f.write(b"\x01\x02\x03")  # a crash in the middle of writing step 7
    with pytest.warns(UserWarning, match="unfinished last step"):
        back = load_run(tmp_path / "r")
    assert back.n_steps == 6


@pytest.mark.parametrize("damage,match", [
    ("missing", "does not exist"),
    ("nometa", "meta.json is missing"),
    ("garbage", "corrupt"),
    ("notrun", "not a gradwidget run"),
    ("file", "not a run directory"),
])
def test_bad_run_directories_give_clear_errors(tmp_path, damage, match):
    p = tmp_path / "r"
    if damage != "missing":
        save_run(sample_run(3), p)
    if damage == "nometa":
        (p / "meta.json").unlink()
    elif damage == "garbage":
        (p / "meta.json").write_bytes(b"{\x00not json")
    elif damage == "notrun":
        (p / "meta.json").write_text('{"hello": 1}')
    elif damage == "file":
        p = tmp_path / "plain.txt"
        p.write_text("x")
    with pytest.raises(RunFormatError, match=match):
        load_run(p)


def test_writer_refuses_to_clobber(tmp_path):
    save_run(sample_run(2), tmp_path / "r")
    with pytest.raises(FileExistsError, match="already holds a run"):
        save_run(sample_run(2), tmp_path / "r")
    save_run(sample_run(3), tmp_path / "r", overwrite=True)
    assert load_run(tmp_path / "r").n_steps == 3


WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    from gradwidget.collect.arrays import ArrayRecorder
    rec = ArrayRecorder(log_dir=sys.argv[1])
    for s in range(int(sys.argv[2])):
        rec.record(s, {"a": np.full(3, 0.1 * (s + 1)), "b": np.ones(2)})
        time.sleep(0.05)
    rec.close()
""")


def test_reader_tails_a_growing_run(tmp_path):
    import os

    d = tmp_path / "grow"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(d), "40"], env=env)
    try:
        deadline = time.time() + 60
        while not (d / "meta.json").exists():
            assert time.time() < deadline, "writer never started"
            time.sleep(0.02)
        reader = RunReader(d)
        seen = [reader.run.n_steps]
        while proc.poll() is None:
            reader.poll()
            seen.append(reader.run.n_steps)
            time.sleep(0.03)
        reader.poll()
        seen.append(reader.run.n_steps)
    finally:
        proc.wait(timeout=60)
    assert seen[-1] == 40
    assert len(set(seen)) > 3, f"the reader should see the run grow step by step, saw {sorted(set(seen))}"
    assert seen == sorted(seen)
    np.testing.assert_allclose(reader.run.metric("mean_abs")[:, 0], 0.1 * np.arange(1, 41), rtol=1e-5)


def test_killed_writer_leaves_a_readable_run(tmp_path):
    import os
    import signal

    d = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(d), "1000"], env=env)
    deadline = time.time() + 60
    while not (d / "steps.bin").exists() or (d / "steps.bin").stat().st_size < 2000:
        assert time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = load_run(d)
    assert run.n_steps >= 5
    assert run.steps.tolist() == list(range(run.n_steps))
