"""Weights (the original crate's weight analysis): statistics, entropy, issues and their recommendations, outliers, explosion, drift."""

import numpy as np
import pytest

from gradwidget.analysis import weights as W
from test_analysis_stats import synth


def test_statistics_match_numpy_and_entropy_is_from_a_histogram():
    rng = np.random.default_rng(0)
    a = rng.normal(0.5, 2.0, (40, 25))
    st = W.weight_statistics(a)
    m, sd = a.mean(), a.std()
    assert st["mean"] == pytest.approx(m) and st["std"] == pytest.approx(sd)
    assert st["skewness"] == pytest.approx(np.mean(((a - m) / sd) ** 3))
    assert st["kurtosis"] == pytest.approx(np.mean(((a - m) / sd) ** 4) - 3)
    assert (st["min"], st["max"], st["zero_frac"], st["numel"]) == (a.min(), a.max(), 0.0, 1000)
    counts, _ = np.histogram(a, bins=32)  # sqrt(1000) ~ 32 bins
    p = counts[counts > 0] / a.size
    assert st["entropy_bits"] == pytest.approx(-(p * np.log2(p)).sum())
    uniform = W.weight_statistics(np.linspace(-1, 1, 10000))
    assert uniform["entropy"] == pytest.approx(1.0, abs=1e-3)  # all 100 bins equally full
    assert W.weight_statistics(np.full(50, 0.3))["entropy"] == 0.0  # one value: no uncertainty


def test_every_issue_fires_with_its_own_recommendation():
    rng = np.random.default_rng(1)
    mostly_zero = np.where(rng.random(1000) < 0.7, 0.0, rng.normal(0, 0.1, 1000))
    skewed = rng.exponential(0.1, 1000) ** 2
    heavy = rng.standard_t(1.5, 5000) * 0.01
    extreme = rng.normal(0, 0.1, 1000)
    extreme[0] = 50.0
    rep = W.analyze_weights(
        {"zero": mostly_zero, "skew": skewed, "heavy": heavy, "extreme": extreme, "ok": rng.normal(0, 0.1, 1000)}
    )
    df = rep.layers.set_index("layer")
    assert "mostly_zero" in df.loc["zero", "issue_codes"] and "dead neurons" not in df.loc["zero", "issues"]
    assert "skewed" in df.loc["skew", "issue_codes"]
    assert "heavy_tailed" in df.loc["heavy", "issue_codes"]
    assert "extreme" in df.loc["extreme", "issue_codes"]
    assert df.loc["ok", "issue_codes"] == "" and df.loc["ok", "health_score"] == 100
    for code, (issue, rec) in W.ISSUES.items():
        if code == "nonfinite":  # test_nonfinite_weights_are_critical_not_excellent
            continue
        layer = {"mostly_zero": "zero", "skewed": "skew", "heavy_tailed": "heavy", "extreme": "extreme"}[code]
        assert issue in df.loc[layer, "issues"] and rec in df.loc[layer, "recommendations"]
    assert df.loc["zero", "health_score"] <= 70 and df.loc["zero", "distribution"] != "Excellent"
    assert "heavy" in rep.summary_text()


def test_distribution_status_bands():
    assert W.distribution_health(dict(zero_frac=0, skewness=0, kurtosis=0, max=1, min=-1)) == (100, "Excellent")
    assert W.distribution_health(dict(zero_frac=0.5, skewness=0, kurtosis=0, max=1, min=-1))[1] == "Good"
    assert W.distribution_health(dict(zero_frac=0.5, skewness=2, kurtosis=0, max=1, min=-1))[1] == "Fair"
    assert W.distribution_health(dict(zero_frac=0.5, skewness=2, kurtosis=9, max=1, min=-1))[1] == "Poor"
    assert W.distribution_health(dict(zero_frac=0.5, skewness=2, kurtosis=9, max=9, min=-1))[1] == "Critical"


def test_outliers_are_capped_with_indices():
    rng = np.random.default_rng(2)
    a = rng.normal(0, 1, (100, 100))
    a[7, 9] = 40.0
    a[50, 1] = -20.0
    rep = W.analyze_weights({"w": a})
    n = int(rep.layers.n_outliers[0])
    z = np.abs((a - a.mean()) / a.std())
    assert n == int((z > 3).sum()) and n > W.MAX_OUTLIERS
    assert len(rep.outliers) == W.MAX_OUTLIERS
    assert rep.outliers[0].index == (7, 9) and rep.outliers[0].severity == "High"
    assert rep.outliers[1].index == (50, 1)
    assert {o.severity for o in rep.outliers} <= {"High", "Medium"}


def test_gradient_explosion_analysis():
    norms = [1.0] * 18 + [5e3, 2e4]
    e = W.gradient_explosion([f"l{i}" for i in range(20)], norms, 1e3)
    assert [x.layer for x in e.exploding_layers] == ["l18", "l19"]
    assert e.explosion_ratio == pytest.approx(0.1) and e.max_abs == 2e4
    assert e.severity == "Critical"  # max > 10 x threshold
    assert e.exploding_layers[1].ratio_to_mean == pytest.approx(2e4 / np.mean(norms))
    assert e.exploding_layers[1].severity == "Medium"  # ~16x the mean
    assert any("clip" in m for m in e.mitigation)
    calm = W.gradient_explosion(["a", "b"], [1.0, 2.0], 1e3)
    assert calm.severity == "Low" and calm.exploding_layers == []


def test_drift_between_snapshots_and_from_the_run():
    w0 = {"a": np.ones(100), "b": np.ones(100)}
    w1 = {"a": np.ones(100) * 1.0001, "b": np.ones(100) * 1.5}
    d = W.drift_between(w1, w0)
    assert d.source == "snapshots" and d.max_drift == pytest.approx(0.5) and d.severity == "High"
    assert d.affected_layers == ["b"] and d.mean_drift == pytest.approx((1e-4 + 0.5) / 2)
    assert W.drift_between(w0, w0).severity == "Minimal"
    upd = np.full((50, 2), np.nan)
    upd[::10] = [1e-3, 0.3]
    r = W.drift_from_run(synth(np.ones((50, 2)), update=upd, weight=np.ones((50, 2))))
    assert r.source == "recorded updates" and r.max_drift == pytest.approx(0.3) and r.severity == "High"
    assert r.affected_layers == ["l1.weight"]
    assert W.drift_from_run(synth(np.ones((5, 2)))) is None
    upd[::10] = [1e-3, 1e-3]
    assert W.drift_from_run(synth(np.ones((50, 2)), update=upd)).severity == "Normal"  # inside the healthy band


def test_weights_from_a_torch_module_and_in_analyze():
    torch = pytest.importorskip("torch")
    from gradwidget.analysis import analyze

    m = torch.nn.Linear(4, 3)
    w = W.weights_from_module(m)
    assert set(w) == {"weight", "bias"} and w["weight"].shape == (3, 4)
    run = synth(np.ones((10, 2)), names=["weight", "bias"], numel=[12, 3])
    rep = analyze(run, weights=m, previous_weights={k: v * 0.5 for k, v in w.items()})
    assert list(rep.weights.layers.layer) == ["weight", "bias"]
    assert rep.weights.drift.max_drift == pytest.approx(1.0)
    assert "Weights: 2 layers" in rep.weights.summary_text()
    with pytest.raises(TypeError, match="non-empty dict"):
        W.analyze_weights({})


def test_remaining_severities():
    norms = [1.0] * 19
    assert W.gradient_explosion(range(20), norms + [2.5e3], 1e3).severity == "Medium"
    assert W.gradient_explosion(range(20), norms + [6e3], 1e3).severity == "High"
    w0 = {"a": np.ones(100)}
    assert W.drift_between({"a": np.ones(100) * (1 + 1e-3)}, w0).severity == "Normal"  # inside the healthy band


def test_nonfinite_weights_are_critical_not_excellent():
    rng = np.random.default_rng(0)
    good = rng.normal(0, 0.05, (32, 32))
    some_nan = good.copy()
    some_nan[3, 4] = np.nan
    all_inf = np.full((4, 4), np.inf)
    rep = W.analyze_weights({"good": good, "some_nan": some_nan, "all_inf": all_inf})
    df = rep.layers.set_index("layer")
    assert df.loc["good", "health_score"] == 100 and df.loc["good", "distribution"] == "Excellent"
    for name, n_bad in (("some_nan", 1), ("all_inf", 16)):
        assert df.loc[name, "nonfinite"] == n_bad
        assert df.loc[name, "health_score"] == 0 and df.loc[name, "distribution"] == "Critical"
        assert "NaN/Inf" in df.loc[name, "issues"] and "checkpoint" in df.loc[name, "recommendations"]
    assert rep.distribution_status == "Critical"
    assert "NaN/Inf" in rep.summary_text()


def test_nonfinite_drift_is_reported_as_such():
    w = {"a": np.ones(4), "b": np.ones(4)}
    prev = {"a": np.ones(4), "b": np.ones(4)}
    w["b"] = np.array([1.0, np.inf, 1.0, 1.0])
    d = W.drift_between(w, prev)
    assert d.severity == "NonFinite" and d.max_drift == np.inf and d.affected_layers == ["b"]
    assert d.mean_drift == 0.0  # the finite layers' mean
    # the same read from a run: an update norm that overflowed
    T = 30
    g = np.full((T, 2), 0.1)
    upd = np.full((T, 2), np.nan)
    upd[::5] = 1e-3
    upd[20, 1] = np.inf
    rd = W.drift_from_run(synth(g, update=upd))
    assert rd.severity == "NonFinite" and rd.affected_layers == ["l1.weight"]
    assert W.drift_from_run(synth(g, update=np.where(np.isinf(upd), 1e-3, upd))).severity != "NonFinite"


def test_report_explosion_uses_the_flags_metric_and_threshold():
    from gradwidget.analysis import analyze

    T = 20
    g = np.full((T, 3), 0.5 * np.sqrt(5e6))  # L2 norm 1118 from |g| = 0.5 everywhere: healthy
    mx = np.full((T, 3), 0.5)
    mx[7, 2] = 5e3  # one step with a huge entry in l2 (not the last step)
    rep = analyze(synth(g, numel=[5_000_000, 5_000_000, 10], max_abs=mx, mean_abs=np.full((T, 3), 0.5)))
    flagged = sorted(f.layer for f in rep.risk_factors if f.kind in ("exploding", "nonfinite"))
    e = rep.explosion
    assert [x.layer for x in e.exploding_layers] == flagged == ["l2.weight"]
    assert e.max_abs == 5e3 and e.threshold == rep.thresholds.exploding
    assert e.exploding_layers[0].ratio_to_mean == pytest.approx(5e3 / np.mean([0.5, 0.5, 5e3]))
    calm = analyze(synth(g, numel=5_000_000, max_abs=np.full((T, 3), 0.5), mean_abs=np.full((T, 3), 0.5)))
    assert calm.explosion.exploding_layers == [] and calm.explosion.severity == "Low"
