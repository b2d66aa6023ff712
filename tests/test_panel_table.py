"""The health table grades layers by the analysis engine's one definition (``analysis.causes.
layer_verdicts``), whichever path builds it, on real training runs; without the analysis it grades
nothing rather than by cut-offs of its own."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gradwidget import GradientPanel, analyze  # noqa: E402
from gradwidget._warnings import GradwidgetWarning  # noqa: E402
from gradwidget.demo import build_demo, train_demo  # noqa: E402
from gradwidget.panel import table as table_mod  # noqa: E402
from gradwidget.panel.table import UNGRADED, UNGRADED_NOTE, analyse, table_from_run  # noqa: E402

#: small real runs: a ReLU MLP at a sane learning rate, a deep sigmoid MLP whose first layers
#: vanish (the demo's pathology), and the ReLU MLP at a learning rate that blows it up to NaN
CASES = {
    "healthy": (dict(depth=3, width=16, activation=nn.ReLU, lr=0.02), 60),
    "vanishing": (dict(depth=8, width=16), 60),
    "lr_too_high": (dict(depth=3, width=16, activation=nn.ReLU, lr=3.0), 60),
}


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, (kw, steps) in CASES.items():
        model, opt, data = build_demo(**kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the blown-up run's NaN loss
            out[name] = train_demo(steps, model=model, optimizer=opt, data=data).run
    return out


def _grades(rows) -> dict[str, str]:
    return {r["layer"]: r["health"] for r in rows}


@pytest.mark.parametrize("case", list(CASES))
def test_table_grades_are_the_analysis_grades(runs, case):
    run = runs[case]
    rep = analyze(run)
    want = dict(zip(rep.layers["layer"], rep.layers["health"]))
    report, rows, _ = analyse(run)
    assert report is not None and [r["layer"] for r in rows] == run.layer_names
    assert _grades(rows) == want
    # and the panel's table (built on its analysis thread) says the same
    p = GradientPanel(run)
    assert p._analysis.wait(60)
    assert _grades(p.table) == want


def test_the_cases_span_healthy_and_broken(runs):
    """The comparison above means something: one run all Healthy, the broken ones graded worse
    where the analysis finds their cause (vanishing first layers; a blow-up everywhere)."""
    grades = {c: list(analyze(r).layers["health"]) for c, r in runs.items()}
    assert set(grades["healthy"]) == {"Healthy"}
    van = grades["vanishing"]
    assert van[0] in ("Warning", "Critical") and "Healthy" in van  # input side starved, output side fine
    assert set(grades["lr_too_high"]) == {"Critical"}


@pytest.mark.parametrize("case", list(CASES))
def test_without_the_analysis_no_layer_is_graded(runs, case, monkeypatch):
    """When analyze() fails the table keeps the run's numbers and flag marks, says why it has no
    grades, and never grades by cut-offs of its own (it used to: 10 of the vanishing run's 16 layers
    then disagreed with the analysis)."""
    run = runs[case]

    def broken(*a, **k):
        raise RuntimeError("analysis bug")

    monkeypatch.setattr("gradwidget.analysis.analyze", broken)
    with pytest.warns(GradwidgetWarning, match="analysing the run failed"):
        report, rows, diagnoses = analyse(run)
    assert report is None and diagnoses == []
    assert rows == table_from_run(run)
    assert {r["health"] for r in rows} == {UNGRADED} and {r["suggestion"] for r in rows} == {UNGRADED_NOTE}
    gn = np.nanmedian(run.metric("grad_norm"), axis=0)
    for j, r in enumerate(rows):
        assert r["layer"] == run.layer_names[j] and r["index"] == j
        assert r["grad_norm_median"] == pytest.approx(float(gn[j]), rel=1e-6) or not np.isfinite(gn[j])
        assert ("vanishing" in r["flags"]) == bool(run.vanishing()[:, j].any())
        assert ("nonfinite" in r["flags"]) == bool(run.nonfinite()[:, j].any())


def test_the_table_module_defines_no_grade_cut_offs():
    """One definition of grading: the only health word the table module writes itself is the
    ungraded one."""
    import inspect

    src = inspect.getsource(table_mod)
    for word in ("Critical", "Warning", "Healthy"):
        assert f'"{word}"' not in src


@pytest.mark.parametrize("case", ["vanishing", "lr_too_high"])
def test_a_rows_action_is_its_diagnosis_action_unprefixed(runs, case):
    """Every row a diagnosis names carries that diagnosis' action as written (no layer name in
    front, so the page can show it once for all the diagnosis' rows) and its rank, which the page
    groups a health's rows by; rows no diagnosis names carry neither."""
    report, rows, _ = analyse(runs[case])
    diags = report.diagnoses
    assert diags, "the broken run has a diagnosis"
    named = {}
    for rank, d in enumerate(diags):
        for n in d.layers:
            named.setdefault(n, rank)
    for r in rows:
        if r["layer"] in named:
            d = diags[named[r["layer"]]]
            assert r["diagnosis"] == named[r["layer"]] and r["suggestion"] == d.action
            assert not r["suggestion"].startswith(r["layer"] + ":")
        else:
            assert "diagnosis" not in r
    top = [r for r in rows if r.get("diagnosis") == 0]
    # the top diagnosis's rows are the layers it names, and they share its one action
    assert {r["layer"] for r in top} == set(diags[0].layers) & {r["layer"] for r in rows}
    assert top and len({r["suggestion"] for r in top}) == 1
