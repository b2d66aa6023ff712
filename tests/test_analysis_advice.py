"""Groups, suggestions, priorities and recommendations: computed from the run, each tied to evidence."""

import numpy as np
import pytest

from gradwidget.analysis import advice, analyze, dynamics, flow, health, stability
from gradwidget.analysis.stats import Series
from test_analysis_stats import synth

T = 120


def parts(g, **kw):
    s = Series(synth(g, **kw))
    fl = flow.flow_characteristics(s)
    f = health.risk_factors(s, fl)
    return s, fl, f, health.layer_health(s, fl, f), flow.regions(s)


def test_groups_by_level_and_module_are_characterised_from_members():
    t = np.arange(T)
    wave = np.exp(np.sin(t / 7))
    g = np.column_stack([1e-1 * wave, 2e-1 * wave, 1e-3 * wave, 1e-3 / wave, 1e-6 * np.ones(T)])
    names = ["enc.a.weight", "enc.b.weight", "dec.a.weight", "dec.b.weight", "dec.c.weight"]
    s, fl, f, h, _ = parts(g, names=names)
    groups = {(x.by, x.name): x for x in advice.layer_groups(s, h)}
    # median level 1e-3: 1e-1 and 2e-1 are > 10x above (High), 1e-6 is > 10x below (Low)
    assert groups[("level", "High gradient")].layers == ["enc.a.weight", "enc.b.weight"]
    assert groups[("level", "Low gradient")].layers == ["dec.c.weight"]
    hi = groups[("level", "High gradient")].characteristics
    med = np.median(1e-1 * wave), np.median(2e-1 * wave)
    assert hi.mean_gradient_norm == pytest.approx(np.sqrt(med[0] * med[1]), rel=1e-3)
    assert hi.synchronization == pytest.approx(1.0, abs=1e-6)  # identical shapes
    assert hi.internal_coherence == pytest.approx(1 / (1 + np.log10(2) / 2), rel=1e-3)
    dec = groups[("module", "dec")]
    assert dec.layers == ["dec.a.weight", "dec.b.weight", "dec.c.weight"]
    assert dec.characteristics.synchronization == pytest.approx(-1.0, abs=1e-6)  # a vs 1/a; c is constant
    assert groups[("module", "enc")].characteristics.difficulty == "Easy"
    assert dec.characteristics.difficulty in ("Moderate", "Difficult")
    assert np.isnan(dec.characteristics.lr_sensitivity)  # no optimizer recorded


def test_suggestions_cover_each_kind_with_evidence():
    g = np.full((T, 8), 0.1)
    g[:, 0] = 1e-8  # vanishing -> initialisation
    g[:, 1] = 1e-8
    mx = 3 * g / 10
    mx[-10:, 2] = 1e5  # exploding -> clipping, learning_rate
    z = np.zeros_like(g)
    z[:, 3] = 1  # dead -> activation
    g[:, 4] = 0.1 * np.where(np.arange(T) % 2, 1, 8)  # oscillating -> regularisation
    g[:, 5] = 1e4  # hot -> normalisation
    upd = np.full_like(g, np.nan)
    upd[::10] = 1e-3
    upd[::10, 6] = 0.5  # lr_high -> learning_rate
    s, fl, f, h, regs = parts(g, max_abs=mx, zero_frac=z, update=upd)
    sug = advice.suggestions(f, regs)
    by = {}
    for x in sug:
        by.setdefault(x.layer, set()).add(x.kind)
        assert x.evidence and 0 <= x.expected_impact <= 1
    assert {"initialisation", "residual"} <= by["l0.weight"]  # two adjacent vanishing layers: a region
    assert {"clipping", "learning_rate"} <= by["l2.weight"]
    assert "activation" in by["l3.weight"] and "regularisation" in by["l4.weight"]
    assert "normalisation" in by["l5.weight"] and "learning_rate" in by["l6.weight"]
    assert "l7.weight" not in by
    assert [x.expected_impact for x in sug] == sorted((x.expected_impact for x in sug), reverse=True)

    pri = advice.priorities(h, sug)
    bad = set(h.layer[h.health != "Healthy"])
    assert {p.layer for p in pri if p.target_type == "IndividualLayer"} == bad
    (net,) = [p for p in pri if p.target_type == "NetworkLevel"]  # 7 of 8 layers have a problem
    assert net.layer == "network" and set(net.layers) == bad and net.score == pytest.approx(7 / 8)
    assert all(x.side_effects == list(advice.ACTION_META[x.kind][3]) for x in sug)
    l2 = [p for p in pri if p.layer == "l2.weight"][0]  # exploding: clipping and learning rate
    assert {a.action_type for a in l2.recommended_actions} == {"OptimizationTechnique", "LearningRateScheduling"}
    assert all(a.implementation_effort == "Minimal" for a in l2.recommended_actions)
    assert pri[0].urgency == "Critical" and all(0 <= p.score <= 1 for p in pri)
    assert [advice.PRIORITY_ORDER.index(p.urgency) for p in pri] == sorted(
        advice.PRIORITY_ORDER.index(p.urgency) for p in pri
    )

    recs = analyze(s.run).diagnoses  # causes, ranked, one action each
    causes = [r.cause for r in recs]
    assert {"exploding", "dead_units"} <= set(causes)
    assert all(r.text and r.action and r.evidence and r.cause and r.title for r in recs)
    assert [advice.PRIORITY_ORDER.index(r.priority) for r in recs] == sorted(
        advice.PRIORITY_ORDER.index(r.priority) for r in recs
    )


def test_a_healthy_run_gets_no_recommendations():
    rng = np.random.default_rng(0)
    g = 0.1 * np.exp(0.05 * rng.standard_normal((T, 4)))
    rep = analyze(synth(g, loss=np.exp(-0.01 * np.arange(T))))
    assert rep.overall_health == "Healthy" and rep.diagnoses == []
    assert rep.summary_text().startswith(f"Healthy: nothing found in {T} recorded steps.")
    assert (rep.layers["suggestion"] == "").all() and (rep.layers["flags"] == "").all()


def test_plateau_recommendation():
    loss = np.concatenate([np.linspace(2, 1, 100), np.full(400, 1.0)])
    rep = analyze(synth(np.full((500, 2), 0.1), loss=loss))
    (r,) = rep.diagnoses
    assert r.cause == "plateau" and "plateaued" in r.text and rep.dynamics.learning_phase == "Plateau"


def test_causes_rank_by_priority_then_precedence_and_give_one_verdict():
    from gradwidget.analysis import causes

    c = [
        causes.Diagnosis("frozen", "Low", ["f"], 0, "e", 1.0),
        causes.Diagnosis("vanishing", "High", ["a"], 3, "e", 0.5),
        causes.Diagnosis("not_in_optimizer", "High", ["b"], 0, "e", 1.0),
    ]
    c.sort(key=lambda x: (causes.PRIORITY_ORDER.index(x.priority), causes.CAUSES.index(x.cause)))
    assert [x.cause for x in c] == ["not_in_optimizer", "vanishing", "frozen"]  # root cause before symptom
    assert causes.verdict(c) == "Warning" and causes.verdict(c[2:]) == "Healthy" and causes.verdict([]) == "Healthy"
    assert causes.verdict([causes.Diagnosis("nonfinite", "Critical", [], 0, "e", 1.0)]) == "Critical"
    run = synth(np.full((10, 3), 0.1))
    found = c + [causes.Diagnosis("nonfinite", "Critical", ["l1.weight"], 0, "e", 1.0)]
    h = causes.layer_verdicts(run, found, run.cannot_move())
    assert list(h) == ["Healthy", "Critical", "Healthy"]


def test_group_and_network_priorities():
    L = 10
    g = np.full((T, L), 0.1)
    g[:, 0:3] = 1e-8  # three adjacent vanishing layers: one region
    s, fl, f, h, regs = parts(g, names=[f"enc.{i}.weight" for i in range(L)], loss=np.exp(-0.02 * np.arange(T)))
    dyn = dynamics.dynamics(s)
    pri = advice.priorities(h, advice.suggestions(f, regs), regs, advice.layer_groups(s, h), dyn, None)
    (grp,) = [p for p in pri if p.target_type == "LayerGroup"]
    assert grp.layer == "vanishing region enc.2.weight … enc.0.weight"
    assert sorted(grp.layers) == ["enc.0.weight", "enc.1.weight", "enc.2.weight"]
    members = [p for p in pri if p.target_type == "IndividualLayer"]
    assert grp.score == max(p.score for p in members) and grp.urgency == "Critical"
    assert grp.expected_impact == pytest.approx(1.0)  # flagged on every step
    types = {a.action_type for a in grp.recommended_actions}
    assert {"ArchitecturalChange", "ParameterAdjustment"} <= types  # residual connections, re-initialisation
    res = [a for a in grp.recommended_actions if a.action_type == "ArchitecturalChange"][0]
    assert res.implementation_effort == "High" and "retraining" in res.prerequisites
    assert not [p for p in pri if p.target_type == "NetworkLevel"]  # 3 of 10 layers: not network-wide
    # a plateau and a deteriorating forecast are network-level
    plateau = dynamics.Dynamics("Plateau", 0.0, dynamics.Plateau(True, 300, "Severe", 0.0, ["use a schedule"]), "loss")
    fc = stability.Forecast("Deteriorating", 1.0, 0.9, "")
    net = [p for p in advice.priorities(h, [], (), (), plateau, fc) if p.target_type == "NetworkLevel"]
    assert [(p.layer, p.urgency, p.score) for p in net] == [
        ("training progress", "High", 1.0),
        ("global gradient norm", "High", 0.9),
    ]


def test_a_module_with_most_layers_in_trouble_is_one_priority():
    g = np.full((T, 5), 0.1)
    g[:, 2] = 1e-8  # dec.a vanishing
    mx = 3 * g / 10
    mx[-5:, 4] = 1e5  # dec.c exploding; dec.b healthy
    names = ["enc.a.weight", "enc.b.weight", "dec.a.weight", "dec.b.weight", "dec.c.weight"]
    s, fl, f, h, regs = parts(g, names=names, max_abs=mx, loss=np.exp(-0.02 * np.arange(T)))
    pri = advice.priorities(h, advice.suggestions(f, regs), regs, advice.layer_groups(s, h))
    (grp,) = [p for p in pri if p.target_type == "LayerGroup"]
    assert grp.layer == "module dec" and sorted(grp.layers) == ["dec.a.weight", "dec.c.weight"]
    names = [a.name for a in grp.recommended_actions]
    assert any("clip gradients" in n for n in names) and any("re-initialise" in n for n in names)
    # a weight and its bias inside a vanishing region: the region is the one group priority
    g2 = np.full((T, 4), 0.1)
    g2[:, 0:2] = 1e-8
    names2 = ["m.a.weight", "m.a.bias", "m.b.weight", "n.weight"]
    s, fl, f, h, regs = parts(g2, names=names2, loss=np.exp(-0.02 * np.arange(T)))
    pri = advice.priorities(h, advice.suggestions(f, regs), regs, advice.layer_groups(s, h))
    assert [p.layer for p in pri if p.target_type == "LayerGroup"] == ["vanishing region m.a.bias … m.a.weight"]


@pytest.mark.parametrize("growth", [1.5, 20.0])
def test_a_nan_after_the_weights_grew_tenfold_says_lower_the_learning_rate(growth):
    """The module that overflowed first is named either way; when a layer's weights had grown 10x
    or more by then (nonfinite.weight_growth), the advice also says to lower the learning rate."""
    from gradwidget.run import METRICS, LayerInfo, NonfiniteOrigin, Run

    M = {m: i for i, m in enumerate(METRICS)}
    run = Run(
        [LayerInfo("a.weight", module="a", backward_index=1), LayerInfo("b.weight", module="b", backward_index=0)]
    )
    for s in range(8):
        v = np.full((len(METRICS), 2), 0.1, np.float32)
        v[M["zero_frac"]] = v[M["nonfinite"]] = 0
        v[M["weight_norm"]] = [1.0, growth ** (s / 5)]
        if s >= 5:
            v[M["grad_norm"]] = v[M["mean_abs"]] = v[M["max_abs"]] = np.nan
            v[M["nonfinite"]] = 4
        run.append(s, v)
    run.nonfinite_origin = NonfiniteOrigin("b.act", 5, "forward")
    nf = next(r for r in analyze(run).diagnoses if r.cause == "nonfinite")
    assert "b.act" in nf.evidence and nf.action.startswith("fix b.act")
    assert ("lower the learning rate" in nf.action) == (growth >= 10)
    assert ("weight norm had grown 20x" in nf.evidence) == (growth >= 10)
