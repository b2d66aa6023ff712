"""The original crate's GradientFlowAnimator tests, in spirit, against ArrayRecorder + Run views."""

import csv
import json

import numpy as np
import pytest

from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.outputs import GradientHealth, export_csv, export_json, summary, to_ascii


def simple_grads(names, value):
    return {n: np.array([value] * 4) for n in names}


def test_record_step_basic():
    rec = ArrayRecorder()
    rec.record(0, simple_grads(["attn", "ffn"], 0.01))
    assert rec.run.n_steps == 1 and rec.run.n_layers == 2
    np.testing.assert_allclose(rec.run.metric("mean_abs")[0], [0.01, 0.01], rtol=1e-6)
    np.testing.assert_allclose(rec.run.metric("grad_norm")[0], [0.02, 0.02], rtol=1e-6)


def test_rolling_window():
    rec = ArrayRecorder(max_steps=3)
    for i in range(10):
        rec.record(i, simple_grads(["layer_a"], 0.1))
    assert rec.run.n_steps == 3
    assert rec.run.steps.tolist() == [7, 8, 9]
    # what fell out of the window is kept, decimated, in the history
    assert rec.run.history is not None and rec.run.history.steps[0] == 0


def test_vanishing_detection():
    rec = ArrayRecorder(thresholds={"vanishing": 1e-6})
    rec.record(0, {"shallow": np.array([1e-8, 1e-8]), "deep": np.array([0.01, 0.01])})
    van = rec.run.vanishing()[0]
    assert van[rec.run.layer_index("shallow")]
    assert not van[rec.run.layer_index("deep")]


def test_exploding_detection():
    rec = ArrayRecorder(thresholds={"exploding": 100.0})
    rec.record(0, {"bad_layer": np.array([500.0, 200.0]), "ok_layer": np.array([0.1, 0.1])})
    exp = rec.run.exploding()[0]
    assert exp[rec.run.layer_index("bad_layer")] and not exp[rec.run.layer_index("ok_layer")]


def test_flow_intensity_normalised():
    rec = ArrayRecorder()
    rec.record(0, {"large": np.ones(10), "small": np.full(10, 0.001)})
    fi = rec.run.flow_intensity()[0]
    assert ((fi >= 0) & (fi <= 1)).all()
    assert fi[rec.run.layer_index("large")] == 1.0
    np.testing.assert_allclose(fi[rec.run.layer_index("small")], 0.001, rtol=1e-5)


def test_export_json_round_trip(tmp_path):
    rec = ArrayRecorder()
    rec.record(0, simple_grads(["a", "b"], 0.1))
    rec.record(1, simple_grads(["a", "b"], 0.05))
    p = tmp_path / "sub" / "frames.json"
    export_json(rec.run, p)
    frames = json.loads(p.read_text())
    assert [f["step"] for f in frames] == [0, 1]
    assert [info["name"] for info in frames[1]["layers"]] == ["a", "b"]
    assert abs(frames[1]["layers"][0]["mean_abs_grad"] - 0.05) < 1e-7
    assert set(frames[0]["layers"][0]) == {
        "name",
        "mean_abs_grad",
        "max_abs_grad",
        "grad_norm",
        "is_vanishing",
        "is_exploding",
        "flow_intensity",
    }


def test_export_csv_round_trip(tmp_path):
    rec = ArrayRecorder()
    rec.record(0, simple_grads(["encoder"], 0.2), loss=2.5)
    rec.record(1, simple_grads(["encoder"], 0.18), loss=2.25)
    p = tmp_path / "t.csv"
    export_csv(rec.run, p)
    rows = list(csv.DictReader(p.open()))
    assert list(rows[0])[:7] == [
        "step",
        "layer",
        "mean_abs_grad",
        "max_abs_grad",
        "grad_norm",
        "is_vanishing",
        "is_exploding",
    ]  # the original's columns first
    assert list(rows[0])[7:] == [
        "std",
        "zero_frac",
        "nonfinite",
        "weight_norm",
        "update_norm",
        "loss",
        "lr",
        "global_norm",
    ]  # then everything recorded
    assert len(rows) == 2
    assert float(rows[1]["mean_abs_grad"]) == np.float32(0.18)
    assert rows[0]["is_vanishing"] == "0"
    assert float(rows[1]["loss"]) == 2.25 and rows[1]["lr"] == "" and float(rows[0]["global_norm"]) > 0
    assert float(rows[0]["std"]) == pytest.approx(float(rec.run.metric("std")[0, 0]))


def test_to_ascii_empty():
    from gradwidget.run import Run

    assert "no gradient frames" in to_ascii(Run(["a"]))


def test_to_ascii_nonempty():
    rec = ArrayRecorder()
    for i in range(5):
        rec.record(i, simple_grads(["embed", "attn"], 0.1 * (i + 1)))
    out = to_ascii(rec.run)
    assert "embed" in out and "attn" in out
    rows = {text.split()[0]: text for text in out.splitlines() if text.strip().startswith(("embed", "attn"))}
    # one scale across steps: the growing gradient is drawn darker at the last step than the first
    from gradwidget.outputs import BLOCKS

    cells = rows["embed"].split("  ", 1)[1].strip("\n")
    assert BLOCKS.index(cells[-1]) > BLOCKS.index(cells[0])


def test_summary_report_healthy():
    rec = ArrayRecorder()
    for i in range(5):
        rec.record(i, simple_grads(["layer"], 0.1))
    s = summary(rec.run)
    assert s.overall_health == GradientHealth.HEALTHY
    assert s.layers_with_vanishing_grads == [] and s.layers_with_exploding_grads == []
    assert "healthy" in s.recommendations[-1]


def test_summary_levels_follow_the_analysis_verdict():
    """One verdict in one vocabulary: the summary's level is the analysis's word (Healthy, Warning,
    Critical), never a second set of cut-offs; its vanishing layers are the ones the diagnosis names."""
    from gradwidget import analyze

    def run_with(bad_steps, kind, stalled=True):
        rec = ArrayRecorder()
        for i in range(10):
            g = {"x": np.full(4, 0.1), "ok": np.full(4, 0.1)}  # x is the input-side layer
            if i < bad_steps:
                g["x"] = np.full(4, {"van": 1e-9, "exp": 1e4, "nan": np.nan}[kind])
            # a loss that stopped improving (flat within its own noise): the damage a symptom needs
            rec.record(i, g, loss=2.3 + 0.01 * (-1) ** i if stalled else None)
        rep = analyze(rec.run)
        s = summary(rec.run)
        assert s.overall_health.value == rep.overall_health
        said = [n for d in rep.diagnoses if d.cause == "vanishing" for n in d.layers]
        assert s.layers_with_vanishing_grads == said  # one count for one thing
        return s.overall_health

    assert run_with(0, "van") == GradientHealth.HEALTHY
    assert run_with(4, "van") == GradientHealth.WARNING  # one layer, 40% of steps: Medium
    assert run_with(6, "van") == GradientHealth.WARNING  # most steps: High
    assert run_with(2, "exp") == GradientHealth.WARNING
    assert run_with(1, "nan") == GradientHealth.CRITICAL
    # without a loss no damage is measured: a symptom stays Low, information, and the verdict Healthy
    assert run_with(6, "van", stalled=False) == GradientHealth.HEALTHY
    assert run_with(1, "nan", stalled=False) == GradientHealth.CRITICAL  # an observation needs none


def test_ascii_marks_nonfinite_and_exploding():
    rec = ArrayRecorder()
    rec.record(0, {"a": np.array([np.nan, 1.0]), "b": np.array([5e3, 1.0]), "c": np.ones(2)})
    out = to_ascii(rec.run)
    line = {text.split()[0]: text for text in out.splitlines()[3:-1]}
    assert line["a"].endswith("X") and line["b"].endswith("!")


def test_ascii_of_a_run_without_layers_says_so():
    """A run with steps but no layers (nothing to draw) is a line of text, not a max() error."""
    import numpy as np

    from gradwidget import METRICS, Run

    run = Run([])
    run.append(0, np.zeros((len(METRICS), 0), np.float32))
    assert to_ascii(run) == "(no layers recorded)\n"
