"""The panel's static rendition: one figure with the heatmap, bars, histogram, series and loss, and
the layer it focuses on when none is chosen."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..run import Run
from .common import check_metric, check_run, empty_note, literal, metric_label, short_name
from .distributions import histogram_plot
from .heatmaps import flow_heatmap, layer_bars
from .rows import layer_row_groups
from .series import loss_plot, metric_series


def default_layer(run: Run) -> int:
    """The layer a view focuses on when none is chosen: the one flagged most often (non-finite,
    exploding, vanishing, in that order of weight; a parameter the loss cannot move is never flagged
    vanishing, ``Run.cannot_move``), else the first layer the loss can move; -1 (none) when the
    run has no layers."""
    if run.n_layers == 0:
        return -1
    if run.n_steps == 0:
        return 0
    score = 1e6 * run.nonfinite().sum(axis=0) + 1e3 * run.exploding().sum(axis=0) + run.vanishing().sum(axis=0)
    if score.max() > 0:
        return int(np.argmax(score))
    movable = np.flatnonzero(~run.cannot_move())
    return int(movable[0]) if movable.size else 0


def panel_figure(run, step: int | None = None, layer: int | str | None = None, metric: str = "grad_norm") -> Figure:
    """One figure with what the live panel shows: heatmap with the step cursor, per-layer bars at
    the step, and the selected layer's histogram and metric over time.

    Why: it is the static rendition a GradientPanel carries in its output, so exported notebooks,
    GitHub and CI logs show the panel's current view where no widget runs.
    """
    run = check_run(run)
    check_metric(metric)
    L = max(run.n_layers, 4)
    h_top = 0.9 + 0.2 * min(L, 48)
    fig = Figure(figsize=(12, h_top + 3.0), layout="constrained")
    gs = fig.add_gridspec(2, 3, height_ratios=[h_top, 3.0], width_ratios=[1.0, 1.0, 1.0])
    ax_heat = fig.add_subplot(gs[0, :2])
    ax_bars = fig.add_subplot(gs[0, 2])
    ax_hist = fig.add_subplot(gs[1, 0])
    ax_series = fig.add_subplot(gs[1, 1])
    ax_loss = fig.add_subplot(gs[1, 2])
    note = empty_note(run)
    if note:
        for ax in (ax_heat, ax_bars, ax_hist, ax_series, ax_loss):
            ax.set_axis_off()
        ax_heat.text(
            0.5,
            0.5,
            f"GradientPanel ({run.n_layers} layers, {run.n_steps} steps): {note}",
            ha="center",
            va="center",
            transform=ax_heat.transAxes,
        )
        return fig
    s = int(run.steps[-1]) if step is None else int(run.steps[run.step_position(step)])
    j = default_layer(run) if layer is None else run.layer_index(layer)
    flow_heatmap(run, metric, step=s, ax=ax_heat)
    layer_bars(run, s, metric, ax=ax_bars)
    ax_bars.set_yticklabels([])
    groups = layer_row_groups(run)
    row = j if groups is None else next(k for k, g in enumerate(groups[0]) if j in g)  # its merged row
    ax_bars.axhspan(row - 0.5, row + 0.5, color="#31688e", alpha=0.12, zorder=0)
    histogram_plot(run, j, s, ax=ax_hist)
    series_metric = "mean_abs" if metric == "grad_norm" else metric
    metric_series(run, [j], series_metric, ax=ax_series, step=s)
    ax_series.set_title(f"{short_name(run.layer_names[j], 30)}\n{metric_label(series_metric)}", fontsize=9)
    loss_plot(run, ax=ax_loss)
    ax_loss.axvline(s, color="black", lw=0.8)
    fig.suptitle(
        f"gradwidget · {run.n_layers} layers · steps {int(run.steps[0])}..{int(run.steps[-1])} "
        f"· step {s} · layer {literal(run.layer_names[j])}",
        fontsize=11,
    )
    return fig
