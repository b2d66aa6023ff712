"""Reading a damaged or hostile run directory: every failure is a RunFormatError (or a TypeError
for a wrong argument) with a plain message, never a hang, a MemoryError or a wrong empty run."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.storage import META_MAX_BYTES, RunFormatError, load_run, save_run, step_dtype
from writer_proc import start_writer

GB = 1 << 30


def small_run(n=6, layers=("a", "b", "c")):
    rec = ArrayRecorder(histogram_every=2)
    rng = np.random.default_rng(0)
    for s in range(n):
        rec.record(s, {k: rng.normal(size=5) for k in layers}, loss=1.0)
    return rec.run


@pytest.fixture
def run_dir(tmp_path):
    p = tmp_path / "r"
    save_run(small_run(), p)
    return p


@pytest.mark.parametrize("bad", [None, 3, ["r"]])
def test_load_run_of_something_that_is_not_a_path_is_a_type_error(bad):
    with pytest.raises(TypeError, match="expected a run directory path"):
        load_run(bad)


def test_meta_json_linked_to_dev_zero_is_refused(run_dir):
    (run_dir / "meta.json").unlink()
    (run_dir / "meta.json").symlink_to("/dev/zero")
    with pytest.raises(RunFormatError, match="not a plain file"):
        load_run(run_dir)


@pytest.mark.parametrize("name", ["meta.json", "steps.bin", "hist.bin"])
def test_a_fifo_in_place_of_a_run_file_is_refused_without_hanging(run_dir, name):
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name)
    with pytest.raises(RunFormatError, match="not a (plain )?file"):
        load_run(run_dir)


def test_a_huge_meta_json_is_refused_without_reading_it(run_dir):
    with open(run_dir / "meta.json", "r+b") as f:
        f.truncate(2 * GB)  # sparse: takes no disk
    with pytest.raises(RunFormatError, match=f"larger than {META_MAX_BYTES >> 20} MiB"):
        load_run(run_dir)


def test_deeply_nested_meta_json_is_a_format_error(run_dir):
    (run_dir / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RunFormatError, match="nested too deeply"):
        load_run(run_dir)


def test_meta_listing_more_layers_than_the_records_is_an_error_naming_both(tmp_path):
    p, other = tmp_path / "r", tmp_path / "other"
    save_run(small_run(3, layers=("a", "b", "c")), p)
    save_run(small_run(1, layers=tuple(f"l{i}" for i in range(100))), other)
    (p / "meta.json").write_bytes((other / "meta.json").read_bytes())
    assert (p / "steps.bin").stat().st_size < step_dtype(100).itemsize  # no whole 100-layer record
    with pytest.raises(
        RunFormatError, match="meta.json lists 100 layers, but steps.bin holds 3 whole records of 3 layers"
    ):
        load_run(p)


def test_a_step_cut_short_by_a_crash_is_still_only_a_warning(run_dir):
    with open(run_dir / "steps.bin", "ab") as f:
        f.write(b"\x07" * 40)  # a record the writer was killed in the middle of
    with pytest.warns(UserWarning, match="ignored 40 bytes of an unfinished last step"):
        run = load_run(run_dir)
    assert run.n_steps == 6


def test_more_histograms_than_steps_is_refused_before_reading(run_dir):
    with open(run_dir / "hist.bin", "r+b") as f:
        f.truncate(20 * GB)
    with pytest.raises(
        RunFormatError, match=r"hist.bin is damaged: it holds \d+ histogram records but steps.bin only 6"
    ):
        load_run(run_dir)


LIMITED = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from gradwidget.storage import RunFormatError, load_run
    try:
        load_run(sys.argv[1])
    except RunFormatError as e:
        print("RunFormatError:", e)
""")


@pytest.mark.parametrize("name", ["steps.bin", "hist.bin", "history.bin"])
def test_sparse_multi_gigabyte_files_fail_cleanly_under_a_memory_limit(run_dir, name):
    """20 GB (sparse) after the real records: the reader checks sizes and reads a chunk at a time,
    so it fails on the first bad record inside a 1 GiB address-space limit."""
    item = step_dtype(3).itemsize
    size = (20 * GB // item) * item  # whole records, so the size alone does not give it away
    path = run_dir / name
    with open(path, "ab") as f:
        f.truncate(size)
    script = LIMITED.format(limit=1 * GB)
    # one BLAS thread: per-thread buffers on a many-core machine would eat the address space
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(sys.path),
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "RunFormatError:" in out.stdout and f"{name} is damaged" in out.stdout, out.stdout


def test_a_device_in_place_of_steps_bin_is_refused(run_dir):
    (run_dir / "steps.bin").unlink()
    (run_dir / "steps.bin").symlink_to("/dev/zero")
    with pytest.raises(RunFormatError, match="not a file"):
        load_run(run_dir)


def test_meta_json_that_is_json_but_not_an_object_is_refused(run_dir):
    (run_dir / "meta.json").write_text(json.dumps([1, 2, 3]))
    with pytest.raises(RunFormatError, match="not a gradwidget run description"):
        load_run(run_dir)


FAST_WRITER = textwrap.dedent("""
    import sys, numpy as np
    from gradwidget.collect.arrays import ArrayRecorder
    rec = ArrayRecorder(log_dir=sys.argv[1], histogram_every=3)
    for s in range(int(sys.argv[2])):
        rec.record(s, {"a": np.full(3, 0.1 * (s + 1)), "b": np.ones(2)})
    rec.close()
""")


def test_a_reader_polling_a_live_writer_in_small_chunks_never_tears_or_errs(tmp_path, monkeypatch):
    """Chunk boundaries (here every 3 records) and a writer appending as fast as it can: every
    poll sees whole steps with their histograms, and the end equals a fresh load."""

    from gradwidget import storage

    monkeypatch.setattr(storage.records, "READ_CHUNK_BYTES", 3 * step_dtype(2).itemsize)
    d = tmp_path / "live"
    proc = start_writer(FAST_WRITER, d, 3000)
    try:
        reader = storage.RunReader(d)
        polls = 0
        while proc.poll() is None:
            reader.poll()
            polls += 1
        reader.poll()
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0 and polls > 10
    final = load_run(d)
    assert reader.run.n_steps == final.n_steps == 3000
    np.testing.assert_array_equal(reader.run.hist_steps, final.hist_steps)
    np.testing.assert_array_equal(reader.run.metric("mean_abs"), final.metric("mean_abs"))


@pytest.mark.parametrize(
    "true_layers,meta_layers,n_steps",
    [(1, 3, 2), (2, 7, 3), (3, 1, 10), (5, 4, 3), (8, 1, 3), (20, 100, 2), (3, 50, 10)],
)
def test_a_layer_count_mismatch_names_both_numbers(tmp_path, true_layers, meta_layers, n_steps):
    p, other = tmp_path / "r", tmp_path / "other"
    save_run(small_run(n_steps, layers=tuple(f"t{i}" for i in range(true_layers))), p)
    save_run(small_run(1, layers=tuple(f"m{i}" for i in range(meta_layers))), other)
    (p / "meta.json").write_bytes((other / "meta.json").read_bytes())
    with pytest.raises(
        RunFormatError,
        match=f"meta.json lists {meta_layers} layers, but steps.bin holds "
        f"{n_steps} whole records of {true_layers} layers",
    ):
        load_run(p)
