"""Groups, suggestions, priorities and recommendations: computed from the run, each tied to evidence."""
import numpy as np
import pytest

from gradwidget.analysis import advice, analyze, flow, health
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
    assert hi.synchronization == pytest.approx(1.0, abs=1e-6)           # identical shapes
    assert hi.internal_coherence == pytest.approx(1 / (1 + np.log10(2) / 2), rel=1e-3)
    dec = groups[("module", "dec")]
    assert dec.layers == ["dec.a.weight", "dec.b.weight", "dec.c.weight"]
    assert dec.characteristics.synchronization == pytest.approx(-1.0, abs=1e-6)  # a vs 1/a; c is constant
    assert groups[("module", "enc")].characteristics.difficulty == "Easy"
    assert dec.characteristics.difficulty in ("Moderate", "Difficult")
    assert np.isnan(dec.characteristics.lr_sensitivity)  # no optimizer recorded


def test_suggestions_cover_each_kind_with_evidence():
    g = np.full((T, 8), 0.1)
    g[:, 0] = 1e-8                                            # vanishing -> initialisation
    g[:, 1] = 1e-8
    mx = 3 * g / 10
    mx[-10:, 2] = 1e5                                         # exploding -> clipping, learning_rate
    z = np.zeros_like(g)
    z[:, 3] = 1                                               # dead -> activation
    g[:, 4] = 0.1 * np.where(np.arange(T) % 2, 1, 8)          # oscillating -> regularisation
    g[:, 5] = 1e4                                             # hot -> normalisation
    upd = np.full_like(g, np.nan)
    upd[::10] = 1e-3
    upd[::10, 6] = 0.5                                        # lr_high -> learning_rate
    s, fl, f, h, regs = parts(g, max_abs=mx, zero_frac=z, update=upd)
    sug = advice.suggestions(f, regs)
    by = {}
    for x in sug:
        by.setdefault(x.layer, set()).add(x.kind)
        assert x.evidence and 0 <= x.expected_impact <= 1
    assert {"initialisation", "residual"} <= by["l0.weight"]   # two adjacent vanishing layers: a region
    assert {"clipping", "learning_rate"} <= by["l2.weight"]
    assert "activation" in by["l3.weight"] and "regularisation" in by["l4.weight"]
    assert "normalisation" in by["l5.weight"] and "learning_rate" in by["l6.weight"]
    assert "l7.weight" not in by
    assert [x.expected_impact for x in sug] == sorted((x.expected_impact for x in sug), reverse=True)

    pri = advice.priorities(h, sug)
    assert {p.layer for p in pri} == set(h.layer[h.health != "Healthy"])
    assert pri[0].urgency == "Critical" and all(0 <= p.score <= 1 for p in pri)
    assert [advice.PRIORITY_ORDER.index(p.urgency) for p in pri] == sorted(
        advice.PRIORITY_ORDER.index(p.urgency) for p in pri)

    recs = advice.recommendations(f, regs, health.dynamics(s), h)
    kinds = [r.kind for r in recs]
    assert kinds[:3] == ["vanishing", "exploding", "dead"] or set(kinds[:3]) == {"vanishing", "exploding", "dead"}
    van = recs[kinds.index("vanishing")]
    assert van.layers == ["l0.weight", "l1.weight"] and "l1.weight … l0.weight" in van.action
    assert all(r.text and r.action for r in recs)
    assert [advice.PRIORITY_ORDER.index(r.priority) for r in recs] == sorted(
        advice.PRIORITY_ORDER.index(r.priority) for r in recs)


def test_a_healthy_run_gets_no_recommendations():
    rng = np.random.default_rng(0)
    g = 0.1 * np.exp(0.05 * rng.standard_normal((T, 4)))
    rep = analyze(synth(g, loss=np.exp(-0.01 * np.arange(T))))
    assert rep.overall_health == "Healthy" and rep.recommendations == []
    assert "No problems found" in rep.summary_text()
    assert (rep.layers["suggestion"] == "").all() and (rep.layers["flags"] == "").all()


def test_plateau_recommendation():
    loss = np.concatenate([np.linspace(2, 1, 100), np.full(400, 1.0)])
    rep = analyze(synth(np.full((500, 2), 0.1), loss=loss))
    (r,) = rep.recommendations
    assert r.kind == "plateau" and "plateaued" in r.text and rep.dynamics.learning_phase == "Plateau"


def test_recommendation_priority_bands():
    import pandas as pd

    from gradwidget.analysis.health import Dynamics, Plateau, RiskFactor

    h = pd.DataFrame({"layer": ["a", "b", "c", "d"], "relative_level": [1.0] * 4})
    dyn = Dynamics("Refinement", 0.0, Plateau(False, 0, "None", 0.0), "loss")
    fs = [RiskFactor("a", "unstable", 0.1, False, "e"), RiskFactor("b", "oscillating", 0.3, False, "e"),
          RiskFactor("c", "hot", 0.6, False, "e"), RiskFactor("d", "exploding", 0.5, True, "e")]
    recs = advice.recommendations(fs, [], dyn, h)
    assert [(r.kind, r.priority) for r in recs] == [("exploding", "Critical"), ("hot", "High"),
                                                   ("oscillating", "Medium"), ("unstable", "Low")]
