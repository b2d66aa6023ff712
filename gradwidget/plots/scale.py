"""THE colour scale (log10, one range over every step and layer, shared with the live panel) and
the cell colours it gives, marks included."""

from __future__ import annotations


import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize, to_rgba
from matplotlib.patches import Patch
from matplotlib.transforms import offset_copy

from .._scale import color_scale
from ..run import Run
from .common import CMAP_NAME, EXPLODING_COLOR, NODATA_COLOR, NONFINITE_COLOR, VANISHING_COLOR, check_metric


def cell_colors(run: Run, metric: str = "grad_norm", scale: tuple[float, float] | None = None) -> np.ndarray:
    """RGBA ``(steps, layers, 4)``: viridis on log10(metric) over ``scale``, then the marks."""
    check_metric(metric)
    lo, hi = scale if scale is not None else color_scale(run, metric)
    vals = run.metric(metric).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = np.log10(vals)
    rgba = colormaps[CMAP_NAME](Normalize(lo, hi, clip=True)(np.where(np.isfinite(lv), lv, lo)))
    rgba = np.asarray(rgba, dtype=np.float64)
    nodata = np.isnan(vals)
    rgba[nodata] = to_rgba(NODATA_COLOR)
    rgba[run.vanishing() & ~nodata] = to_rgba(VANISHING_COLOR)
    rgba[run.exploding()] = to_rgba(EXPLODING_COLOR)
    rgba[run.nonfinite()] = to_rgba(NONFINITE_COLOR)
    return rgba


def mark_legend(ax, run: Run) -> None:
    t = run.thresholds
    handles = [
        Patch(facecolor=VANISHING_COLOR, edgecolor="0.5", label=f"vanishing (mean|g| < {t.vanishing:g})"),
        Patch(facecolor=EXPLODING_COLOR, edgecolor="0.5", label=f"exploding (max|g| > {t.exploding:g})"),
        Patch(facecolor=NONFINITE_COLOR, edgecolor="0.5", label="NaN / Inf"),
        Patch(facecolor=NODATA_COLOR, edgecolor="0.5", label="no gradient"),
    ]
    # a fixed distance below the axes (under the tick labels and the x label), whatever its height
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-30, units="points")
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(0, 0),
        bbox_transform=below,
        ncol=4,
        fontsize=7,
        frameon=False,
        handlelength=1.2,
        columnspacing=1.0,
    )
