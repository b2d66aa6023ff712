"""The matplotlib figures: the colour scale and marks, and that each view draws the run's numbers."""

import numpy as np
import pytest
from matplotlib import colormaps
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure

from gradwidget import plots
from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.run import METRICS, LayerInfo, Run

LAYERS = ("embed", "vanish", "mid", "hot", "broken")


def pathological_run(n_steps=30, histogram_every=5, seed=0):
    """Five layers: a healthy one, a vanishing one (|g| ~ 1e-9), a healthy one whose scale grows
    100x over training, one that explodes (|g| ~ 1e4) from step 20, one with NaN at step 12."""
    rng = np.random.default_rng(seed)
    rec = ArrayRecorder(histogram_every=histogram_every)
    for s in range(n_steps):
        g = {
            "embed": rng.normal(0, 1e-2, 64),
            "vanish": rng.normal(0, 1e-9, 64),
            "mid": rng.normal(0, 1e-3 * (1 + 99 * s / n_steps), 64),
            "hot": rng.normal(0, 1e4 if s >= 20 else 1e-1, 64),
            "broken": rng.normal(0, 1e-2, 64),
        }
        if s == 12:
            g["broken"][3] = np.nan
        w = {k: rng.normal(0, 1, 64) for k in g}
        if s > 12:  # an update with the NaN gradient leaves the weights NaN
            w["broken"][:] = np.nan
        rec.record(s, g, weights=w, loss=1.0 / (s + 1))
    return rec.run


@pytest.fixture(scope="module")
def run():
    return pathological_run()


def test_marks_take_precedence_over_the_scale(run):
    rgba = plots.cell_colors(run)
    j = {n: i for i, n in enumerate(run.layer_names)}
    assert np.allclose(rgba[:, j["vanish"]], to_rgba(plots.VANISHING_COLOR))
    assert np.allclose(rgba[20:, j["hot"]], to_rgba(plots.EXPLODING_COLOR))
    assert not np.allclose(rgba[:20, j["hot"]], to_rgba(plots.EXPLODING_COLOR))
    assert np.allclose(rgba[12, j["broken"]], to_rgba(plots.NONFINITE_COLOR))  # NaN beats exploding
    assert not np.allclose(rgba[11, j["broken"]], to_rgba(plots.NONFINITE_COLOR))
    # every other cell is a viridis colour of log10(grad_norm) on the run-wide scale
    lo, hi = plots.color_scale(run)
    g = run.metric("grad_norm")[:, j["embed"]]
    expect = colormaps["viridis"](Normalize(lo, hi, clip=True)(np.log10(g)))
    np.testing.assert_allclose(rgba[:, j["embed"]], expect)


def test_color_range_is_robust_percentiles_of_log10_over_finite_nonzero_cells(run):
    """The one colour-scale definition (the live panel's kernel sends the same range)."""
    v = np.array([[0.0, np.nan], [np.inf, -np.inf]] + [[10.0**k, 10.0 ** (k / 2)] for k in range(-8, 9)])
    lv = np.log10(v[np.isfinite(v) & (v > 0)])
    assert plots.color_range(v) == pytest.approx(tuple(np.percentile(lv, [1, 99])))
    assert plots.color_range(np.array([np.nan, 0.0])) == (0.0, 1.0)
    for m in ("grad_norm", "mean_abs", "max_abs"):
        assert plots.color_scale(run, m) == plots.color_range(run.metric(m))
    # a very large array is read at a stride: the same range to within half a percent of its width
    big = 10.0 ** np.random.default_rng(1).normal(-3, 2, 6_000_000)
    exact = np.percentile(np.log10(big), [1, 99])
    assert np.allclose(plots.color_range(big), exact, atol=0.005 * (exact[1] - exact[0]))
    # the heatmap's colour bar is that range
    fig = plots.flow_heatmap(run, "grad_norm")
    norms = [im.norm for ax in fig.axes for im in ax.collections + ax.images if hasattr(im, "norm")]
    assert any((n.vmin, n.vmax) == pytest.approx(plots.color_scale(run)) for n in norms)


def test_one_scale_across_steps_not_per_step_max(run):
    """The original crate normalised each step by its own max, which hides a network-wide fade: the same
    value must get the same colour at every step, whatever else happens at that step."""
    r = Run(["a", "b"])
    for s, b in enumerate([1.0, 1e3, 1e-3]):  # column b changes a lot, column a stays at 1e-2
        v = np.full((len(METRICS), 2), np.nan, np.float32)
        v[METRICS.index("grad_norm")] = [1e-2, b]
        v[METRICS.index("mean_abs")] = [1e-3, b / 10]
        v[METRICS.index("max_abs")] = [1e-2, min(b, 10)]
        v[METRICS.index("nonfinite")] = 0
        r.append(s, v)
    rgba = plots.cell_colors(r)
    assert np.allclose(rgba[0, 0], rgba[1, 0]) and np.allclose(rgba[1, 0], rgba[2, 0])
    # and the scale is ordered: the largest value is the brightest (viridis yellow end)
    assert rgba[1, 1, 1] > rgba[0, 1, 1] > rgba[2, 1, 1]


def test_frozen_layers_show_as_no_data():
    r = Run([LayerInfo("w", status="trainable"), LayerInfo("frozen", status="frozen")])
    for s in range(3):
        v = np.full((len(METRICS), 2), np.nan, np.float32)
        v[:, 0] = 1e-2
        v[METRICS.index("nonfinite"), 0] = 0
        r.append(s, v)
    rgba = plots.cell_colors(r)
    assert np.allclose(rgba[:, 1], to_rgba(plots.NODATA_COLOR))
    assert not np.allclose(rgba[:, 0], to_rgba(plots.NODATA_COLOR))


def test_flow_heatmap_draws_the_cells_with_layers_in_depth_order(run):
    fig = plots.flow_heatmap(run, step=17)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    img = ax.images[0].get_array()
    assert img.shape == (run.n_layers, run.n_steps, 4)  # rows are layers, columns steps
    np.testing.assert_allclose(img, plots.cell_colors(run).transpose(1, 0, 2))
    assert [t.get_text() for t in ax.get_yticklabels()] == list(LAYERS)
    lo, hi = ax.get_ylim()
    assert lo > hi and ax.get_yticks()[0] == 0, "input side at the top, loss side at the bottom (one orientation)"
    cursor = [ln for ln in ax.lines if list(ln.get_xdata()) == [17.0, 17.0]]
    assert cursor, "the step cursor is drawn"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("vanishing" in x for x in labels) and any("exploding" in x for x in labels)
    assert len(fig.axes) == 2  # heatmap and colour bar


def test_flow_heatmap_downsamples_long_runs_keeping_spikes():
    rec = ArrayRecorder(histogram_every=0)
    for s in range(1000):
        rec.record(s, {"a": np.full(4, 1e4 if s == 501 else 1e-2), "b": np.full(4, 1e-3)})
    fig = plots.flow_heatmap(rec.run, max_columns=100)
    img = fig.axes[0].images[0].get_array()
    assert img.shape[1] == 100
    red = np.all(np.isclose(img[0], to_rgba(plots.EXPLODING_COLOR)), axis=-1)
    assert red.sum() == 1, "a one-step explosion survives downsampling (max |g| keeps its max)"


def test_layer_bars_show_the_values_at_the_step(run):
    fig = plots.layer_bars(run, step=25, metric="max_abs")
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == run.n_layers
    i = run.step_position(25)
    vals = run.metric("max_abs")[i]
    for b, v in zip(bars, vals):
        if np.isfinite(v):
            assert b.get_x() + b.get_width() == pytest.approx(float(v), rel=1e-5)
    assert "step 25" in ax.get_title()
    assert any(ln.get_label().startswith("exploding") for ln in ax.lines)


def test_histogram_plot_draws_the_recorded_counts(run):
    fig = plots.histogram_plot(run, "vanish", step=14)
    ax = fig.axes[0]
    hstep, counts = run.histogram_at("vanish", 14)
    assert hstep == 15 and f"step {hstep}" in ax.get_title()
    stairs = ax.patches[0]
    np.testing.assert_array_equal(stairs.get_data().values, counts)
    # the vanishing layer's mass sits left of the vanishing threshold line
    centre = (run.hist_edges[:-1] + run.hist_edges[1:]) / 2
    assert (counts * centre).sum() / counts.sum() < np.log10(run.thresholds.vanishing)


def test_histogram_plot_without_histograms_says_so():
    rec = ArrayRecorder(histogram_every=0)
    rec.record(0, {"a": np.ones(3)})
    ax = plots.histogram_plot(rec.run, "a").axes[0]
    assert any("no histogram" in t.get_text() for t in ax.texts)


def test_metric_series_and_thresholds(run):
    fig = plots.metric_series(run, ["vanish", "mid"], "mean_abs")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines}
    np.testing.assert_allclose(lines["mid"].get_ydata(), run.metric("mean_abs")[:, 2])
    assert ax.get_yscale() == "log"
    assert any(k.startswith("vanishing") for k in lines)
    fig = plots.metric_series(run, "hot", "max_abs")
    assert any(ln.get_label().startswith("exploding") for ln in fig.axes[0].lines)


def test_weight_plot_uses_update_ratio_when_recorded(run):
    ax = plots.weight_plot(run, layers=["embed"]).axes[0]
    assert "update / weight" in ax.get_ylabel()
    line = [ln for ln in ax.lines if ln.get_label() == "embed"][0]
    w, u = run.metric("weight_norm")[:, 0], run.metric("update_norm")[:, 0]
    ok = np.isfinite(u)
    np.testing.assert_allclose(line.get_ydata(), (u / w)[ok], rtol=1e-5)


def test_health_table_figure_colours_and_spells_health():
    import pandas as pd

    class R:
        layers = pd.DataFrame(
            {
                "layer": ["a.weight", "b.weight"],
                "module_type": ["Linear", "Linear"],
                "health": ["Healthy", "Critical"],
                "grad_norm_median": [0.1, 1e-9],
                "flags": [[], ["vanishing"]],
            }
        )

    fig = plots.health_table_figure(R())
    table = fig.axes[0].tables[0]
    cells = table.get_celld()
    texts = {(r, c): cell.get_text().get_text() for (r, c), cell in cells.items()}
    assert texts[(1, 0)] == "a.weight" and texts[(2, 2)] == "Critical" and texts[(2, 4)] == "vanishing"
    assert texts[(2, 3)] == "1.00e-09"
    assert np.allclose(cells[(2, 2)].get_facecolor(), to_rgba(plots.HEALTH_COLORS["Critical"]))
    with pytest.raises(TypeError, match="analysis Report"):
        plots.health_table_figure(object())


def test_panel_figure_is_the_panels_view(run):
    fig = plots.panel_figure(run, step=22)
    titles = [ax.get_title() for ax in fig.axes]
    assert any("Gradient flow" in t for t in titles)
    assert any("at step 22" in t for t in titles)
    # default focus: the most-flagged layer (non-finite first)
    assert "layer broken" in fig._suptitle.get_text()
    fig = plots.panel_figure(run, step=3, layer="mid", metric="mean_abs")
    assert "layer mid" in fig._suptitle.get_text() and "step 3" in fig._suptitle.get_text()
    png = plots.figure_to_png(fig, dpi=40)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_panel_figure_of_an_empty_run_and_bad_arguments():
    fig = plots.panel_figure(Run(["a", "b"]))
    assert any("no steps recorded yet" in t.get_text() for ax in fig.axes for t in ax.texts)
    with pytest.raises(KeyError, match="unknown metric"):
        plots.panel_figure(pathological_run(3), metric="gradnorm")
    with pytest.raises(TypeError, match="gradwidget Run"):
        plots.flow_heatmap([1, 2, 3])


def test_figures_draw_into_a_given_axes(run):
    fig = Figure()
    ax1, ax2 = fig.subplots(1, 2)
    assert plots.histogram_plot(run, "mid", ax=ax1) is fig
    assert plots.metric_series(run, "mid", ax=ax2) is fig
    assert len(fig.axes) == 2


def test_histogram_over_time_shares_per_column(run):
    ax = plots.histogram_over_time(run, "vanish", step=10).axes[0]
    mesh = ax.collections[0]
    share = np.ma.filled(mesh.get_array(), 0).reshape(len(run.hist_edges) - 1, len(run.hist_steps))
    np.testing.assert_allclose(share.sum(axis=0), 1.0, rtol=1e-6)  # each column is one histogram
    counts = run.hist[:, 1, :].T
    np.testing.assert_allclose(share, counts / counts.sum(axis=0), rtol=1e-6)
    assert {"vanishing 1e-07", "exploding 1000"} <= {ln.get_label() for ln in ax.lines}


def test_bars_of_a_step_with_no_finite_value_draw_without_warnings():
    import warnings

    rec = ArrayRecorder(histogram_every=0)
    for s in range(3):
        rec.record(s, {"a": np.full(4, np.nan), "b": np.full(4, np.inf)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plots.layer_bars(rec.run)
    lo, hi = fig.axes[0].get_xlim()
    assert hi > lo


def layerless_run(n_steps=5) -> Run:
    """A run with steps but no layer (a model whose parameters were all filtered out)."""
    run = Run([])
    for s in range(n_steps):
        run.append(s, np.zeros((len(METRICS), 0), np.float32), {"loss": 1.0})
    return run


@pytest.mark.parametrize(
    "draw", [plots.flow_heatmap, plots.layer_bars, plots.metric_series, plots.weight_plot, plots.panel_figure]
)
def test_a_run_without_layers_draws_an_empty_run_note(draw):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = draw(layerless_run())
    assert any("empty run: no layers recorded" in t.get_text() for ax in fig.axes for t in ax.texts)
    assert plots.default_layer(layerless_run()) == -1


def test_an_all_nan_heatmap_has_no_made_up_colour_bar():
    """No finite value: the 0..1 fallback range would label a colour bar "1 ... 10"; none is drawn."""
    rec = ArrayRecorder(histogram_every=0)
    for s in range(4):
        rec.record(s, {"a": np.full(4, np.nan), "b": np.full(4, np.nan)})
    fig = plots.flow_heatmap(rec.run, "mean_abs")
    assert len(fig.axes) == 1  # no colour bar axes
    assert any("no colour scale" in t.get_text() for t in fig.axes[0].texts)
    assert len(plots.flow_heatmap(pathological_run(5), "mean_abs").axes) == 2  # finite values: a bar


def test_weight_plot_without_a_finite_norm_says_so_without_warnings():
    import warnings

    run = Run(["a", "b"])
    for s in range(4):
        run.append(s, np.full((len(METRICS), 2), np.nan, np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warned "No artists with labels found"
        fig = plots.weight_plot(run)
    assert any("no finite weight norm" in t.get_text() for t in fig.axes[0].texts)


def test_ten_thousand_tensors_draw_as_bounded_rows_that_tell_the_truth():
    """Past MAX_DRAWN_ROWS layers a figure merges them by module (each group measured as one tensor,
    labelled with its size): the figure's height is capped, a NaN in one member still shows."""
    from gradwidget.collect.arrays import ArrayRecorder

    rec = ArrayRecorder()
    names = [f"blocks.{b}.lin{k}.{p}" for b in range(1250) for k in range(4) for p in ("weight", "bias")]
    rng = np.random.default_rng(0)
    for s in range(4):
        grads = {n: np.full(2, 0.1 * (1 + rng.random())) for n in names}
        if s == 3:
            grads["blocks.7.lin2.weight"] = np.array([np.nan, 1.0])
        rec.record(s, grads)
    run = rec.run
    assert run.n_layers == 10_000
    groups, labels = plots.layer_row_groups(run)
    assert len(groups) <= plots.MAX_DRAWN_ROWS and sum(map(len, groups)) == run.n_layers
    assert all(text.endswith("tensors)") for text in labels)
    merged = plots.drawn_rows(run)
    j = next(k for k, g in enumerate(groups) if run.layer_index("blocks.7.lin2.weight") in g)
    assert merged.metric("nonfinite")[3, j] >= 1  # one member's NaN shows in its row
    g0 = groups[0]
    np.testing.assert_allclose(
        merged.metric("grad_norm")[0, 0],
        np.sqrt(np.sum(run.metric("grad_norm")[0, g0].astype(np.float64) ** 2)),
        rtol=1e-5,
    )
    fig = plots.flow_heatmap(run)
    assert fig.get_size_inches()[1] < 0.6 + 0.22 * (plots.MAX_DRAWN_ROWS + 1)
    assert fig.axes[0].images[0].get_array().shape[0] == len(groups)
