"""Per-layer statistics and the shared views: checked against numpy on series with known answers."""

import numpy as np
import pytest

from gradwidget.analysis import stats
from gradwidget.run import METRICS, LayerInfo, Run


def synth(
    g,
    names=None,
    *,
    numel=100,
    edges=(),
    loss=None,
    zero_frac=None,
    nonfinite=None,
    max_abs=None,
    mean_abs=None,
    update=None,
    weight=None,
    status=None,
    steps=None,
    thresholds=None,
):
    """A Run built from a ``(steps, layers)`` gradient-norm array; the other metrics follow from it
    (mean |g| = norm / sqrt(numel), max |g| = 3 x mean |g|) unless given."""
    g = np.asarray(g, np.float64)
    if g.ndim == 1:
        g = g[:, None]
    T, L = g.shape
    names = names or [f"l{i}.weight" for i in range(L)]
    numel = np.broadcast_to(np.asarray(numel), (L,))
    status = status or ["trainable"] * L
    run = Run(
        [
            LayerInfo(n, module=n.rsplit(".", 1)[0], module_type="Linear", shape=(int(k),), numel=int(k), status=st)
            for n, k, st in zip(names, numel, status)
        ],
        edges=edges,
        thresholds=thresholds,
    )
    ma = g / np.sqrt(numel) if mean_abs is None else np.asarray(mean_abs, np.float64).reshape(T, L)
    cols = {
        "grad_norm": g,
        "mean_abs": ma,
        "max_abs": 3 * ma if max_abs is None else np.asarray(max_abs).reshape(T, L),
        "std": ma,
        "zero_frac": np.zeros((T, L)) if zero_frac is None else np.asarray(zero_frac).reshape(T, L),
        "nonfinite": np.zeros((T, L)) if nonfinite is None else np.asarray(nonfinite).reshape(T, L),
        "weight_norm": np.ones((T, L)) if weight is None else np.asarray(weight).reshape(T, L),
        "update_norm": np.full((T, L), np.nan) if update is None else np.asarray(update).reshape(T, L),
    }
    for i, state in enumerate(status):
        if state == "frozen":
            for m in ("grad_norm", "mean_abs", "max_abs", "std", "zero_frac", "nonfinite", "update_norm"):
                cols[m][:, i] = np.nan
    steps = np.arange(T) if steps is None else steps
    for r in range(T):
        v = np.stack([cols[m][r] for m in METRICS]).astype(np.float32)
        run.append(
            int(steps[r]),
            v,
            {"loss": None if loss is None else float(loss[r]), "global_norm": float(np.sqrt(np.nansum(g[r] ** 2)))},
        )
    return run


def test_moments_and_quantiles_match_numpy():
    rng = np.random.default_rng(0)
    x = rng.lognormal(0, 1, (501, 7))
    x[::5, 3] = np.nan
    st = stats.column_stats(x)
    for j in range(7):
        c = x[:, j][np.isfinite(x[:, j])]
        m, sd = c.mean(), c.std()
        assert st["mean"][j] == pytest.approx(m)
        assert st["std"][j] == pytest.approx(sd) and st["variance"][j] == pytest.approx(sd**2)
        assert st["median"][j] == pytest.approx(np.median(c))
        assert st["p5"][j] == pytest.approx(np.percentile(c, 5))
        assert st["p95"][j] == pytest.approx(np.percentile(c, 95))
        assert st["skewness"][j] == pytest.approx(np.mean(((c - m) / sd) ** 3))
        assert st["kurtosis"][j] == pytest.approx(np.mean(((c - m) / sd) ** 4) - 3)
        assert st["samples"][j] == c.size


def test_constant_series_has_no_shape_and_all_nan_has_no_samples():
    x = np.column_stack([np.full(50, 0.1), np.full(50, np.nan)])
    st = stats.column_stats(x)
    assert st["std"][0] == 0 and st["skewness"][0] == 0 and st["kurtosis"][0] == 0
    assert st["median"][0] == pytest.approx(0.1) and st["samples"][0] == 50
    assert st["samples"][1] == 0 and np.isnan(st["mean"][1]) and np.isnan(st["median"][1])


def test_layer_statistics_cover_every_metric_and_skip_unmeasured_steps():
    g = np.linspace(1, 2, 40)[:, None] * np.array([1.0, 10.0])
    upd = np.full((40, 2), np.nan)
    upd[::10] = 0.5
    run = synth(g, update=upd)
    df = stats.layer_statistics(run)
    assert set(df["metric"]) == set(METRICS) and len(df) == len(METRICS) * 2
    row = df[(df.metric == "grad_norm") & (df.layer == "l1.weight")].iloc[0]
    assert row["mean"] == pytest.approx(15.0, rel=1e-6) and row["samples"] == 40
    u = df[(df.metric == "update_norm") & (df.layer == "l0.weight")].iloc[0]
    assert u["samples"] == 4 and u["mean"] == pytest.approx(0.5)


def test_exact_reductions_see_a_single_spike_in_a_long_run():
    """Distribution statistics are sampled on long runs; one exploding step must still be counted."""
    T = 3 * stats.MAX_ROWS + 17
    g = np.full((T, 2), 0.1)
    mx = np.full((T, 2), 0.3)
    mx[1234, 1] = 5e3
    nf = np.zeros((T, 2))
    nf[777, 0] = 3
    run = synth(g, max_abs=mx, nonfinite=nf)
    ex = stats.exact_reductions(run)
    assert ex["max_abs_max"][1] == pytest.approx(5e3) and ex["exploding_share"][1] == pytest.approx(1 / T)
    assert ex["nonfinite_total"][0] == 3 and ex["max_abs_max"][0] == np.inf
    assert ex["max_abs_finite"][0] == pytest.approx(0.3)
    s = stats.Series(run)
    assert s.coarse.shape[0] <= stats.MAX_ROWS and s.block == -(-T // stats.MAX_ROWS)
    np.testing.assert_allclose(s.coarse, -1.0, atol=1e-6)


def _reference_reductions(run, k):
    """exact_reductions written the straightforward way: whole columns, float64, no chunks."""
    t, n = run.thresholds, run.n_steps
    mx, nf = run.metric("max_abs").astype(np.float64), run.metric("nonfinite").astype(np.float64)
    g, zf, ma = (run.metric(m).astype(np.float64) for m in ("grad_norm", "zero_frac", "mean_abs"))
    with np.errstate(invalid="ignore"):
        finite_max = np.array([np.max(c[np.isfinite(c)], initial=-np.inf) for c in mx.T])
        finite_max = np.where(finite_max > -np.inf, finite_max, np.nan)
        nfb = nf > 0
        tr = run.trainable_mask()
        m = (n // k) * k
        gb = g[n - m :].reshape(-1, k, g.shape[1])
        coarse = np.array([[np.mean(c[np.isfinite(c)]) if np.isfinite(c).any() else np.nan for c in b.T] for b in gb])
        return {
            "max_abs_max": np.where(nfb.any(0), np.inf, finite_max),
            "max_abs_finite": finite_max,
            "nonfinite_total": np.where(nfb, nf, 0).sum(0),
            "nonfinite_share": nfb.sum(0) / n,
            "vanishing_share": (ma < t.vanishing).sum(0) / n * tr,
            "exploding_share": ((mx > t.exploding) | nfb).sum(0) / n,
            "dead_share": ((zf >= t.dead_zero_fraction) | (g == 0)).sum(0) / n * tr,
            "known_steps": (np.isfinite(g) | nfb).sum(0),
            "coarse_grad_norm": coarse.reshape(-1, g.shape[1]),
        }


@pytest.mark.parametrize("chunk,threads", [(None, 2), (None, 1), (5, 2), (1, 1), (10_000, 1)])
def test_exact_reductions_equal_a_straightforward_reference(chunk, threads):
    """Chunked, threaded, in the stored dtype: the same numbers as whole-column reductions, whatever the
    chunk size (NaN steps, non-finite steps, dead and exploding entries included)."""
    rng = np.random.default_rng(3)
    T, L, k = 203, 6, 4
    g = np.exp(rng.normal(-3, 3, (T, L)))
    g[rng.random((T, L)) < 0.05] = np.nan
    g[rng.random((T, L)) < 0.05] = 0
    mx = g * 3
    mx[rng.random((T, L)) < 0.03] = 1e5
    nf = np.where(rng.random((T, L)) < 0.02, 7.0, 0.0)
    mx[nf > 0] = np.inf
    zf = rng.random((T, L))
    run = synth(g, max_abs=mx, nonfinite=nf, zero_frac=zf, status=["trainable"] * 5 + ["frozen"])
    got = stats.exact_reductions(run, chunk=chunk, block=k, threads=threads)
    want = _reference_reductions(run, k)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, err_msg=key)
        if key != "coarse_grad_norm":  # counts and extremes: exactly
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_coarse_series_is_the_block_mean_aligned_to_the_end():
    T, k = 10, 3
    g = np.arange(1, T + 1, dtype=float)[:, None]
    run = synth(g)
    ex = stats.exact_reductions(run, chunk=3, block=k)
    # blocks aligned to the last step: [2,3,4], [5,6,7], [8,9,10] (values 1-based)
    np.testing.assert_allclose(ex["coarse_grad_norm"][:, 0], [3, 6, 9])
    b, kk = stats.block_mean(g, 4)
    assert kk == 3 and np.allclose(b[:, 0], [3, 6, 9])


def test_slope_runs_and_trailing():
    y = np.column_stack([3 + 0.5 * np.arange(20), np.full(20, 2.0)])
    sl, r2 = stats.lstsq_slope(y)
    assert sl[0] == pytest.approx(0.5) and r2[0] == pytest.approx(1.0) and sl[1] == pytest.approx(0)
    assert stats.runs_of_true([0, 1, 1, 0, 1]) == [(1, 3), (4, 5)]
    assert list(stats.trailing_true(np.array([[1, 0], [1, 1], [1, 1]], bool))) == [3, 2]
    assert stats.nanmedian(np.array([1.0, np.nan, 3.0, np.inf])) == pytest.approx(2.0)


from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(arrays(np.float64, (23, 3), elements=st.one_of(st.floats(-1e6, 1e6), st.just(np.nan))))
def test_quantiles_agree_with_numpy_nanpercentile(x):
    q = stats.quantiles(x)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = np.nanpercentile(x, [5, 50, 95], axis=0)
    np.testing.assert_allclose(q, ref, rtol=1e-9, atol=1e-9, equal_nan=True)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(1e-6, 1e6))
def test_flow_characteristics_are_scale_free(seed, scale):
    from gradwidget.analysis.flow import flow_characteristics

    g = np.exp(np.random.default_rng(seed).standard_normal((40, 2)))
    a = flow_characteristics(stats.Series(synth(g)))
    b = flow_characteristics(stats.Series(synth(g * scale)))
    for c in (
        "consistency",
        "smoothness",
        "oscillation",
        "stability",
        "bottleneck_score",
        "flow_rate",
        "trend_slope",
        "direction_stability",
    ):
        np.testing.assert_allclose(a[c], b[c], rtol=2e-4, atol=1e-6, err_msg=c)
    assert list(a.trend) == list(b.trend) and list(a.direction) == list(b.direction)
