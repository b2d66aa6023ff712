import json
import textwrap
import time

import numpy as np
import pytest

from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.run import METRICS, Run
from gradwidget.storage import RunFormatError, RunReader, load_run, save_run, step_dtype
from writer_proc import start_writer


def sample_run(n=25):
    rec = ArrayRecorder(histogram_every=5)
    rng = np.random.default_rng(0)
    for s in range(n):
        rec.record(
            s * 3,
            {"enc.w": rng.normal(size=(4, 5)) * 1e-3, "dec.w": rng.normal(size=7)},
            weights={"enc.w": rng.normal(size=(4, 5)), "dec.w": rng.normal(size=7)},
            loss=1.0 / (s + 1),
        )
    return rec.run


def assert_runs_equal(a: Run, b: Run):
    assert a.layer_names == b.layer_names
    assert [info.to_dict() for info in a.layers] == [info.to_dict() for info in b.layers]
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


@pytest.mark.parametrize(
    "damage,match",
    [
        ("missing", "does not exist"),
        ("nometa", "meta.json is missing"),
        ("garbage", "corrupt"),
        ("notrun", "not a gradwidget run"),
        ("file", "not a run directory"),
    ],
)
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
    d = tmp_path / "grow"
    proc = start_writer(WRITER, d, 40)
    try:
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
    import signal

    d = tmp_path / "killed"
    proc = start_writer(
        WRITER, d, 1000, ready=lambda d: (d / "steps.bin").exists() and (d / "steps.bin").stat().st_size >= 2000
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = load_run(d)
    assert run.n_steps >= 5
    assert run.steps.tolist() == list(range(run.n_steps))


def write_run(path, value, n, layers=("a.weight", "b.weight")):
    """A run of ``n`` steps whose every metric is ``value``, written the way a Recorder writes."""
    from gradwidget.storage import RunWriter

    run = Run(list(layers))
    w = RunWriter(path, run, overwrite=True)
    for s in range(n):
        run.append(s, np.full((len(METRICS), len(layers)), value, np.float32))
        w.append_new()
    w.close()
    return w


def test_reader_starts_over_when_a_script_reruns_into_the_folder(tmp_path):
    d = tmp_path / "r"
    write_run(d, 1.0, 20)
    reader = RunReader(d)
    old = reader.run
    write_run(d, 2.0, 30)  # the training script restarted with overwrite=True
    assert reader.poll() is True
    assert reader.replaced == 1
    assert reader.run.steps.tolist() == list(range(30))
    assert set(reader.run.metric("grad_norm").ravel().tolist()) == {2.0}  # nothing of the old run
    assert reader.run.version > old.version  # views keyed on the version refresh
    assert reader.poll() is False and reader.replaced == 1


def test_reader_starts_over_on_a_rerun_with_fewer_steps_and_other_layers(tmp_path):
    d = tmp_path / "r"
    write_run(d, 1.0, 20)
    reader = RunReader(d)
    write_run(d, 3.0, 5, layers=("x", "y", "z"))
    assert reader.poll()
    assert reader.run.layer_names == ["x", "y", "z"] and reader.run.n_steps == 5


def test_reader_without_run_id_detects_a_shrunken_steps_file(tmp_path):
    d = tmp_path / "r"
    write_run(d, 1.0, 20)
    meta = json.loads((d / "meta.json").read_text())
    del meta["run_id"]  # a run written before meta.json carried an id
    (d / "meta.json").write_text(json.dumps(meta))
    reader = RunReader(d)
    write_run(d, 2.0, 5)
    (d / "meta.json").write_text(json.dumps(meta))
    assert reader.poll() and reader.run.n_steps == 5


def test_reader_takes_new_edges_and_statuses_of_the_same_run_without_starting_over(tmp_path):
    from gradwidget.storage import RunWriter

    run = Run(["a", "b"])
    w = RunWriter(tmp_path / "r", run)
    run.append(0, np.ones((len(METRICS), 2)))
    w.append_new()
    reader = RunReader(tmp_path / "r")
    run.edges = np.array([[0, 1]], np.int32)
    run.layers[1].status = "unused"
    w.write_meta()  # what the torch Recorder does once the first forward pass has shown the edges
    run.append(1, np.ones((len(METRICS), 2)))
    w.append_new()
    w.close()
    assert reader.poll()
    assert reader.replaced == 0 and reader.run.n_steps == 2
    assert reader.run.edges.tolist() == [[0, 1]]
    assert reader.run.layers[1].status == "unused"


def test_reader_keeps_the_old_run_while_the_folder_is_being_recreated(tmp_path):
    import shutil

    d = tmp_path / "r"
    write_run(d, 1.0, 20)
    reader = RunReader(d)
    shutil.rmtree(d)
    assert reader.poll() is False and reader.run.n_steps == 20
    write_run(d, 2.0, 3)
    assert reader.poll() and reader.run.n_steps == 3


def _edit_meta(p, **changes):
    meta = json.loads((p / "meta.json").read_text())
    for k, v in changes.items():
        if callable(v):
            v(meta)
        else:
            meta[k] = v
    (p / "meta.json").write_text(json.dumps(meta))


def _set_layer(key, value):
    def f(meta):
        meta["layers"][0][key] = value

    return f


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(thresholds=[1, 2]), '"thresholds" must be an object'),
        (dict(thresholds="x"), '"thresholds" must be an object'),
        (dict(thresholds={"vanishing": "x"}), "thresholds must be numbers"),
        (dict(version="2"), '"version" must be a positive integer'),
        (dict(edges=[[0, 9]]), "edge \\[0, 9\\] is not a pair of layer indices in 0..1"),
        (dict(edges="x"), '"edges" must be a list'),
        (dict(layers=5), '"layers" must be a list'),
        (dict(layers=["a"]), "layers\\[0\\] must be an object"),
        (dict(meta=[1]), '"meta" must be an object'),
        (dict(x=_set_layer("numel", "x")), "layers\\[0\\] \\(enc.w\\) has numel='x', expected int"),
        (dict(x=_set_layer("shape", 5)), "has shape=5, expected a list of sizes"),
        (dict(x=_set_layer("status", "gone")), "has status 'gone'"),
    ],
)
def test_damaged_meta_json_is_one_clear_error(tmp_path, change, match):
    p = tmp_path / "r"
    save_run(sample_run(3), p)
    _edit_meta(p, **change)
    with pytest.raises(RunFormatError, match=match) as e:
        load_run(p)
    assert "meta.json" in str(e.value)


@pytest.mark.parametrize("name", ["steps.bin", "hist.bin"])
def test_a_record_file_that_is_a_directory_is_a_clear_error(tmp_path, name):
    p = tmp_path / "r"
    save_run(sample_run(3), p)
    (p / name).unlink()
    (p / name).mkdir()
    with pytest.raises(RunFormatError, match=f"{name} is not a file"):
        load_run(p)


@pytest.mark.parametrize(
    "name,match",
    [
        ("steps.bin", "steps.bin is damaged: record 0 is not a valid step"),
        ("hist.bin", "hist.bin is damaged: record 0 is not a valid histogram"),
    ],
)
def test_random_record_files_are_refused(tmp_path, name, match):
    p = tmp_path / "r"
    save_run(sample_run(10), p)
    size = (p / name).stat().st_size
    (p / name).write_bytes(np.random.default_rng(0).bytes(size))
    with pytest.raises(RunFormatError, match=match):
        load_run(p)


def test_meta_json_with_an_extra_layer_is_refused(tmp_path):
    p = tmp_path / "r"
    save_run(sample_run(10), p)
    _edit_meta(p, x=lambda m: m["layers"].append(dict(m["layers"][0], name="extra")))
    with pytest.raises(
        RunFormatError, match="meta.json lists 3 layers, but steps.bin holds 10 whole records of 2 layers"
    ):
        load_run(p)


def test_repeated_steps_are_refused(tmp_path):
    p = tmp_path / "r"
    save_run(sample_run(4), p)
    b = (p / "steps.bin").read_bytes()
    (p / "steps.bin").write_bytes(b + b)
    with pytest.raises(RunFormatError, match="record 4 .* step number 0 does not follow"):
        load_run(p)


def test_steps_cut_mid_record_keep_every_whole_step_and_its_histograms(tmp_path):
    p = tmp_path / "r"
    run = sample_run(10)  # histograms at steps 0, 15 (every 5th record, steps are 3 apart)
    save_run(run, p)
    rec = step_dtype(2).itemsize
    with open(p / "steps.bin", "r+b") as f:
        f.truncate(6 * rec + 10)  # killed while writing the 7th record; hist.bin is whole
    with pytest.warns(UserWarning, match="unfinished last step"):
        back = load_run(p)
    assert back.steps.tolist() == run.steps[:6].tolist()
    assert back.hist_steps.tolist() == [0, 15]


def windowed_run(n=1000, max_steps=100, history_capacity=2048):
    """A rolling-window run: ``n`` steps recorded, the last ``max_steps`` in the window."""
    run = Run(["a", "b"], max_steps=max_steps, history_capacity=history_capacity)
    rng = np.random.default_rng(2)
    for s in range(n):
        run.append(
            s,
            rng.random((len(METRICS), 2)),
            {"loss": 1.0 / (s + 1)},
            hist=np.ones((2, 64), np.uint32) if s % 10 == 0 else None,
        )
    return run


@pytest.mark.parametrize("capacity", [2048, 50])  # 50: history decimated, some steps still pending
def test_saving_a_rolling_window_run_keeps_its_history(tmp_path, capacity):
    run = windowed_run(history_capacity=capacity)
    assert run.n_steps == 100 and run.history.n_steps > 0
    save_run(run, tmp_path / "r")
    back = load_run(tmp_path / "r")
    assert_runs_equal(run, back)  # the window, exactly
    older = [r for r in (run.history, run._pending) if r is not None]
    kept = np.concatenate([r.steps for r in older])
    assert back.history.steps.tolist() == kept.tolist()
    assert back.history.steps[0] == 0 and back.history.steps[-1] < back.steps[0]
    np.testing.assert_array_equal(
        back.history.metric("grad_norm"), np.concatenate([r.metric("grad_norm") for r in older])
    )
    np.testing.assert_array_equal(back.history.scalar("loss"), np.concatenate([r.scalar("loss") for r in older]))


def test_overwriting_a_saved_run_drops_its_old_history(tmp_path):
    save_run(windowed_run(), tmp_path / "r")
    save_run(sample_run(3), tmp_path / "r", overwrite=True)
    assert load_run(tmp_path / "r").history is None


def test_a_history_overlapping_the_window_is_refused(tmp_path):
    p = tmp_path / "r"
    save_run(windowed_run(), p)
    (p / "history.bin").write_bytes(
        (p / "history.bin").read_bytes() + (p / "steps.bin").read_bytes()[: step_dtype(2).itemsize]
    )
    with pytest.raises(RunFormatError, match="history.bin is damaged: record .* not before the first step"):
        load_run(p)


def test_thresholds_keep_their_types_through_a_run_directory(tmp_path):
    from gradwidget.thresholds import Thresholds

    run = Run(["a"], thresholds=Thresholds(convergence_window=40, vanishing=1e-6))
    save_run(run, tmp_path / "r")
    t = load_run(tmp_path / "r").thresholds
    assert t == run.thresholds and type(t.convergence_window) is int and type(t.vanishing) is float
