"""The comparison panel (GradientPanel.compare): two runs on shared rows (layers matched by name) and
columns (steps aligned by step number), one colour scale, the difference map, the health table with
both runs' health, the static fallback; a live recorder against a saved baseline."""

import base64

import numpy as np
import pytest

from gradwidget import GradientPanel
from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.panel.comparison import compare_view, row_layout
from gradwidget.panel.protocol import FLAG_VANISHING
from gradwidget.plots import shared_scale


def _run(names, steps, value, sizes=None, rec=None, loss=None):
    rec = rec or ArrayRecorder(histogram_every=10)
    for s in steps:
        rec.record(int(s), {n: np.full((sizes or {}).get(n, 4), value) for n in names}, loss=loss and loss(s))
    return rec.run


def _grid(panel, name):
    m = panel.meta
    dtype = np.uint8 if name.startswith("flags") else np.float32
    return np.frombuffer(getattr(panel, name), dtype).reshape(m["rows"], m["cols"])


def test_both_heatmaps_share_one_colour_scale_and_the_difference_is_the_log_ratio():
    a = _run(["l0", "l1"], range(20), 1e-3)
    b = _run(["l0", "l1"], range(20), 1e-1)
    meta, arr = compare_view(a, b, "mean_abs", 1024, ["a", "b"])
    assert meta["scale"] == list(shared_scale([a, b], "mean_abs"))
    lo, hi = meta["scale"]
    assert lo <= -3 + 1e-6 and hi >= -1 - 1e-6  # one range spans both runs' values
    assert np.allclose(arr["heat"], 1e-3) and np.allclose(arr["heat_b"], 1e-1)
    assert np.allclose(arr["diff"], 2.0)  # log10(1e-1 / 1e-3)
    assert meta["diff_max"] == pytest.approx(2.0)


def test_steps_are_aligned_by_step_number_across_runs_of_different_length_and_schedule():
    a = _run(["l0"], range(0, 40), 1e-2)  # every step, 0..39
    b = _run(["l0"], range(0, 60, 2), 1e-2)  # every other step, 0..58
    meta, arr = compare_view(a, b, "mean_abs", 1024, ["a", "b"])
    steps = arr["col_steps"]
    assert steps.tolist() == sorted(set(range(40)) | set(range(0, 60, 2)))
    ha, hb = arr["heat"][0], arr["heat_b"][0]
    col = {int(s): i for i, s in enumerate(steps)}
    assert np.isfinite(ha[col[2]]) and np.isfinite(hb[col[2]])  # both recorded step 2
    assert np.isfinite(ha[col[3]]) and np.isnan(hb[col[3]])  # only the first recorded step 3
    assert np.isnan(ha[col[50]]) and np.isfinite(hb[col[50]])  # the first run had ended
    assert np.isnan(arr["diff"][0, col[3]]) and arr["diff"][0, col[2]] == pytest.approx(0, abs=1e-6)
    # folded to fewer columns: the same column edges for both runs
    meta2, arr2 = compare_view(a, b, "mean_abs", 16, ["a", "b"])
    assert meta2["cols"] <= 16 and arr2["heat"].shape == arr2["heat_b"].shape == (1, meta2["cols"])
    assert np.isfinite(arr2["heat_b"]).all() and np.isnan(arr2["heat"][0, -1])


def test_mismatched_layers_get_rows_of_their_own_and_are_listed():
    a = _run(["in", "mid", "out"], range(10), 1e-2, sizes={"mid": 3})
    b = _run(["in", "extra", "out"], range(10), 1e-2, sizes={"extra": 5})
    names, ia, ib = row_layout(a, b)
    assert names == ["in", "mid", "out", "extra"]
    assert ia.tolist() == [0, 1, 2, -1] and ib.tolist() == [0, -1, 2, 1]
    meta, arr = compare_view(a, b, "mean_abs", 1024, ["a", "b"])
    assert meta["missing"] == ["mid", "extra"] and "mid" in meta["message"] and "extra" in meta["message"]
    assert np.isnan(arr["heat_b"][1]).all() and np.isnan(arr["heat"][3]).all()
    assert np.isfinite(arr["heat"][[0, 1, 2]]).all() and np.isfinite(arr["heat_b"][[0, 2, 3]]).all()


def test_the_panel_sends_both_runs_switches_mode_and_scrubs_one_cursor_for_both():
    # vanishing everywhere before the fix, with a loss that stopped improving (the damage that makes
    # a symptom more than information)
    a = _run(["l0", "l1", "l2"], range(30), 1e-9, loss=lambda s: 2.3 + 0.01 * (-1) ** s)
    b = _run(["l0", "l1", "l2"], range(30), 1e-2)
    p = GradientPanel.compare(a, b, labels=["before", "after"])
    try:
        assert p.labels == ["before", "after"] and p.mode == "side"
        assert (_grid(p, "flags") & FLAG_VANISHING).all() and not (_grid(p, "flags_b") & FLAG_VANISHING).any()
        assert np.allclose(_grid(p, "diff"), 7.0)
        p.mode = "diff"
        with pytest.raises(Exception, match="unknown mode"):
            p.mode = "overlay"
        p.step = 12
        assert p.step == 12 and not p.follow
        rows = {r["layer"]: r for r in p.table}
        assert set(rows) == {"l0", "l1", "l2"}
        assert rows["l0"]["health_a"] != "Healthy" and rows["l0"]["change"] == pytest.approx(7.0, abs=0.01)
        assert p.comparison.labels == ["before", "after"]
        assert "vanishing gradients, found in before, is gone" in p.meta["message"], p.meta["message"]
        p.select("l2")
        assert p.layer == 2
        with pytest.raises(Exception, match="row index"):
            p.layer = 3
    finally:
        p.close()


def test_a_run_compared_with_itself_shows_no_change_in_the_panel():
    a = _run(["l0", "l1"], range(20), 1e-3)
    p = GradientPanel.compare(a, a)
    try:
        assert np.allclose(_grid(p, "diff"), 0) and p.meta["missing"] == []
        assert all(r["change"] == 0 for r in p.table)
    finally:
        p.close()


def test_static_fallback_carries_the_comparison_figures_html_and_verdict():
    a = _run(["l0", "l1"], range(20), 1e-3)
    b = _run(["l0", "l1"], range(25), 1e-1)
    p = GradientPanel.compare(a, b, labels=["old", "new"])
    try:
        data, _ = p._repr_mimebundle_()
        png = base64.b64decode(data["image/png"])
        assert png.startswith(b"\x89PNG") and len(png) > 5000
        assert "data:image/png;base64," in data["text/html"] and "health (old)" in data["text/html"]
        assert data["text/plain"].startswith("Comparison: old") and "new" in data["text/plain"]
        assert "application/vnd.jupyter.widget-view+json" in data
    finally:
        p.close()


def test_a_live_recorder_against_a_saved_baseline(tmp_path):
    base = ArrayRecorder(log_dir=tmp_path / "baseline")
    _run(["l0", "l1"], range(20), 1e-3, rec=base)
    base.close()
    rec = ArrayRecorder()
    _run(["l0", "l1"], range(5), 1e-2, rec=rec)
    p = GradientPanel.compare(tmp_path / "baseline", rec, labels=["last night", "now"])
    try:
        assert p.meta["n_steps"] == 20
        _run(["l0", "l1"], range(5, 30), 1e-2, rec=rec)
        p.flush()
        assert p.meta["n_steps"] == 30 and p.meta["last_step"] == 29 and p.step == 29
        hb = _grid(p, "heat_b")
        assert np.isfinite(hb).all() and np.isnan(_grid(p, "heat")[:, -1]).all()
    finally:
        p.close()


def test_a_panel_training_a_torch_model_is_the_later_run_and_updates_the_comparison(tmp_path):
    torch = pytest.importorskip("torch")
    from gradwidget import Recorder

    def train(model, opt, steps, rec):
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(8, 4)).pow(2).mean().backward()
            opt.step()
            rec.log(loss=1.0)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, log_dir=tmp_path / "baseline") as rec:
        train(model, opt, 12, rec)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    live = GradientPanel(model, opt)  # the training now
    q = GradientPanel.compare(tmp_path / "baseline", live)
    try:
        assert q.recorder is live.recorder and q.labels == [str(tmp_path / "baseline"), "run 2"]
        train(model, opt, 5, live.recorder)
        q.flush()
        assert q.meta["rows"] == 4 and q.meta["missing"] == [] and q.run.n_steps == 5
        assert np.isfinite(_grid(q, "heat_b")[:, :5]).all()
        assert {r["layer"] for r in q.table} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    finally:
        q.close()
        live.detach()
        live.close()


def test_bad_comparisons_are_clear_errors():
    a = _run(["l0"], range(5), 1e-3)
    with pytest.raises(ValueError, match="mode must be one of"):
        GradientPanel.compare(a, a, mode="overlay")
    from gradwidget import Run

    with pytest.raises(ValueError, match="nothing to compare"):
        GradientPanel.compare(Run(["l0"]), a)
    with pytest.raises(TypeError, match="Runs, run directories, GradientPanels or Recorders"):
        GradientPanel.compare(42, a)


def test_panels_runs_and_folders_compare_in_either_position(tmp_path):
    """compare takes what a user holds: a panel, a run, a run directory, first or second."""
    from gradwidget import compare

    a = _run(["l0", "l1"], range(10), 1e-3)
    b = _run(["l0", "l1"], range(10), 1e-6)
    a.save(tmp_path / "a")
    pa, pb = GradientPanel(a), GradientPanel(b)
    for first, second in [(pa, pb), (pa, b), (tmp_path / "a", pb), (a, pb)]:
        p = GradientPanel.compare(first, second, labels=["before", "after"])
        assert p.labels == ["before", "after"] and p.comparison is not None
        assert compare(first, second).runs[0].n_steps == 10
        p.close()


@pytest.mark.slow
def test_an_executed_notebook_exports_the_comparison_offline(monkeypatch):
    """nbclient runs a notebook showing a comparison (widget state saved, as `--execute` does); the
    gradwidget exporter keeps its static copy: the comparison's figures and its layer table."""
    import os
    import re
    from pathlib import Path

    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    from gradwidget.export import export_html

    root = Path(__file__).resolve().parents[1]
    nb = new_notebook(
        cells=[
            new_code_cell(
                "import numpy as np\nfrom gradwidget import GradientPanel\nfrom gradwidget.collect.arrays import ArrayRecorder\n"
                "def run(v):\n    rec = ArrayRecorder()\n    for s in range(20):\n"
                "        rec.record(s, {'a': np.full(4, v), 'b': np.full(4, v)})\n    return rec.run\n"
                "GradientPanel.compare(run(1e-9), run(1e-2), labels=['before', 'after'])"
            )
        ]
    )
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    html = export_html(nb)
    tags = [t for t in re.findall(r"<img\b[^>]*>", html) if 'class="gradwidget-panel-image"' in t]
    assert len(tags) == 1 and "data:image/png;base64," in tags[0]
    assert "health (before)" in html and "health (after)" in html
