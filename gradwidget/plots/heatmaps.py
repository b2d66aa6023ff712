"""Layers x steps heatmaps (one run's flow, a comparison's difference map) and the per-layer bars
at one step, all on the one colour scale."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from .._look import DIFF_NODATA
from ..run import Run
from .common import (
    CMAP_NAME,
    EXPLODING_COLOR,
    FIGURE_MAX_STEPS,
    NONFINITE_COLOR,
    depth_axis,
    empty_axes,
    empty_note,
    layer_ticks,
    layers_axes,
    new_ax,
    metric_label,
)
from .._scale import color_scale, diff_limit, shared_scale
from .scale import cell_colors, mark_legend


def flow_heatmap(
    run: Run,
    metric: str = "grad_norm",
    step: int | None = None,
    ax=None,
    max_columns: int = FIGURE_MAX_STEPS,
    colorbar: bool = True,
    legend: bool = True,
    scale: tuple[float, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Layers x steps heatmap of a metric: where along the depth gradients fade or blow up, and when.

    Why: it is the panel's main view; one log scale across steps shows a network-wide fade that a
    per-step scale hides. ``step`` draws a cursor at that step (the panel's scrubber position).
    """
    run, fig, ax = layers_axes(run, metric, ax, 9)
    if empty_note(run):
        return fig
    scale = color_scale(run, metric) if scale is None else scale  # a comparison shares one scale
    run = run.with_history()  # the steps the live panel shows
    r = run.downsample(max_columns) if run.n_steps > max_columns else run
    rgba = cell_colors(r, metric, scale)  # (steps, layers, 4)
    steps = r.steps
    x0 = float(steps[0])
    x1 = float(run.steps[-1]) + (float(steps[-1] - steps[-2]) if len(steps) > 1 else 1.0)
    ax.imshow(
        rgba.transpose(1, 0, 2),
        aspect="auto",
        interpolation="nearest",
        origin="upper",
        extent=(x0 - 0.5, x1 - 0.5, r.n_layers - 0.5, -0.5),
    )  # row 0 (input side) at the top
    layer_ticks(ax, r.layer_names, "y")
    ax.set_xlabel("step")
    ax.set_title(title or f"Gradient flow: {metric_label(metric)} (log10, one scale across steps)", fontsize=10)
    if step is not None:
        ax.axvline(float(step), color="white", lw=2.2)
        ax.axvline(float(step), color="black", lw=1.0)
    values = run.metric(metric)
    if colorbar and not (np.isfinite(values) & (values > 0)).any():
        # all NaN/Inf/zero: any colour range would be made up, so none is drawn
        ax.text(
            1.01,
            0.5,
            "no finite value:\nno colour scale",
            transform=ax.transAxes,
            rotation=90,
            ha="left",
            va="center",
            fontsize=7,
            color="0.4",
        )
    elif colorbar:
        from matplotlib.cm import ScalarMappable

        sm = ScalarMappable(Normalize(*scale), colormaps[CMAP_NAME])
        cb = fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.04)
        cb.set_label(f"log10 {metric_label(metric)}", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    if legend:
        mark_legend(ax, run)
    return fig


#: the difference map's colour map: diverging, centred on no change, colour-blind safe (blue: the
#: later run's gradient is smaller, red: larger).
DIFF_CMAP = "RdBu_r"


def comparison_figure(cmp, metric: str = "grad_norm", label: str | None = None) -> Figure:
    """The comparison panel's static image: the first run's and a later run's heatmaps on one colour
    scale, then the difference map (log10 ratio of ``metric`` where it has one, else grad_norm)."""
    from ..comparison import RATIO_METRICS

    label = cmp.labels[1] if label is None else label
    runs = [cmp.runs[0], cmp.runs[cmp.labels.index(label)]]
    scale = shared_scale(runs, metric)
    n = max(r.n_layers for r in runs)
    fig = Figure(figsize=(9, 3 * (0.8 + 0.16 * min(max(n, 4), 40))), layout="constrained")
    axes = fig.subplots(3, 1)
    for ax, lab, r in zip(axes, (cmp.labels[0], label), runs):
        flow_heatmap(r, metric, ax=ax, scale=scale, legend=False, title=f"{lab}: {metric_label(metric)} (one scale)")
    dm = metric if metric in RATIO_METRICS else "grad_norm"
    difference_heatmap(
        cmp.log_ratio(dm, label), f"{label} vs {cmp.labels[0]}: log10 ratio of {metric_label(dm)}", ax=axes[2]
    )
    return fig


def difference_heatmap(ratio, title: str = "", ax=None, max_decades: float | None = None) -> Figure:
    """Layers x steps map of log10(later / first) from ``Comparison.log_ratio``: a diverging colour
    scale centred on 0 (white: no change), symmetric, clipped at the 99th percentile of |change|
    (or ``max_decades``); grey where either run has no value."""
    fig, ax = new_ax(ax, (9, 0.6 + 0.22 * max(ratio.shape[1], 4)))
    if ratio.empty or not np.isfinite(ratio.to_numpy()).any():
        empty_axes(ax, "no common steps with a value in both runs")
        return fig
    v = ratio.to_numpy(np.float64)
    lim = max_decades or diff_limit(v)

    cmap = colormaps[DIFF_CMAP].with_extremes(bad=DIFF_NODATA)
    steps = ratio.index.to_numpy()
    x1 = float(steps[-1]) + (float(steps[-1] - steps[-2]) if len(steps) > 1 else 1.0)
    im = ax.imshow(
        np.ma.masked_invalid(v.T),
        aspect="auto",
        interpolation="nearest",
        origin="upper",
        cmap=cmap,
        vmin=-lim,
        vmax=lim,
        extent=(float(steps[0]) - 0.5, x1 - 0.5, v.shape[1] - 0.5, -0.5),
    )
    layer_ticks(ax, list(ratio.columns), "y")
    ax.set_xlabel("step")
    ax.set_title(title or "log10 ratio of the gradient (later / first)", fontsize=10)
    cb = fig.colorbar(im, ax=ax, pad=0.01, fraction=0.04)
    cb.set_label("log10 ratio", fontsize=8)
    cb.ax.tick_params(labelsize=7)
    return fig


def layer_bars(run: Run, step: int | None = None, metric: str = "grad_norm", ax=None) -> Figure:
    """Per-layer bars of a metric at one step, coloured like the heatmap, with threshold lines.

    Why: the heatmap shows the pattern; the bars give the actual values at the scrubbed step and
    how far each layer sits from the vanishing / exploding thresholds.
    """
    run, fig, ax = layers_axes(run, metric, ax, 5)
    if empty_note(run):
        return fig
    i = run.n_steps - 1 if step is None else run.step_position(step)
    colors = cell_colors(run, metric)[i]
    vals = run.metric(metric)[i].astype(np.float64)
    floor = 10.0 ** (color_scale(run, metric)[0] - 1)
    shown = np.where(np.isfinite(vals) & (vals > 0), vals, np.nan)
    y = np.arange(run.n_layers)
    ax.barh(y, np.nan_to_num(shown, nan=0.0) - floor, left=floor, color=colors, edgecolor="0.4", linewidth=0.3)
    ax.set_xscale("log")
    depth_axis(ax, run.n_layers)  # as in the heatmap
    layer_ticks(ax, run.layer_names, "y")
    for j in np.flatnonzero(~np.isfinite(vals) & ~np.isnan(vals)):
        ax.text(floor, j, " inf", va="center", fontsize=7, color=NONFINITE_COLOR)
    t = run.thresholds
    if metric == "mean_abs":
        ax.axvline(t.vanishing, color="0.45", ls="--", lw=0.8, label=f"vanishing {t.vanishing:g}")
    if metric == "max_abs":
        ax.axvline(t.exploding, color=EXPLODING_COLOR, ls="--", lw=0.8, label=f"exploding {t.exploding:g}")
    lo, hi = ax.get_xlim()
    ax.set_xlim(max(lo, floor), max(hi, 10 * floor))  # no finite bar (all NaN/Inf): keep a decade
    ax.set_xlabel(metric_label(metric))
    ax.set_title(f"{metric_label(metric)} at step {int(run.steps[i])}", fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="lower right")
    return fig
