import json
import re
import subprocess
import sys

import numpy as np
import pytest

from gradwidget.cli import main
from gradwidget.collect.arrays import ArrayRecorder, array_stats, log_hist
from gradwidget.run import HIST_EDGES, METRICS


def test_array_stats_match_numpy():
    g = np.array([[0.0, -2.0], [3.0, 1e-3]])
    w = np.array([1.0, 2.0, 3.0, 4.0])
    s = dict(zip(METRICS, array_stats(g, w, w - 0.5)))
    assert s["grad_norm"] == pytest.approx(np.linalg.norm(g))
    assert s["mean_abs"] == pytest.approx(np.abs(g).mean())
    assert s["max_abs"] == 3.0 and s["zero_frac"] == 0.25 and s["nonfinite"] == 0
    assert s["std"] == pytest.approx(g.std())
    assert s["weight_norm"] == pytest.approx(np.linalg.norm(w))
    assert s["update_norm"] == pytest.approx(1.0)


def test_log_hist_uses_fixed_bins():
    h = log_hist(np.array([1e-3, -1e-3, 0.0, np.nan, 10.0, 1e-30, 1e9]))
    assert h.sum() == 5  # zero and NaN are not counted; out-of-range values land in the edge bins

    def centre(v):
        return np.searchsorted(HIST_EDGES, np.log10(v), side="right") - 1

    assert h[centre(1e-3)] == 2 and h[centre(10.0)] == 1 and h[0] == 1 and h[-1] == 1


def test_accepts_torch_tensors_and_lists():
    torch = pytest.importorskip("torch")
    rec = ArrayRecorder()
    rec.record(0, {"t": torch.ones(3), "l": [1.0, 2.0]})
    assert rec.run.metric("grad_norm")[0].tolist() == pytest.approx([3**0.5, 5**0.5])


@pytest.mark.parametrize(
    "second,match",
    [
        ({"a": np.ones(3)}, "missing \\['b'\\]"),
        ({"a": np.ones(3), "b": np.ones(2), "c": np.ones(1)}, "unexpected \\['c'\\]"),
        ({"a": np.ones(4), "b": np.ones(2)}, "has shape \\(4,\\), expected \\(3,\\)"),
    ],
)
def test_mismatched_names_or_shapes_are_clear_errors(second, match):
    rec = ArrayRecorder()
    rec.record(0, {"a": np.ones(3), "b": np.ones(2)})
    with pytest.raises(ValueError, match=match):
        rec.record(1, second)
    assert rec.run.n_steps == 1  # nothing half-recorded


def test_other_bad_inputs():
    rec = ArrayRecorder()
    with pytest.raises(TypeError, match="non-empty dict"):
        rec.record(0, [np.ones(3)])
    with pytest.raises(TypeError, match="numeric"):
        rec.record(0, {"a": np.array(["x", "y"])})
    rec.record(0, {"a": np.ones(3)})
    with pytest.raises(ValueError, match="steps must increase"):
        rec.record(0, {"a": np.ones(3)})
    with pytest.raises(ValueError, match="unknown threshold"):
        ArrayRecorder(thresholds={"vanish": 1})


def test_cli_export_ascii_and_errors(tmp_path, capsys):
    rec = ArrayRecorder(log_dir=tmp_path / "r")
    for s in range(4):
        rec.record(s, {"x": np.full(3, 0.5), "y": np.full(3, 1e-9)})
    rec.close()
    assert main(["export", str(tmp_path / "r"), "-o", str(tmp_path / "o.json")]) == 0
    assert len(json.loads((tmp_path / "o.json").read_text())) == 4
    assert main(["export", str(tmp_path / "r"), "--format", "csv", "-o", str(tmp_path / "o.csv")]) == 0
    assert (tmp_path / "o.csv").read_text().splitlines()[0].startswith("step,layer,mean_abs_grad")
    assert main(["ascii", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "Gradient Flow Animation" in out
    lo, hi = re.search(r"log scale (\S+)\.\.(\S+);", out).groups()  # the scale's ends as numbers
    assert (lo, hi) == ("1.7e-09", "0.87")  # the grad norms, sqrt(3) x 1e-9 and sqrt(3) x 0.5, as numbers
    assert main(["ascii", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "r"), "-o", str(tmp_path / "o.xml")]) == 2


def test_cli_demo_end_to_end(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "demo"
    p = subprocess.run(
        [sys.executable, "-m", "gradwidget.cli", "demo", "--steps", "40", "--out", str(out), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "Gradient Flow Animation" in p.stdout and "vanishing layers" in p.stdout
    assert "0.weight" in p.stdout.split("vanishing layers")[1].splitlines()[0]
    from gradwidget import analyze
    from gradwidget.storage import load_run

    run = load_run(out)
    assert run.n_steps == 40
    # one count for one thing: the summary's vanishing layers are the ones the vanishing diagnosis
    # names (it said 13, the diagnosis 20, the report 14)
    listed = p.stdout.split("vanishing layers (")[1].split(")")[0]
    rep = analyze(run)
    (van,) = [d for d in rep.diagnoses if d.cause == "vanishing"]
    assert int(listed) == len(van.layers) and f"in {len(van.layers)} layers" in van.text
    v = rep.overall_health  # one verdict vocabulary: the crate's summary and the analysis say the same word
    assert f"Gradient flow summary: {v}" in p.stdout and f"gradient health {v}: " in p.stdout


def _small_run_dir(path):
    rec = ArrayRecorder(log_dir=path)
    for s in range(4):
        rec.record(s, {"x": np.full(3, 0.5), "y": np.full(3, 1e-3)})
    rec.close()
    return path


@pytest.mark.parametrize("command", ["report", "export"])
@pytest.mark.parametrize("name", ["meta.json", "steps.bin", "hist.bin", "history.bin"])
def test_cli_refuses_to_write_over_a_run_file(tmp_path, capsys, command, name):
    run = _small_run_dir(tmp_path / "r")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main([command, str(run), "-o", str(run / name)]) == 2
    assert "refusing to write" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # the run is untouched


def test_cli_report_into_a_folder_is_a_clear_error_and_leaves_no_temp_file(tmp_path, capsys):
    run = _small_run_dir(tmp_path / "r")
    assert main(["report", str(run), "-o", str(run)]) == 2
    assert "is a directory; give the file to write" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


def test_write_report_cleans_up_its_temp_file_when_the_rename_fails(tmp_path):
    from gradwidget.analysis import analyze
    from gradwidget.report import write_report
    from gradwidget.storage import load_run

    run = _small_run_dir(tmp_path / "r")
    (tmp_path / "out.html").mkdir()  # os.replace cannot put a file over a folder
    with pytest.raises(OSError):
        write_report(analyze(load_run(run)), tmp_path / "out.html")
    assert not (tmp_path / "out.html.tmp").exists()


def test_cli_reports_os_errors_in_one_line(tmp_path, capsys):
    run = _small_run_dir(tmp_path / "r")
    (tmp_path / "f").write_text("a file, not a folder")
    assert main(["export", str(run), "-o", str(tmp_path / "f" / "o.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradwidget export: error:") and "Traceback" not in err
    assert str(tmp_path / "f") in err


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(max_steps=0), ValueError, "max_steps must be a positive int or None, got 0"),
        (dict(max_steps="x"), ValueError, "max_steps must be a positive int"),
        (dict(histogram_every=True), ValueError, "histogram_every must be a non-negative int"),
        (dict(log_dir=5), TypeError, "log_dir must be a folder path"),
    ],
)
def test_bad_recorder_options_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        ArrayRecorder(**kwargs)


def test_a_rejected_record_does_not_move_the_update_baseline():
    rec = ArrayRecorder()
    rec.record(0, {"a": np.ones(2)}, weights={"a": np.ones(2)})
    with pytest.raises(ValueError, match="loss must be a number"):
        rec.record(1, {"a": np.ones(2)}, weights={"a": np.ones(2) * 2}, loss="x")
    with pytest.raises(ValueError, match="step must be a whole number"):
        rec.record("x", {"a": np.ones(2)}, weights={"a": np.ones(2) * 2})
    rec.record(2, {"a": np.ones(2)}, weights={"a": np.ones(2) * 3})
    assert rec.run.steps.tolist() == [0, 2]
    assert rec.run.metric("update_norm")[1, 0] == pytest.approx(np.sqrt(8))  # from step 0's weights


@pytest.mark.parametrize("which", ["gradient", "weight"])
def test_complex_arrays_are_refused_not_truncated_to_their_real_part(which):
    z = np.array([1 + 1j, 0 - 2j])
    grads, weights = ({"a": z}, None) if which == "gradient" else ({"a": np.ones(2)}, {"a": z})
    with pytest.raises(TypeError, match=f"{which} 'a' is complex .*np.abs"):
        ArrayRecorder().record(0, grads, weights=weights)


def test_a_log_dir_holding_another_run_is_refused_up_front_and_never_skipped(tmp_path):
    _small_run_dir(tmp_path / "r")
    with pytest.raises(FileExistsError, match="already holds a run"):
        ArrayRecorder(log_dir=tmp_path / "r")
    rec = ArrayRecorder(log_dir=tmp_path / "new")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "meta.json").write_text("{}")  # another process took the folder meanwhile
    for _ in range(2):  # every call fails: none records in memory only while the disk gets nothing
        with pytest.raises(FileExistsError, match="is not a gradwidget run but holds meta.json"):
            rec.record(0, {"a": np.ones(2)})
    assert rec.run is None


@pytest.mark.parametrize("name", ["meta.json", "steps.bin"])
def test_python_exports_and_reports_refuse_to_write_over_a_run_file(tmp_path, name):
    """The CLI's refusal holds in the Python API too: export_csv/export_json and write_report
    onto a run's own file would destroy the run."""
    from gradwidget.analysis import analyze
    from gradwidget.outputs import export_csv, export_json
    from gradwidget.report import write_report
    from gradwidget.storage import load_run

    path = _small_run_dir(tmp_path / "r")
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    run = load_run(path)
    for write, what in ((export_csv, run), (export_json, run), (write_report, analyze(run))):
        with pytest.raises(ValueError, match="refusing to write"):
            write(what, path / name)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


@pytest.mark.parametrize("command,ext", [("report", "html"), ("export", "csv"), ("export", "json")])
def test_cli_outputs_replace_an_existing_file_only_with_force(tmp_path, capsys, command, ext):
    run = _small_run_dir(tmp_path / "r")
    out = tmp_path / f"notes.{ext}"
    out.write_text("my notes")
    assert main([command, str(run), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} exists; pass --force to replace it" in err and "Traceback" not in err
    assert out.read_text() == "my notes"
    assert main([command, str(run), "-o", str(out), "--force"]) == 0
    assert out.read_text() != "my notes"


def test_cli_demo_refuses_an_existing_run_or_folder_without_force(tmp_path, capsys):
    pytest.importorskip("torch")
    run = _small_run_dir(tmp_path / "r")
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["demo", "--steps", "3", "--out", str(run), "--quiet"]) == 2
    assert "already holds a run; pick a new log_dir or pass --force" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # refused before training
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "steps.bin").write_text("mine")
    assert main(["demo", "--steps", "3", "--out", str(mine), "--quiet", "--force"]) == 2
    assert "never writes over files it did not create" in capsys.readouterr().err
    assert (mine / "steps.bin").read_text() == "mine"
    assert main(["demo", "--steps", "3", "--out", str(run), "--quiet", "--force"]) == 0
    from gradwidget.storage import load_run

    assert load_run(run).n_steps == 3


def test_cli_out_of_memory_is_one_line_not_a_traceback(tmp_path, capsys, monkeypatch):
    import gradwidget.storage as storage

    run = _small_run_dir(tmp_path / "r")

    def no_memory(path):
        raise MemoryError

    monkeypatch.setattr(storage, "load_run", no_memory)
    assert main(["ascii", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradwidget ascii: error: not enough memory") and "Traceback" not in err


def test_python_dash_m_gradwidget_is_the_command_line():
    """``python -m gradwidget`` runs the command line where its script is not on the PATH."""
    p = subprocess.run([sys.executable, "-m", "gradwidget", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: gradwidget")
