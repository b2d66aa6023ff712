"""The Report end to end: JSON, the health table, thresholds, edge cases, and real (tiny) torch runs
whose report names the right layers first."""

import json

import numpy as np
import pytest

from gradwidget import Run, analyze, write_report
from gradwidget.analysis import Report
from gradwidget.outputs import summary
from test_analysis_stats import synth
from test_plots import pathological_run

LAYER_COLUMNS = [
    "layer",
    "module_type",
    "numel",
    "status",
    "health",
    "grad_norm_median",
    "mean_abs_median",
    "max_abs_max",
    "zero_frac_mean",
    "nonfinite_total",
    "trend",
    "flags",
    "suggestion",
    "risk",
]


def test_report_table_json_and_text():
    run = pathological_run()
    rep = analyze(run)
    assert isinstance(rep, Report) and rep.run._frozen and rep.run.steps.tolist() == run.steps.tolist()  # its snapshot
    df = rep.layers
    assert set(LAYER_COLUMNS) <= set(df.columns) and list(df.layer) == run.layer_names
    h = df.set_index("layer")
    assert h.loc["vanish", "health"] == "Critical" and "vanishing" in h.loc["vanish", "flags"]
    assert h.loc["hot", "health"] == "Critical" and "exploding" in h.loc["hot", "flags"]
    assert h.loc["broken", "nonfinite_total"] == 1 and h.loc["broken", "max_abs_max"] == np.inf
    assert h.loc["mid", "trend"] == "rising"  # grows 100x over the run
    assert h.loc["vanish", "suggestion"].startswith("vanish:")
    assert rep.overall_health == "Critical"
    d = json.loads(rep.to_json())
    assert d["overall_health"] == "Critical" and len(d["layers"]) == 5 and d["run"]["n_steps"] == 30
    said = [n for x in rep.diagnoses if x.cause == "vanishing" for n in x.layers]
    assert summary(run).layers_with_vanishing_grads == said  # one count: the diagnosis's
    assert "_parts" not in d and set(d["run"]) == {"n_layers", "n_steps", "first_step", "last_step"}
    assert {r["kind"] for r in d["regions"]} >= {"vanishing", "exploding"}
    assert d["network"]["available"] is False
    verdict, graded = rep.summary_text().splitlines()[:2]
    assert verdict.startswith("Critical: ") and graded.startswith("5 layers over 30 recorded steps")
    assert f"gradient health {rep.overall_health}: " in graded
    assert rep.diagnoses[0].priority == "Critical"


def test_write_report_writes_the_report(tmp_path):
    rep = analyze(pathological_run())
    path = write_report(rep, tmp_path / "r.html")
    assert 'data-layer="vanish"' in path.read_text()


def test_thresholds_override_changes_the_verdict_not_the_run():
    run = pathological_run()
    rep = analyze(run, thresholds={"vanishing": 1e-12})
    assert "vanishing" not in rep.layers.set_index("layer").loc["vanish", "flags"]
    assert run.thresholds.vanishing == 1e-7 and rep.thresholds.vanishing == 1e-12
    with pytest.raises(ValueError, match="unknown threshold"):
        analyze(run, thresholds={"vanshing": 1})
    with pytest.raises(TypeError, match="Run"):
        analyze("not a run")


def test_empty_and_single_step_runs():
    rep = analyze(Run(["a", "b"]))
    assert rep.overall_health == "Unknown" and list(rep.layers.health) == ["Unknown", "Unknown"]
    json.loads(rep.to_json())
    rep1 = analyze(synth(np.array([[1e-9, 0.1]])))  # the input side starves: a vanishing gradient
    (d,) = rep1.diagnoses  # a symptom, and no loss logged to show damage: information (Low)
    assert d.cause == "vanishing" and d.priority == "Low" and "no loss was logged" in d.evidence
    assert rep1.layers.health.tolist() == ["Healthy", "Healthy"]
    json.loads(rep1.to_json())


def test_a_run_without_layers_is_a_clear_error():
    """Nothing to analyse: one message at the API edge (it was a numpy reshape error deep in stats)."""
    from gradwidget import METRICS

    run = Run([])
    for step in range(3):
        run.append(step, np.zeros((len(METRICS), 0), np.float32))
    with pytest.raises(ValueError, match="no layers"):
        analyze(run)


def test_a_long_run_is_analysed_on_bounded_views():
    T = 9000
    g = np.full((T, 3), 0.1)
    g[:, 2] = 10 ** (-4 * np.arange(T) / T)
    rep = analyze(synth(g), max_rows=1000)
    assert any("evenly spaced steps" in n for n in rep.notes)
    assert rep.layers.set_index("layer").loc["l2.weight", "trend"] == "falling"


# --------------------------------------------------------------------------- real torch runs
torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from gradwidget.collect.torch import Recorder  # noqa: E402


def _train(model, opt, steps, seed=0, n_in=8, loss_fn=None):
    g = torch.Generator().manual_seed(seed)
    loss_fn = loss_fn or nn.MSELoss()
    with Recorder(model, opt, histogram_every=0) as rec:
        for _ in range(steps):
            x = torch.randn(32, n_in, generator=g)
            y = x.sum(1, keepdim=True)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    return rec.run


def test_vanishing_deep_sigmoid_stack_names_the_input_layers_first():
    from gradwidget.demo import build_demo

    model, opt, data = build_demo(depth=12, width=16, n_features=8)
    rec_run = None
    with Recorder(model, opt, histogram_every=0) as rec:
        for _ in range(15):
            x, y = next(data)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            opt.step()
        rec_run = rec.run
    rep = analyze(rec_run)
    top = rep.diagnoses[0]
    assert top.cause == "vanishing" and top.priority == "High" and top.first_step == 0
    assert top.layers[0] in ("0.weight", "0.bias") and "residual" in top.action  # a plain MLP: no skips yet
    (reg,) = [r for r in rep.regions if r.kind == "vanishing"]
    assert reg.end_layer == "0.weight"  # reaches the input layer
    names = rec_run.layer_names
    assert reg.parameters == sum(rec_run.layers[names.index(n)].numel for n in reg.layers)
    assert rep.network.available and rep.critical_paths
    att = [p for p in rep.critical_paths if p.kind == "attenuation"][0]
    assert att.layers[-1].startswith("0.") and att.decades > 3  # the loss-side to input path loses > 1000x
    d = json.loads(rep.to_json())
    assert d["network"]["available"] and len(d["network"]["edges"]) == len(rec_run.edges)
    assert d["critical_paths"][0]["layers"] == att.layers
    last = rep.layers.set_index("layer").loc[names[-1]]
    assert last["health"] != "Critical" and "vanishing" not in last["flags"]


def test_exploding_learning_rate_is_critical_and_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    run = _train(model, opt, 12)
    rep = analyze(run)
    assert rep.overall_health == "Critical"
    top, nan = rep.diagnoses  # the cause, with its symptoms folded in ...
    assert top.cause == "lr_too_high" and top.priority == "Critical" and top.layers and top.first_step <= 1
    assert any(x.startswith("exploding:") for x in top.explains)
    assert "lower the learning rate" in top.action
    # ... and where the NaN began, right after it (the origin is worth its own line)
    assert nan.cause == "nonfinite" and nan.priority == "Critical" and nan.first_step > top.first_step
    assert run.nonfinite_origin is not None and "began in" in nan.evidence
    assert any(r.kind == "exploding" for r in rep.regions)
    assert rep.explosion is not None
    assert "lr_high" in ",".join(rep.layers["flags"]) or top.kind == "nonfinite"


def test_dead_relu_layer_from_a_large_negative_bias():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(-100.0)  # every unit of the second layer is off: nothing flows back
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run = _train(model, opt, 12)
    rep = analyze(run)
    h = rep.layers.set_index("layer")
    for name in ("2.weight", "2.bias", "0.weight", "0.bias", "4.weight"):
        assert "dead" in h.loc[name, "flags"], name
    assert h.loc["4.bias", "health"] == "Healthy"
    (zone,) = [r for r in rep.regions if r.kind == "dead"]
    assert zone.layers == ["4.weight", "2.bias", "2.weight", "0.bias", "0.weight"]
    assert zone.recovery == "Low" and zone.intervention_required
    att = [p for p in rep.critical_paths if p.kind == "attenuation"][0]
    assert att.reaches_zero and "falls to exactly zero" in rep.summary_text()
    dead = rep.diagnoses[0]
    assert dead.cause == "dead_units" and dead.layers[:2] == ["2.bias", "2.weight"]
    assert dead.layers[-1] == "4.weight"  # starved of input by the dead units: affected, named last
    assert "re-initialise 2.bias" in dead.action and dead.first_step == 0
    # every recorded edge into the dead block is blocked; the loss-side layers are the sources
    et = {(e.upstream, e.downstream): e.edge_type for e in rep.network.edges}
    assert set(et) == {(run.layer_names[a], run.layer_names[b]) for a, b in run.edges}
    assert all(t == "Blocked" for t in et.values())
    nodes = {n.layer: n.node_type for n in rep.network.nodes}
    assert nodes["4.bias"] == "Source" and nodes["2.bias"] == "Bottleneck"


def test_thousand_layers_stay_bounded_and_rolling_window_is_noted():
    rng = np.random.default_rng(0)
    g = np.exp(rng.standard_normal((30, 1000)))
    run = synth(g, numel=1, edges=[(i, i + 1) for i in range(999)])
    rep = analyze(run)
    assert len(rep.layers) == 1000 and len(rep.interactions) <= 50
    assert len(rep.network.edges) == 999 and rep.critical_paths
    json.loads(rep.to_json())
    from gradwidget.collect.arrays import ArrayRecorder

    rec = ArrayRecorder(max_steps=10, histogram_every=0)
    for s in range(25):
        rec.record(s, {"a": np.full(4, 0.1)})
    notes = analyze(rec.run).notes
    assert any("rolling window (steps 15–24)" in n for n in notes)


def test_summary_states_the_forecast_with_its_interval_not_r2():
    rng = np.random.default_rng(2)
    rep = analyze(synth(0.1 * np.exp(0.02 * rng.standard_normal((400, 3)))))
    f = rep.stability.forecast
    line = [text for text in rep.summary_text().splitlines() if text.startswith("Stability")][0]
    assert "R²" not in line and f.outlook == "Stable"
    assert f"over the next 100 recorded steps, 95% interval {f.interval[0]:+.2f} to {f.interval[1]:+.2f}" in line
    assert f"{f.confidence:.0%} probability it stays within ±{f.stable_band:.2f}" in line
    assert f.stable_band == pytest.approx(100 / 400)  # one decade per run, over a 100-step window


def test_summary_gives_the_convergence_estimate():
    t = np.arange(250)
    rep = analyze(synth(np.full((250, 2), 0.1), loss=1 + 4 * np.exp(-0.01 * t)))
    c = rep.convergence
    assert c.trend == "Converging" and c.estimated_steps_to_convergence == pytest.approx(109, abs=1)
    assert "Training progress: the loss is falling" in rep.summary_text()  # one account of progress
    json.loads(rep.to_json())


def test_an_unsteady_flat_forecast_says_why_it_is_uncertain():
    from gradwidget.analysis.stability import forecast
    from gradwidget.analysis.report import _outlook

    rng = np.random.default_rng(1)
    g = np.exp(0.05 * rng.standard_normal(1000))
    f = forecast(g, 100, band=0.1, steady=False)
    assert f.outlook == "Uncertain" and f.most_likely == "Stable" and f.confidence > 0.99
    assert _outlook(f).endswith("probability it stays within ±0.10, but the layers' gradients are unsteady)")
    edge = forecast(10 ** (0.1 * np.arange(100) / 100 + 0.05 * rng.standard_normal(100)), 100, band=0.1, steady=True)
    assert f"the most likely, {edge.most_likely}, has {edge.confidence:.0%})" in _outlook(edge)


def test_summary_says_the_critical_path_went_through_a_cycle():
    g = np.tile([1e-5, 1e-3, 1e-2, 1e-1], (60, 1))
    rep = analyze(synth(g, numel=1, edges=[(0, 1), (1, 2), (2, 1), (2, 3)]))
    line = [text for text in rep.summary_text().splitlines() if text.startswith("Critical path")][0]
    assert "l3.weight → l0.weight" in line and "the graph has cycles (a reused module)" in line
