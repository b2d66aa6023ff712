"""Before and after the fix: compare() matches layers and steps, says which diagnoses went or came,
and writes an offline HTML comparison; the CLI does the same from run directories."""

import re

import numpy as np
import pytest

from gradwidget import compare, write_comparison
from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.comparison import match_layers
from gradwidget.run import LayerInfo, Run
from gw_browser import offline_page


def _arrays(names, n_steps, value=0.1, max_steps=None, histogram_every=10, shapes=None, loss=None):
    rec = ArrayRecorder(max_steps=max_steps, histogram_every=histogram_every)
    rng = np.random.default_rng(0)
    for s in range(n_steps):
        rec.record(
            s,
            {n: np.full(shapes.get(n, 4) if shapes else 4, value) * (1 + 0.1 * rng.standard_normal()) for n in names},
            loss=None if loss is None else float(loss[s]),
        )
    return rec.run


def _demo(activation, steps=60):
    torch = pytest.importorskip("torch")
    from gradwidget.demo import build_demo, train_demo

    model, opt, data = build_demo(depth=12, width=16, n_features=8, activation=activation)
    return train_demo(steps, model=model, optimizer=opt, data=data).run, torch


@pytest.mark.slow
def test_the_fix_makes_the_vanishing_diagnosis_disappear(tmp_path):
    torch = pytest.importorskip("torch")
    before, _ = _demo(torch.nn.Sigmoid)
    after, _ = _demo(torch.nn.ReLU)  # the fix: ReLU (Kaiming-style default init)
    cmp = compare(before, after, labels=["sigmoid", "relu"])
    van = [c for c in cmp.causes if c.cause == "vanishing"]
    assert van and van[0].status == "disappeared" and "0.weight" in van[0].layers["sigmoid"]
    assert any("vanishing gradients, found in sigmoid, is gone" in v for v in cmp.verdict), cmp.verdict
    g = cmp.final[(cmp.final.metric == "grad_norm")].set_index("layer")["log_ratio"]
    assert g["0.weight"] > 2  # the input layer's gradient is back, by decades
    assert cmp.layers.loc[cmp.layers.layer == "0.weight", "health (sigmoid)"].item() != "Healthy"
    assert "vanishing" not in {r.cause for r in cmp.reports[1].diagnoses}
    out = write_comparison(cmp, tmp_path / "cmp.html")
    text = out.read_text()
    assert not re.search(r'(src|href)="(?!data:|#)', text) and text.count("data:image/png;base64,") >= 3
    with pytest.raises(FileExistsError):
        write_comparison(cmp, out)


def test_a_run_compared_with_itself_shows_no_change():
    run = _arrays(["a", "b"], 30, loss=np.linspace(2, 1, 30))
    cmp = compare(run, run, labels=["x", "y"])
    assert cmp.verdict[0].startswith("No change")
    assert np.allclose(cmp.final["log_ratio"].dropna(), 0)
    assert np.allclose(cmp.log_ratio("grad_norm").to_numpy(), 0)
    assert all(c.status == "persisted" for c in cmp.causes)


def test_mismatched_layer_sets_are_reported_never_dropped():
    a = _arrays(["enc.0.weight", "enc.1.weight", "head.weight"], 20, shapes={"head.weight": 8})
    b = _arrays(["enc.0.weight", "model.enc.1.weight", "new.weight"], 20, shapes={"new.weight": 8})
    common, renamed, only_a, only_b = match_layers(a, b)
    assert common == ["enc.0.weight"] and ("enc.1.weight", "model.enc.1.weight") in renamed
    cmp = compare(a, b, labels=["a", "b"])
    assert cmp.removed["b"] == [] and cmp.added["b"] == []  # head/new share a shape: paired as renamed
    text = "\n".join(cmp.verdict)
    assert "matched by shape under new names" in text
    c = _arrays(["enc.0.weight", "extra.weight"], 20, shapes={"extra.weight": 3})
    cmp = compare(a, c, labels=["a", "c"])
    assert set(cmp.removed["c"]) == {"enc.1.weight", "head.weight"} and cmp.added["c"] == ["extra.weight"]
    assert "extra.weight" in list(cmp.layers.layer)  # listed, with its health in c
    assert "layers of a are missing" in "\n".join(cmp.verdict)


def test_different_lengths_windows_and_histogram_schedules_compare():
    long = _arrays(["a", "b"], 200, max_steps=50, histogram_every=7)  # a rolling window with history
    short = _arrays(["a", "b"], 40, value=1.0, histogram_every=0)
    cmp = compare(long, short)
    assert cmp.labels == ["run 1", "run 2"]
    r = cmp.log_ratio("mean_abs")
    assert len(r) > 0 and np.nanmedian(r.to_numpy()) == pytest.approx(1.0, abs=0.1)  # x10 -> +1 decade
    assert "-fold from run 1" in "\n".join(cmp.verdict) and "10x higher" in "\n".join(cmp.verdict)


def test_bad_arguments_are_clear_errors():
    run = _arrays(["a"], 5)
    with pytest.raises(ValueError, match="at least two"):
        compare(run)
    with pytest.raises(TypeError, match="Runs, run directories, GradientPanels or Recorders"):
        compare(run, 3)
    with pytest.raises(ValueError, match="labels"):
        compare(run, run, labels=["x"])
    with pytest.raises(ValueError, match="no recorded steps"):
        compare(run, Run([LayerInfo("a")]))
    with pytest.raises(ValueError, match="metric"):
        compare(run, run).log_ratio("zero_frac")


def test_cli_compare_prints_and_writes_html(tmp_path, capsys):
    from gradwidget.cli import main

    a, b = tmp_path / "a", tmp_path / "b"
    _arrays(["a", "b"], 30).save(a)
    _arrays(["a", "b"], 30, value=1e-9).save(b)
    out = tmp_path / "cmp.html"
    assert main(["compare", str(a), str(b), "--labels", "before,after", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Comparison: before" in printed and "new" in printed and out.exists()
    assert main(["compare", str(a), str(b), "-o", str(out)]) == 2  # no --force: refused
    assert "exists" in capsys.readouterr().err
    assert main(["compare", str(a)]) == 2


@pytest.mark.browser
def test_comparison_html_opens_complete_offline_in_chromium(tmp_path):
    a = _arrays(["a", "b", "c"], 30)
    b = _arrays(["a", "b", "c"], 30, value=1e-9)
    path = write_comparison(compare(a, b, labels=["before", "after"]), tmp_path / "cmp.html")
    with offline_page() as (page, blocked):
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        imgs = page.eval_on_selector_all("img", "els => els.map(e => [e.complete, e.naturalWidth])")
        headings = page.eval_on_selector_all("h2", "els => els.map(e => e.textContent)")
    assert blocked == [] and len(imgs) == 3 and all(c and w > 100 for c, w in imgs)
    assert headings == ["Verdict", "Diagnoses", "Gradient flow", "Difference", "Layers"]


def test_compare_is_the_function_whatever_was_imported_first():
    """The module is gradwidget.comparison: importing it (the panel does) never shadows the function."""
    import gradwidget
    import gradwidget.comparison  # noqa: F401
    from gradwidget import compare as c

    assert callable(c) and c is gradwidget.comparison.compare
