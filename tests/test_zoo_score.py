"""The zoo's scoring (bench/zoo/score.py) on hand-made findings: what counts as a false alarm, a hit
at rank 1 or 2, layer recall/precision, a slow detection, and the confusion table."""

from types import SimpleNamespace

import pytest
from zoo import score
from zoo.case import Case
from zoo.score import Finding, Result


def _case(cause=None, faults=(), cid=None):
    mistake = cause or "healthy"
    return Case(cid or f"mlp-sgd-s0-{mistake}", "mlp", "sgd", 0, mistake, cause, fault_layers=tuple(faults))


def test_finding_of_reads_cause_and_optional_first_step():
    early = SimpleNamespace(priority="High", cause="vanishing", first_step=None, layers=["a", "b"])
    late = SimpleNamespace(priority="Low", cause="dead_units", first_step=7, layers=None)
    assert score.finding_of(early) == Finding("High", "vanishing", None, ("a", "b"))
    assert score.finding_of(late) == Finding("Low", "dead_units", 7, ())
    report = SimpleNamespace(diagnoses=[early, late])
    assert [f.cause for f in score.findings_of(report)] == ["vanishing", "dead_units"]


def test_false_alarms_count_critical_high_medium_only():
    quiet = Result(_case(cid="a-healthy"), [Finding("Low", "plateau")])
    noisy = Result(_case(cid="b-healthy"), [Finding("Low", "plateau"), Finding("Medium", "exploding")])
    mistake = Result(_case("exploding"), [Finding("Critical", "exploding")])
    assert score.false_alarms([quiet, noisy, mistake]) == [noisy]
    assert noisy.alarms == [Finding("Medium", "exploding")]


def test_cause_accuracy_first_and_first_two():
    first = Result(_case("frozen", cid="c1"), [Finding("High", "frozen")])
    second = Result(_case("dead_units", cid="c2"), [Finding("High", "vanishing"), Finding("High", "dead_units")])
    third = Result(
        _case("lr_too_low", cid="c3"), [Finding("High", "plateau"), Finding("Low", "x"), Finding("Low", "lr_too_low")]
    )
    missed = Result(_case("nonfinite", cid="c4"), [])
    acc = score.cause_accuracy([first, second, third, missed, Result(_case(), [])])
    assert acc["n"] == 4
    assert acc["top1"] == pytest.approx(0.25) and acc["top2"] == pytest.approx(0.5)
    assert acc["misses"] == ["c2", "c3", "c4"]
    assert (third.rank, missed.rank, missed.first_cause) == (2, None, score.NONE)
    assert score.by_cause([first, second, third, missed]) == {
        "dead_units": (0, 1, 1),
        "frozen": (1, 1, 1),
        "lr_too_low": (0, 0, 1),
        "nonfinite": (0, 0, 1),
    }


def test_layer_scores_use_the_first_matching_finding():
    assert score.layer_match(("a", "b"), ("a", "c", "d", "e")) == (0.5, 0.25)
    assert score.layer_match(("a",), ()) == (0.0, 0.0)
    hit = Result(
        _case("frozen", ("l1", "l2"), cid="h"),
        [
            Finding("High", "vanishing", layers=("l1",)),
            Finding("High", "frozen", layers=("l1", "l2")),
            Finding("Low", "frozen", layers=("x",)),
        ],
    )
    miss = Result(_case("no_gradient", ("l0",), cid="m"), [Finding("High", "vanishing", layers=("l0",))])
    glob = Result(_case("lr_too_high"), [Finding("High", "lr_too_high")])
    s = score.layer_scores([hit, miss, glob])
    assert s["n"] == 2 and s["per_case"] == {"h": (1.0, 1.0), "m": (0.0, 0.0)}
    assert s["recall"] == pytest.approx(0.5) and s["precision"] == pytest.approx(0.5)


def test_detection_lists_late_and_stepless_matches():
    early = Result(_case("exploding", cid="e"), [Finding("High", "exploding", 3)])
    late = Result(
        Case("l", "mlp", "sgd", 0, "lr_too_low", "lr_too_low", slow_onset=True), [Finding("High", "lr_too_low", 80)]
    )
    stepless = Result(_case("frozen", cid="s"), [Finding("High", "frozen", None)])
    unfound = Result(_case("frozen", cid="u"), [])
    d = score.detection([early, late, stepless, unfound], limit=50)
    assert d["steps"] == {"e": 3, "l": 80, "s": None}
    assert d["slow"] == ["l", "s"] and d["expected"] == ["l"]


def test_confusion_table_rows_are_true_causes():
    rs = [
        Result(_case("frozen", cid="a"), [Finding("High", "frozen")]),
        Result(_case("frozen", cid="b"), []),
        Result(_case(cid="c"), [Finding("Medium", "exploding")]),
    ]
    c = score.confusion(rs)
    assert c == {("frozen", "frozen"): 1, ("frozen", "none"): 1, ("healthy", "exploding"): 1}
    lines = score.format_confusion(c).splitlines()
    assert lines[0].split() == ["exploding", "frozen", "none"]
    assert lines[1].split() == ["frozen", ".", "1", "1"]
    assert lines[2].split() == ["healthy", "1", ".", "."]
