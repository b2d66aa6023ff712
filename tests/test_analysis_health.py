"""Health: every risk factor and classification fires on a run built to trigger it."""

import numpy as np
import pytest

from gradwidget.analysis import dynamics, flow, health, interplay, stability, stats
from gradwidget.analysis.stats import Series
from test_analysis_stats import synth

T = 200


def analyse(g, **kw):
    s = Series(synth(g, **kw))
    fl = flow.flow_characteristics(s)
    f = health.risk_factors(s, fl)
    return s, fl, f, health.layer_health(s, fl, f)


def kinds(factors, layer):
    return {f.kind for f in factors if f.layer == layer}


def base(L=6, level=0.1, seed=0):
    rng = np.random.default_rng(seed)
    return level * np.exp(0.05 * rng.standard_normal((T, L)))


def test_each_risk_factor_fires_on_its_layer_only():
    g = base(10)
    mx = 3 * g / 10
    nf = np.zeros_like(g)
    z = np.zeros_like(g)
    upd = np.full_like(g, np.nan)
    upd[::10] = 1e-3  # healthy update/weight ratio (weight norm 1)
    nf[50, 0] = 2  # l0: non-finite
    mx[-30:, 1] = 1e4  # l1: exploding tail
    g[:, 2] = 1e-8  # l2: vanishing (mean |g| = 1e-9)
    z[:, 3] = 1.0  # l3: dead
    g[:, 4] = 0.1 * np.where(np.arange(T) % 2, 1.0, 4.0)  # l4: oscillating (and unstable)
    g[:, 5] = 1e-6  # l5: weak (relative), not vanishing (mean |g| 1e-7)
    g[:, 6] = 1e3  # l6: hot
    upd[::10, 7] = 0.5  # l7: lr too high
    upd[::10, 8] = 1e-8  # l8: lr too low
    # l9: unstable: x7 jumps between steps (log-normal, sigma 2) on a rising trend; its trend alone
    # (three decades) is not instability, the jumps are
    g[:, 9] = 1e-3 * 10 ** (3 * np.arange(T) / T) * np.exp(2.0 * np.random.default_rng(1).standard_normal(T))
    s, fl, f, h = analyse(
        g, max_abs=np.where(np.arange(10) == 1, mx, 3 * g / 10), nonfinite=nf, zero_frac=z, update=upd
    )
    names = [f"l{i}.weight" for i in range(10)]
    assert "nonfinite" in kinds(f, names[0])
    assert "exploding" in kinds(f, names[1])
    assert "vanishing" in kinds(f, names[2])
    assert "dead" in kinds(f, names[3])
    assert "oscillating" in kinds(f, names[4])
    assert "weak" in kinds(f, names[5]) and "vanishing" not in kinds(f, names[5])
    assert "hot" in kinds(f, names[6])
    assert kinds(f, names[7]) == {"lr_high"} and kinds(f, names[8]) == {"lr_low"}
    assert "unstable" in kinds(f, names[9])
    for fac in f:
        assert fac.evidence and 0 <= fac.severity <= 1
    hh = dict(zip(h.layer, h.health))
    assert hh[names[0]] == hh[names[1]] == hh[names[2]] == hh[names[3]] == "Critical"
    assert hh[names[7]] == "Warning"
    # every factor is named in the flags of its layer
    for fac in f:
        assert fac.kind in h.set_index("layer").loc[fac.layer, "flags"]


def test_healthy_unknown_and_too_many_factors():
    g = base(3)
    s, fl, f, h = analyse(g, status=["trainable", "frozen", "trainable"])
    assert list(h.health) == ["Healthy", "Unknown", "Healthy"] and np.isnan(h.risk[1])
    assert h.risk[0] == 0
    # three non-critical factors make a layer Critical (the original crate: more than 2)
    g2 = base(4)
    g2[:, 0] = 10 * np.where(np.arange(T) % 2, 1.0, 5.0)  # hot, oscillating, and updates too large
    upd = np.full_like(g2, np.nan)
    upd[::10] = 1e-3
    upd[::10, 0] = 0.5
    _, _, f2, h2 = analyse(g2, update=upd, thresholds={"relative_exploding": 10.0})
    assert {"hot", "oscillating", "lr_high"} <= kinds(f2, "l0.weight")
    assert not any(x.critical for x in f2)
    assert h2.health[0] == "Critical" and h2.n_factors[0] >= 3


def test_neuron_activity_is_one_minus_the_recorded_zero_fraction():
    z = np.full((T, 2), 0.25)
    z[:, 1] = 0.9
    _, _, _, h = analyse(base(2), zero_frac=z)
    assert h.neuron_activity.tolist() == pytest.approx([0.75, 0.1])


def test_convergence_indicator_over_the_window():
    w = 100
    g = np.column_stack([10 ** (-np.arange(T) / (w - 1)), np.full(T, 0.1), 10 ** (np.arange(T) / w)])
    _, _, _, h = analyse(g)
    assert h.convergence[0] == pytest.approx(1.0) and h.convergence[1] == pytest.approx(0, abs=1e-9)
    assert h.convergence[2] == 0
    g_half = 10 ** (-0.5 * np.arange(T) / (w - 1))[:, None]
    assert analyse(g_half)[3].convergence[0] == pytest.approx(0.5)
    assert np.isnan(analyse(np.full((50, 1), 0.1))[3].convergence[0])  # fewer steps than the window


def test_comparative_analysis():
    g = np.tile([1e-3, 1.1e-3, 1e-1, 1e-5], (T, 1))
    _, _, _, h = analyse(g)
    assert h["rank"].tolist() == [3, 2, 1, 4]
    assert h.similar_layers[0] == ["l1.weight"] and h.similar_layers[2] == []
    med = np.median(np.log10([1e-3, 1.1e-3, 1e-1, 1e-5]) - 1)  # mean |g| = norm / 10 (numel 100)
    assert h.relative_level[2] == pytest.approx(10 ** (np.log10(1e-2) - med), rel=1e-4)
    assert h.gap_decades[3] == pytest.approx(abs(np.log10(1e-6) - med), rel=1e-4)
    assert h.potential[2] < h.potential[3] <= 1


@pytest.mark.parametrize(
    "levels,kind",
    [
        ([1e-2, 1e-2, 1e-2, 1e-2], "Degenerate"),
        ([1e-2, 1e-3], "Degenerate"),
        (10 ** np.random.default_rng(0).normal(-2, 0.5, 400), "Normal"),
        ([1e-2] * 30 + [1e2], "Skewed"),
        ([1e-3] * 20 + [1e-2] * 20, "Multimodal"),
        (10 ** np.concatenate([np.random.default_rng(1).normal(-2, 0.1, 400), [-5] * 10, [1] * 10]), "HeavyTailed"),
    ],
)
def test_distribution_types(levels, kind):
    g = np.tile(np.asarray(levels, float), (20, 1))
    s = Series(synth(g))
    d = interplay.distribution(s, np.ones(len(levels), bool))
    assert d.kind == kind, d


def test_interactions_are_correlations_and_stay_bounded():
    t = np.arange(T)
    a = 10 ** (np.sin(t / 10))
    rng = np.random.default_rng(0)
    g = np.column_stack([a, 2 * a, 1 / a, np.exp(rng.standard_normal(T))])
    s = Series(synth(g))
    inter = interplay.interactions(s, top_k=3)
    pairs = {(i.layer1, i.layer2): i for i in inter}
    assert pairs[("l0.weight", "l1.weight")].interaction_type == "Cooperative"
    assert pairs[("l0.weight", "l1.weight")].correlation == pytest.approx(1, abs=1e-6)
    assert pairs[("l0.weight", "l2.weight")].interaction_type == "Disruptive"  # r = -1
    assert len(inter) == 3 and abs(inter[0].correlation) >= abs(inter[-1].correlation)
    share = interplay.energy_share(s)
    m = np.median(g, axis=0) ** 2
    assert share == pytest.approx(m / m.sum())
    p = pairs[("l0.weight", "l1.weight")]
    assert p.impact_score == pytest.approx(share[0] + share[1], rel=1e-6)  # |r| = 1


def test_competitive_and_disruptive_are_told_apart():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(T)
    b = -0.7 * a + np.sqrt(1 - 0.7**2) * rng.standard_normal(T)  # r about -0.7
    (i,) = interplay.interactions(Series(synth(np.exp(np.column_stack([a, b])))))
    assert -DIS < i.correlation <= -interplay.INTERACTION_CORR and i.interaction_type == "Competitive"
    assert [interplay._interaction_type(r) for r in (0.9, 0.2, -0.6, -0.85)] == [
        "Cooperative",
        "Neutral",
        "Competitive",
        "Disruptive",
    ]


DIS = interplay.DISRUPTIVE_CORR


def test_interactions_for_1000_layers_keep_top_k():
    rng = np.random.default_rng(0)
    g = np.exp(rng.standard_normal((40, 1000)))
    g[:, 999] = g[:, 3] * 5
    inter = interplay.interactions(Series(synth(g, numel=1)), top_k=10, block=128)
    assert len(inter) == 10 and (inter[0].layer1, inter[0].layer2) == ("l3.weight", "l999.weight")


def _dyn(loss, g=None):
    n = len(loss)
    g = np.full((n, 2), 0.1) if g is None else g
    s = Series(synth(g, loss=loss))
    return s, dynamics.dynamics(s)


def test_plateau_with_real_duration():
    n = 600
    loss = np.concatenate([np.linspace(2.0, 0.5, 320), np.full(280, 0.5)])
    _, d = _dyn(loss)
    assert d.plateau.is_plateau and d.learning_phase == "Plateau"
    assert 278 <= d.plateau.duration_steps <= 281, d.plateau  # the real plateau is 280 steps
    assert d.plateau.severity == "Moderate" and d.plateau.suggested_actions
    _, d2 = _dyn(np.linspace(2.0, 0.5, n))
    assert not d2.plateau.is_plateau and d2.plateau.duration_steps == 0 and d2.plateau.severity == "None"


def test_learning_phases():
    n = 400
    assert _dyn(np.exp(-0.02 * np.arange(n)))[1].learning_phase == "RapidLearning"
    assert _dyn(np.exp(-0.003 * np.arange(n)))[1].learning_phase == "Refinement"
    assert _dyn(np.exp(0.01 * np.arange(n)))[1].learning_phase == "Diverging"
    assert _dyn(np.exp(-0.02 * np.arange(50)))[1].learning_phase == "InitialLearning"


def test_convergence_trend_from_the_loss():
    n = 300
    for loss, trend in (
        (np.exp(-0.01 * np.arange(n)), "Converging"),
        (np.full(n, 0.3), "Stable"),
        (np.exp(0.01 * np.arange(n)), "Diverging"),
    ):
        s, d = _dyn(loss)
        fl = flow.flow_characteristics(s)
        h = health.layer_health(s, fl, health.risk_factors(s, fl))
        c = dynamics.convergence(s, h)
        assert c.trend == trend and c.series == "loss"
    assert c.loss == 0
    s, _ = _dyn(np.exp(-0.1 * np.arange(n) / 99 * np.log(10)))  # a tenth of a decade per 100 steps
    fl = flow.flow_characteristics(s)
    c = dynamics.convergence(s, health.layer_health(s, fl, health.risk_factors(s, fl)))
    assert c.loss == pytest.approx(0.1, rel=1e-3)


def test_stability_trend_sources_and_forecast():
    n = 400
    rng = np.random.default_rng(0)
    calm = 0.1 * np.exp(0.01 * rng.standard_normal((n, 2)))
    noisy = calm.copy()
    noisy[n // 2 :] *= np.exp(1.5 * rng.standard_normal((n // 2, 2)))
    growing = calm * (10 ** (4 * np.arange(n) / n))[:, None]
    for g, trend, outlook in ((calm, "Stable", "Stable"), (noisy, "Degrading", None), (growing, None, "Deteriorating")):
        s = Series(synth(g))
        fl = flow.flow_characteristics(s)
        f = health.risk_factors(s, fl)
        st = stability.stability(s, fl, f)
        if trend:
            assert st.trend == trend
        if outlook:
            assert st.forecast.outlook == outlook
        assert 0 <= st.forecast.confidence <= 1
    assert st.forecast.confidence == pytest.approx(1, abs=1e-3) and st.forecast.projected_decades > 0
    s = Series(synth(noisy))
    fl = flow.flow_characteristics(s)
    f = health.risk_factors(s, fl)
    srcs = stability.stability(s, fl, f).sources
    assert srcs and {x.kind for x in srcs} >= {"Instability"}


def test_remaining_classifications_fire():
    rng = np.random.default_rng(3)
    # interaction between two moderately correlated layers: Neutral
    a = rng.standard_normal(T)
    g = np.exp(np.column_stack([a, 0.3 * a + rng.standard_normal(T)]))
    (i,) = interplay.interactions(Series(synth(g)))
    assert i.interaction_type == "Neutral" and 0 < abs(i.correlation) < interplay.INTERACTION_CORR
    # too few steps for a trend: Unknown
    s = Series(synth(np.full((2, 1), 0.1)))
    fl = flow.flow_characteristics(s)
    assert dynamics.convergence(s, health.layer_health(s, fl, [])).trend == "Unknown"
    # plateau severities from the share of the run spent on it
    n = 600
    mild = np.concatenate([np.linspace(3, 1, 440), np.full(160, 1.0)])
    severe = np.concatenate([np.linspace(3, 1, 120), np.full(480, 1.0)])
    assert _dyn(mild)[1].plateau.severity == "Mild"
    assert _dyn(severe)[1].plateau.severity == "Severe"
    # stability improving; forecasts improving and uncertain
    n = 400
    calm = 0.1 * np.exp(0.01 * rng.standard_normal((n, 2)))
    settling = calm.copy()
    settling[: n // 2] *= np.exp(1.5 * rng.standard_normal((n // 2, 2)))
    falling = calm * (10 ** (-4 * np.arange(n) / n))[:, None]
    wild = 0.1 * np.exp(1.5 * rng.standard_normal((n, 2)))
    out = {}
    for name, g in (("settling", settling), ("falling", falling), ("wild", wild)):
        s = Series(synth(g))
        fl = flow.flow_characteristics(s)
        out[name] = stability.stability(s, fl, health.risk_factors(s, fl))
    assert out["settling"].trend == "Improving"
    assert out["falling"].forecast.outlook == "Improving"
    assert out["wild"].forecast.outlook == "Uncertain"


def test_urgency_levels():
    from gradwidget.analysis import advice

    rng = np.random.default_rng(4)
    g = 0.1 * np.exp(0.05 * rng.standard_normal((T, 6)))
    g[:, 0] = 1e3 * np.exp(3 * rng.standard_normal(T))  # hot and very unstable: Warning, stability < 0.3
    upd = np.full_like(g, np.nan)
    upd[::10] = 1e-3
    upd[::10, 1] = 0.5  # lr too high only: Warning, stable
    s, fl, f, h = analyse(g, update=upd, max_abs=np.full_like(g, 0.03))  # no explosion, only a hot layer
    assert list(h.health[:2]) == ["Warning", "Warning"], h[["layer", "health", "flags", "stability"]]
    pri = {p.layer: p for p in advice.priorities(h, advice.suggestions(f, []))}
    assert pri["l0.weight"].urgency == "High" and pri["l1.weight"].urgency == "Medium"


@pytest.mark.parametrize("n_flat", [100, 150, 250])
def test_plateau_of_half_the_run_is_found_with_its_length(n_flat):
    """A plateau as long as the rule asks for (half of a run shorter than the window) is found, and
    its duration is not shortened by the smoothing window (it was once reported 97 steps for 100)."""
    rng = np.random.default_rng(3)
    n = 2 * n_flat
    loss = np.concatenate([np.linspace(2.0, 1.0, n - n_flat), 1.0 + 1e-4 * rng.standard_normal(n_flat)])
    _, d = _dyn(loss)
    assert d.plateau.is_plateau, d.plateau
    assert n_flat - 3 <= d.plateau.duration_steps <= n_flat + 3, d.plateau


def test_a_slow_steady_descent_is_progress_and_a_settling_decay_plateaus_near_its_floor():
    """Long runs: a loss falling steadily by 4/5 over 4,096 steps changes by < plateau_rel_change per
    step, yet is not a plateau (its line falls far more than plateau_total_change of its level); an
    exponential decay plateaus where what is left of it is within that share of its floor."""
    rng = np.random.default_rng(5)
    n = 4096
    _, d = _dyn(np.linspace(5.0, 1.0, n) + 0.05 * rng.standard_normal(n))
    assert not d.plateau.is_plateau and d.learning_phase != "Plateau", d
    t = np.arange(n)
    _, d = _dyn(2.0 * np.exp(-t / 500) + 0.3 + 0.01 * rng.standard_normal(n))
    assert d.plateau.is_plateau and d.plateau.end_step == n - 1, d.plateau
    left = 2.0 * np.exp(-d.plateau.start_step / 500) / 0.3  # the decay still to come, per unit of floor
    assert 0.02 < left < 0.15, (d.plateau, left)
    assert d.plateau.duration_steps == d.plateau.end_step - d.plateau.start_step


def test_stability_without_a_global_norm_is_unknown_not_stable():
    """No finite global norm (an array recorder that logged none, or a run of NaN): the stability trend
    and the forecast say they do not know, instead of "Stable" over "the last 0 steps"."""
    from gradwidget.run import METRICS, LayerInfo, Run

    run = Run([LayerInfo("a.weight", numel=10, shape=(10,)), LayerInfo("b.weight", numel=10, shape=(10,))])
    for step in range(50):
        row = np.full((len(METRICS), 2), 0.1, np.float32)
        run.append(step, row, {})  # no loss, no global norm
    assert np.isnan(run.scalar("global_norm")).all()
    s = Series(run)
    fl = flow.flow_characteristics(s)
    st = stability.stability(s, fl, [])
    assert st.trend == "Unknown" and st.quarters == []
    assert st.forecast.outlook == "Uncertain" and "0 recorded steps" in st.forecast.basis
    assert "last 0" not in st.forecast.basis


def test_a_starved_majority_does_not_make_healthy_output_layers_hot():
    """Seven of twelve layers starve at 3e-6 (above the absolute vanishing threshold: mean |g| 3e-7),
    three sit at 1e-2 and the two output layers at 1e-1. The starved layers are the problem ("weak",
    3.5 decades below the typical layer); the output layers, one decade above the middle ones, are not
    "far stronger than the rest" (against the median layer, dragged down to 3e-6, they were 4.5
    decades above it)."""
    rng = np.random.default_rng(0)
    lv = np.array([3e-6] * 7 + [1e-2] * 3 + [1e-1] * 2)
    g = lv * np.exp(0.05 * rng.standard_normal((T, 12)))
    _, _, f, _ = analyse(g)
    names = [f"l{i}.weight" for i in range(12)]
    assert not [x for x in f if x.kind == "hot"], [(x.layer, x.evidence) for x in f]
    assert {x.layer for x in f if x.kind == "weak"} == set(names[:7])
    assert {x.kind for x in f} == {"weak"}
    assert all("typical layer" in x.evidence for x in f)


def test_a_hot_layer_is_still_found_against_the_typical_layer():
    g = base(8)
    g[:, 7] = 1e3  # 4 decades above the others
    g[:, :3] = 1e-5  # a weak region of three (mean |g| 1e-6: not vanishing)
    _, _, f, _ = analyse(g)
    assert kinds(f, "l7.weight") == {"hot"}
    assert {x.layer for x in f if x.kind == "weak"} == {"l0.weight", "l1.weight", "l2.weight"}


@pytest.mark.parametrize("zero_frac", [1.0, np.nan])
def test_a_dead_layer_is_dead_not_vanishing(zero_frac):
    """A layer whose gradient is exactly zero is dead (also when its zero fraction was not recorded):
    it gets the dead-layer advice first and is not repeated in the vanishing recommendation."""
    from gradwidget.analysis import analyze

    g = np.full((T, 6), 0.1)
    g[:, 0] = 0.0  # dead
    g[:, 1:3] = 1e-8  # vanishing (mean |g| 1e-9)
    z = np.zeros_like(g)
    z[:, 0] = zero_frac
    rep = analyze(synth(g, zero_frac=z))
    assert kinds(rep.risk_factors, "l0.weight") == {"dead"}
    recs = {r.cause: r for r in rep.diagnoses}
    assert recs["dead_units"].layers == ["l0.weight"] and "vanishing" not in recs
    assert "re-initialise l0.weight" in rep.layers.suggestion[0]
    regs = {r.kind: r for r in rep.regions}
    assert regs["dead"].layers == ["l0.weight"] and "l0.weight" not in regs["vanishing"].layers


def test_trend_fit_standard_error():
    rng = np.random.default_rng(5)
    n = 200
    x = np.arange(n)
    e = 0.1 * rng.standard_normal(n)
    sl, se, r2, m = stats.trend_fit(np.exp(0.002 * x + e), 10_000)
    b, a = np.polyfit(x, 0.002 * x + e, 1)
    res = 0.002 * x + e - (a + b * x)
    r = max(0.0, (res[1:] @ res[:-1]) / (res @ res))
    want = np.sqrt(res @ res / (n - 2) / ((x - x.mean()) ** 2).sum() * (1 + r) / (1 - r))
    assert m == n and sl == pytest.approx(b) and se == pytest.approx(want)
    # the same noise made autocorrelated (AR(1), 0.9): the error widens, as it must
    ar = np.zeros(n)
    for i in range(1, n):
        ar[i] = 0.9 * ar[i - 1] + e[i]
    assert stats.trend_fit(np.exp(ar), n)[1] > 2 * stats.trend_fit(np.exp(e), n)[1]


def test_a_flat_noisy_norm_is_confidently_stable_although_its_r2_is_near_zero():
    rng = np.random.default_rng(1)
    g = np.exp(0.05 * rng.standard_normal(1000))
    f = stability.forecast(g, 100, band=0.1, steady=True)
    assert f.r2 < 0.1 and f.outlook == "Stable" and f.confidence > 0.99
    lo, hi = f.interval
    assert lo < f.projected_decades < hi and -0.1 < lo and hi < 0.1
    assert stability.forecast(g, 100, band=0.1, steady=False).outlook == "Uncertain"  # unsteady layers
    # exact growth of 1 decade per 100 steps: certain deterioration, interval of zero width
    up = stability.forecast(10 ** (np.arange(300) / 100), 100, band=0.1, steady=True)
    assert up.outlook == "Deteriorating" and up.confidence == 1 and up.projected_decades == pytest.approx(1)
    # a trend right at the edge of the band: as likely inside as outside -> Uncertain, ~50%
    edge = stability.forecast(
        10 ** (0.1 * np.arange(100) / 100 + 0.05 * rng.standard_normal(100)), 100, band=0.1, steady=True
    )
    assert edge.outlook == "Uncertain" and 0.3 < edge.confidence < 0.8


def test_steps_to_convergence_of_a_decay_onto_a_floor():
    # y = 1 + 4 e^(-kt): the rate of ln y is -4k e^(-kt) / y; it falls below r where
    # 4 k e^(-kt) = r (1 + 4 e^(-kt)), i.e. e^(-kt) = r / (4 (k - r)).
    k, r, n, w = 0.01, 1e-3, 250, 80
    t = np.arange(n)
    y = 1 + 4 * np.exp(-k * t)
    exact = np.log(4 * (k - r) / r) / k - (n - 1)
    eta, why = dynamics.steps_to_convergence(y, t, w, r)
    assert eta == pytest.approx(exact, abs=1) and "R² 1.00" in why
    eta10, _ = dynamics.steps_to_convergence(y, 10 * t, w, r / 10)  # user steps 10 apart: rates per step / 10
    assert eta10 == pytest.approx(10 * eta, rel=0.01)
    assert dynamics.steps_to_convergence(np.full(n, 0.3), t, w, r)[0] == 0
    assert dynamics.steps_to_convergence(np.exp(-0.01 * t), t, w, r)[0] is None  # constant rate: never
    assert "never flattens" in dynamics.steps_to_convergence(np.exp(-0.01 * t), t, w, r)[1]
    assert "rising" in dynamics.steps_to_convergence(np.exp(0.01 * t), t, w, r)[1]
    assert dynamics.steps_to_convergence(y[:150], t[:150], w, r)[0] is None  # too short for two windows
    s, _ = _dyn(y)
    fl = flow.flow_characteristics(s)
    c = dynamics.convergence(s, health.layer_health(s, fl, health.risk_factors(s, fl)))
    assert c.trend == "Converging" and c.estimated_steps_to_convergence == eta


def test_steps_to_convergence_with_noise_and_a_long_run():
    rng = np.random.default_rng(4)
    k, r, w = 2e-4, 1e-5, 1000
    t = np.arange(20_000)
    y = (1 + 4 * np.exp(-k * t)) * np.exp(0.003 * rng.standard_normal(t.size))
    exact = np.log(4 * (k - r) / r) / k - t[-1]
    eta, why = dynamics.steps_to_convergence(y, t, w, r)
    assert eta == pytest.approx(exact, rel=0.1), why


def test_momentum_velocity_and_adaptation_are_measured():
    rng = np.random.default_rng(6)
    t = np.arange(2000)
    assert dynamics.velocity(0.99 ** t[:50], t[:50]) == pytest.approx(0.01)
    assert dynamics.velocity(0.99 ** t[:50], 5 * t[:50]) == pytest.approx(0.002)  # per user step
    assert dynamics.momentum(np.exp(rng.standard_normal(2000))) == pytest.approx(-0.5, abs=0.05)  # noise
    assert dynamics.momentum(np.exp(np.cumsum(rng.standard_normal(2000)))) == pytest.approx(0, abs=0.06)
    assert dynamics.momentum(np.exp(np.sin(t / 50))) > 0.99  # persistent drift
    assert dynamics.momentum(np.where(t % 2, 1.0, 2.0)) == pytest.approx(-1, abs=1e-3)  # alternation
    # a loss shedding 2% per step, then 1%: velocity of the window ~1.5%, adaptation -1%
    loss = np.concatenate([0.98 ** np.arange(51), 0.98**50 * 0.99 ** np.arange(1, 51)])
    g = np.exp(np.cumsum(0.1 * rng.standard_normal((101, 2)), axis=0))
    s, d = _dyn(loss, g=g)
    assert d.learning_velocity == pytest.approx(0.015, abs=1e-3)
    assert d.adaptation_rate == pytest.approx(-0.01, abs=1e-3)
    assert d.gradient_momentum == pytest.approx(dynamics.momentum(s.run.scalar("global_norm")[-100:]))


def test_rates_are_per_user_step_when_steps_are_recorded_sparsely():
    n = 300
    loss = np.exp(-0.005 * np.arange(n))  # 0.5% per recorded step
    for every, trend, phase in ((1, "Converging", "Refinement"), (10, "Stable", "Plateau")):
        s = Series(synth(np.full((n, 2), 0.1), loss=loss, steps=np.arange(n) * every))
        fl = flow.flow_characteristics(s)
        c = dynamics.convergence(s, health.layer_health(s, fl, health.risk_factors(s, fl)))
        assert c.rel_change_per_step == pytest.approx(-0.005 / every, rel=1e-6)
        assert c.trend == trend  # 0.05% per user step is below plateau_rel_change
        assert (c.estimated_steps_to_convergence == 0) == (trend == "Stable")
        d = dynamics.dynamics(s)
        assert d.rel_change_per_step == pytest.approx(-0.005 / every, rel=1e-6) and d.learning_phase == phase
