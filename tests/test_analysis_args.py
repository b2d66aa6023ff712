"""analyze() checks its arguments up front and says what to pass; a corrupt graph is guarded."""

import numpy as np
import pytest

from gradwidget.analysis import analyze, flow, network
from gradwidget.analysis.stats import Series
from test_analysis_stats import synth


def run3(**kw):
    return synth(np.ones((30, 3)), **kw)


@pytest.mark.parametrize(
    "weights, err, text",
    [
        ("x", TypeError, "dict {layer name: array} or a torch module"),
        ([np.ones(3)], TypeError, "not list"),
        ({}, ValueError, "empty dict"),
        ({1: np.ones(3)}, TypeError, "keys must be layer names"),
    ],
)
def test_bad_weights_are_rejected_with_what_to_pass(weights, err, text):
    with pytest.raises(err, match=text.replace("{", r"\{").replace("}", r"\}")):
        analyze(run3(), weights=weights)


@pytest.mark.parametrize(
    "max_rows, err",
    [(0, ValueError), (-5, ValueError), (15, ValueError), (2.5, TypeError), (True, TypeError), ("100", TypeError)],
)
def test_bad_max_rows_is_rejected(max_rows, err):
    with pytest.raises(err, match="max_rows"):
        analyze(run3(), max_rows=max_rows)


def test_other_bad_arguments():
    with pytest.raises(TypeError, match="needs a gradwidget Run"):
        analyze(np.ones((3, 3)))
    with pytest.raises(TypeError, match="thresholds must be"):
        analyze(run3(), thresholds=3)
    with pytest.raises(ValueError, match="previous_weights needs weights"):
        analyze(run3(), previous_weights={"l0.weight": np.ones(3)})


def test_the_smallest_max_rows_still_analyses_a_long_run():
    rep = analyze(synth(np.ones((100, 2))), max_rows=16)
    assert rep.overall_health == "Healthy"


def test_edges_naming_missing_layers_are_dropped_with_a_note():
    run = run3(edges=[(0, 1), (1, 2), (1, 7), (-1, 2)])
    E, bad = network.graph_edges(run)
    assert E.tolist() == [[0, 1], [1, 2]] and bad == 2
    s = Series(run)
    net = network.flow_network(s, flow.flow_characteristics(s))
    assert net.available and len(net.edges) == 2
    rep = analyze(run)
    assert any("2 recorded graph edges named a layer index outside 0..2" in n for n in rep.notes)


@pytest.mark.parametrize(
    "name, value",
    [
        ("relative_vanishing", 0),
        ("bottleneck_gain", 0),
        ("unstable", 0),
        ("relative_exploding", 0),
        ("convergence_window", 2),
    ],
)
def test_thresholds_the_analysis_cannot_use_are_rejected(name, value):
    with pytest.raises(ValueError, match=f"Thresholds.{name} must be"):
        analyze(run3(), thresholds={name: value})
