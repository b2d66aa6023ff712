"""Quantities over steps: a metric for a few layers, the loss and global norm, update/weight ratios."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from ..run import Run
from .common import EXPLODING_COLOR, check_metric, check_run, empty_axes, empty_note, new_ax, metric_label, short_name


def metric_series(
    run: Run,
    layers: Iterable[int | str] | int | str | None = None,
    metric: str = "mean_abs",
    ax=None,
    step: int | None = None,
) -> Figure:
    """A metric over steps for a few layers (log y), with the threshold that applies to it.

    Why: shows whether a problem is permanent, growing, or a transient spike, and when it began.
    """
    run = check_run(run)
    check_metric(metric)
    fig, ax = new_ax(ax, (6, 3))
    if layers is None:
        layers = range(run.n_layers)
    elif isinstance(layers, (int, np.integer, str)):
        layers = [layers]
    idx = [run.layer_index(x) for x in layers]
    note = empty_note(run)
    if note:
        empty_axes(ax, note)
        return fig
    cmap = colormaps["plasma"]
    vals = run.metric(metric)
    for k, j in enumerate(idx):
        c = cmap(0.1 + 0.75 * k / max(1, len(idx) - 1)) if len(idx) > 1 else "#31688e"
        ax.plot(run.steps, vals[:, j], lw=1.1, color=c, label=short_name(run.layer_names[j], 32))
    positive = vals[:, idx][np.isfinite(vals[:, idx]) & (vals[:, idx] > 0)]
    if positive.size:
        ax.set_yscale("log")
    t = run.thresholds
    if metric == "mean_abs":
        ax.axhline(t.vanishing, color="0.45", ls="--", lw=0.8, label=f"vanishing {t.vanishing:g}")
    if metric == "max_abs":
        ax.axhline(t.exploding, color=EXPLODING_COLOR, ls="--", lw=0.8, label=f"exploding {t.exploding:g}")
    if step is not None:
        ax.axvline(float(step), color="black", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel(metric_label(metric))
    ax.set_title(f"{metric_label(metric)} over steps", fontsize=10)
    if len(idx) <= 12:
        ax.legend(fontsize=7, ncol=1 + len(idx) // 7)
    return fig


def loss_plot(run: Run, ax=None) -> Figure:
    """Loss (and global gradient norm) over steps: the context every gradient pattern is read in."""
    run = check_run(run)
    fig, ax = new_ax(ax, (6, 2.6))
    loss = run.scalar("loss") if run.n_steps else np.zeros(0)
    if np.isfinite(loss).any():
        ax.plot(run.steps, loss, color="#31688e", lw=1.2, label="loss")
        ax.set_ylabel("loss")
    gn = run.scalar("global_norm") if run.n_steps else np.zeros(0)
    if np.isfinite(gn).any():
        ax2 = ax.twinx()
        ax2.plot(run.steps, gn, color="#b5de2b", lw=1.0, label="global grad norm")
        ax2.set_ylabel("global grad norm", fontsize=8)
        if (gn[np.isfinite(gn)] > 0).all():
            ax2.set_yscale("log")
    if not np.isfinite(loss).any() and not np.isfinite(gn).any():
        ax.text(0.5, 0.5, "no loss logged (recorder.log(loss=...))", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_title("loss and global gradient norm", fontsize=10)
    return fig


def weight_plot(run: Run, ax=None, layers: Sequence[int | str] | None = None) -> Figure:
    """Update/weight norm ratio per layer over steps (or weight norms when updates are not recorded).

    Why: the ratio says whether the learning rate suits each layer (about 1e-3 is typical): far
    below, the layer barely moves; far above, it is being rewritten every step.
    """
    run = check_run(run)
    fig, ax = new_ax(ax, (6, 3))
    note = empty_note(run)
    if note:
        empty_axes(ax, note)
        return fig
    w = run.metric("weight_norm").astype(np.float64)
    u = run.metric("update_norm").astype(np.float64)
    idx = list(range(run.n_layers)) if layers is None else [run.layer_index(x) for x in layers]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = u / w
    use_ratio = np.isfinite(ratio[:, idx]).any()
    data, label = (ratio, "update / weight norm") if use_ratio else (w, "weight L2 norm")
    cmap = colormaps["plasma"]
    for k, j in enumerate(idx):
        ok = np.isfinite(data[:, j])
        if ok.any():
            ax.plot(
                run.steps[ok],
                data[ok, j],
                lw=1.0,
                marker="." if ok.sum() < 30 else None,
                color=cmap(0.1 + 0.75 * k / max(1, len(idx) - 1)),
                label=short_name(run.layer_names[j], 32),
            )
    pos = data[:, idx][np.isfinite(data[:, idx]) & (data[:, idx] > 0)]
    if pos.size:
        ax.set_yscale("log")
    if use_ratio:
        t = run.thresholds
        ax.axhspan(
            t.update_ratio_low,
            t.update_ratio_high,
            color="#2e7d32",
            alpha=0.07,
            label=f"healthy band {t.update_ratio_low:g}..{t.update_ratio_high:g}",
        )
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.set_title(f"weights: {label} per layer", fontsize=10)
    if not ax.get_legend_handles_labels()[0]:  # no finite weight norm: say so, not an empty legend
        ax.text(0.5, 0.5, "no finite weight norm recorded", ha="center", va="center", transform=ax.transAxes)
    elif len(idx) <= 12:
        ax.legend(fontsize=6, ncol=2)
    return fig
