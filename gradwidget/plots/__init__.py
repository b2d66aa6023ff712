"""matplotlib figures of a Run: the static renditions of what the live panel shows.

They are what survives where no widget runs (exported HTML, GitHub, CI logs, the HTML report), so
they draw the same things the front end draws, the same way:

Colour scale (shared with the front end and ``outputs.to_ascii``)
    matplotlib's ``viridis`` (perceptually uniform, colour-blind safe) on **log10 of the metric**,
    with **one scale across all steps and layers**: the 1st..99th percentile of the finite positive
    values of the whole run, a rolling window's folded ``history`` included (``color_scale``; the
    live panel's kernel sends the front end the same range, and the heatmap shows the same steps). Values outside are clipped to the ends. A network-wide fade therefore stays visible,
    which a per-step normalisation would hide.
Marks (cell colours outside viridis, so they never read as a value)
    ``VANISHING_COLOR`` light grey: mean |g| below ``thresholds.vanishing``;
    ``EXPLODING_COLOR`` red: max |g| above ``thresholds.exploding``;
    ``NONFINITE_COLOR`` magenta: NaN/Inf entries (takes precedence over exploding);
    ``NODATA_COLOR`` white: no gradient (frozen or unused parameters, or no value recorded).

Layers are rows in the Run's depth order drawn top to bottom: the input side at the top and the loss
side at the bottom, as in the model's printout, the health tables, the ASCII view and the live panel
(one orientation everywhere; gradients flow up the picture from the loss), steps left to right.
Every function returns a ``matplotlib.figure.Figure`` (built without pyplot, so nothing leaks into
a notebook's figure manager) and takes an ``ax`` to draw into an existing figure where that fits.

The package, one job per module: ``common`` (colours, checks, axes, names, PNG), ``rows`` (which
rows a layers figure draws), ``scale`` (the colour scale), ``heatmaps``, ``distributions``,
``series``, ``noise`` (the gradient noise scale), ``table``, ``overview`` (``panel_figure``). Every name is importable from
``gradwidget.plots``.
"""

from __future__ import annotations

from .._look import HEALTH_COLORS
from .common import (
    CMAP_NAME,
    EXPLODING_COLOR,
    FIGURE_MAX_STEPS,
    NODATA_COLOR,
    NONFINITE_COLOR,
    VANISHING_COLOR,
    check_run,
    figure_to_data_uri,
    figure_to_png,
    literal,
    metric_label,
    short_name,
)
from .distributions import histogram_over_time, histogram_plot
from .._rows import MAX_DRAWN_ROWS, default_layer, drawn_rows, layer_row_groups
from .._scale import SCALE_MAX_CELLS, color_range, color_scale, diff_limit, shared_scale
from .heatmaps import DIFF_CMAP, comparison_figure, difference_heatmap, flow_heatmap, layer_bars
from .overview import panel_figure
from .noise import noise_scale_plot
from .scale import cell_colors
from .series import loss_plot, metric_series, weight_plot
from .table import HEALTH_COLUMNS, format_cell, health_table_figure

__all__ = [
    "CMAP_NAME",
    "DIFF_CMAP",
    "EXPLODING_COLOR",
    "HEALTH_COLORS",
    "HEALTH_COLUMNS",
    "FIGURE_MAX_STEPS",
    "MAX_DRAWN_ROWS",
    "NODATA_COLOR",
    "NONFINITE_COLOR",
    "SCALE_MAX_CELLS",
    "VANISHING_COLOR",
    "check_run",
    "cell_colors",
    "color_range",
    "color_scale",
    "comparison_figure",
    "default_layer",
    "diff_limit",
    "difference_heatmap",
    "drawn_rows",
    "figure_to_data_uri",
    "figure_to_png",
    "flow_heatmap",
    "format_cell",
    "health_table_figure",
    "histogram_over_time",
    "histogram_plot",
    "layer_bars",
    "layer_row_groups",
    "literal",
    "loss_plot",
    "metric_label",
    "metric_series",
    "noise_scale_plot",
    "panel_figure",
    "shared_scale",
    "short_name",
    "weight_plot",
]
