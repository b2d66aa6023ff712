"""The gradient noise scale over steps (``analyze(run).noise_scale``): B_simple with its 95% interval
against the batch the optimizer steps with, on a log scale."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .common import empty_axes, new_ax


def noise_scale_plot(ns, ax=None) -> Figure:
    """B_simple (smoothed) and its 95% interval per measured step, and the batch per step.

    Why: below the noise scale a larger batch trains in proportionally fewer steps; far above it,
    most of each step's examples buy nothing. ``ns`` is a ``NoiseScale`` (or None: nothing measured).
    """
    fig, ax = new_ax(ax, (6, 2.6))
    if ns is None or not ns.rows or not np.isfinite(ns.b_simple).any():
        empty_axes(ax, "gradient noise scale: not measured (needs the gradient at two batch sizes)")
        return fig
    x, b = ns.steps, ns.b_simple
    ok = np.isfinite(b) & (b > 0)
    top = max(float(np.nanmax(b[ok])) * 4, ns.b_big * 2)
    hi = np.where(np.isfinite(ns.hi), ns.hi, top)
    ax.fill_between(x, np.maximum(ns.lo, 1e-3), hi, color="#31688e", alpha=0.18, lw=0, label="95% interval")
    ax.plot(x[ok], b[ok], color="#31688e", lw=1.3, label=f"B_simple (time constant {ns.tau:,.0f} steps)")
    ax.axhline(ns.b_big, color="#d84315", ls="--", lw=1.0, label=f"batch per step ({ns.b_big:,.0f})")
    ax.set_yscale("log")
    lo = min(float(np.nanmin(b[ok])), ns.b_big) / 4
    ax.set_ylim(max(lo, 1e-3), top)
    ax.set_xlabel("step")
    ax.set_ylabel("examples")
    ax.set_title("gradient noise scale (critical batch size) vs. the batch", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return fig
