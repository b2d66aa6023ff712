"""One layer's gradient distribution: its log10|g| histogram at a step, and every histogram over
steps."""

from __future__ import annotations

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from ..run import Run
from .common import CMAP_NAME, EXPLODING_COLOR, check_run, empty_axes, new_ax, short_name


def histogram_plot(run: Run, layer: int | str, step: int | None = None, ax=None) -> Figure:
    """Histogram of log10|g| for one layer at (the histogram step nearest) ``step``.

    Why: a norm hides the shape; the histogram shows whether a layer's gradients are uniformly tiny
    (vanishing), have a few huge entries (exploding tail), or a spike of exact zeros (dead units).
    """
    run = check_run(run)
    fig, ax = new_ax(ax, (5, 3))
    j = run.layer_index(layer)
    name = run.layer_names[j]
    want = (int(run.steps[-1]) if run.n_steps else 0) if step is None else step
    got = run.histogram_at(j, want)
    if got is None:
        empty_axes(ax, "no histogram recorded", axis_off=False)
        ax.set_title(short_name(name, 40), fontsize=10)
        return fig
    hstep, counts = got
    edges = run.hist_edges
    ax.stairs(counts, edges, fill=True, color=colormaps[CMAP_NAME](0.35), alpha=0.85)
    t = run.thresholds
    ax.axvline(np.log10(t.vanishing), color="0.45", ls="--", lw=0.8, label=f"vanishing {t.vanishing:g}")
    ax.axvline(np.log10(t.exploding), color=EXPLODING_COLOR, ls="--", lw=0.8, label=f"exploding {t.exploding:g}")
    nz = np.flatnonzero(counts)
    if nz.size:
        lo = min(edges[nz[0]], np.log10(t.vanishing)) - 1
        hi = max(edges[nz[-1] + 1], np.log10(t.exploding)) + 1
        ax.set_xlim(lo, hi)
    i = run.step_position(hstep) if run.n_steps else 0
    zf = float(run.metric("zero_frac")[i, j]) if run.n_steps else float("nan")
    ax.set_xlabel("log10 |g|")
    ax.set_ylabel("entries")
    ax.set_title(f"{short_name(name, 30)} at step {hstep}" + (f"\nzeros: {zf:.0%}" if zf == zf else ""), fontsize=9)
    ax.legend(fontsize=7)
    return fig


def histogram_over_time(run: Run, layer: int | str, ax=None, step: int | None = None) -> Figure:
    """Every recorded histogram of one layer as a column (steps x log10|g|, colour = share of entries).

    Why: shows how a layer's whole distribution drifts, e.g. sliding below the vanishing threshold
    or growing an exploding tail, which a single histogram or a norm cannot show.
    """
    run = check_run(run)
    fig, ax = new_ax(ax, (6, 3))
    j = run.layer_index(layer)
    name = run.layer_names[j]
    if len(run.hist_steps) == 0:
        empty_axes(ax, "no histogram recorded", axis_off=False)
        ax.set_title(short_name(name, 40), fontsize=10)
        return fig
    counts = run.hist[:, j, :].astype(np.float64)  # (histogram steps, bins)
    tot = counts.sum(axis=1, keepdims=True)
    share = np.divide(counts, tot, out=np.zeros_like(counts), where=tot > 0)
    hs = run.hist_steps.astype(np.float64)
    x_edges = np.concatenate([hs, [hs[-1] + (hs[-1] - hs[-2] if len(hs) > 1 else 1.0)]])
    data = np.ma.masked_equal(share.T, 0.0)
    ax.pcolormesh(x_edges, run.hist_edges, data, cmap=colormaps[CMAP_NAME], shading="flat")
    t = run.thresholds
    ax.axhline(np.log10(t.vanishing), color="0.45", ls="--", lw=0.8, label=f"vanishing {t.vanishing:g}")
    ax.axhline(np.log10(t.exploding), color=EXPLODING_COLOR, ls="--", lw=0.8, label=f"exploding {t.exploding:g}")
    nz = np.flatnonzero(counts.sum(axis=0))
    if nz.size:
        ax.set_ylim(
            min(run.hist_edges[nz[0]], np.log10(t.vanishing)) - 1,
            max(run.hist_edges[nz[-1] + 1], np.log10(t.exploding)) + 1,
        )
    if step is not None:
        ax.axvline(float(step), color="black", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("log10 |g|")
    ax.set_title(f"{short_name(name, 30)}: distribution over steps", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return fig
