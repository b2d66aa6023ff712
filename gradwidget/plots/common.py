"""What every figure shares: the colours and labels (from the panel protocol), argument checks,
axes, empty-figure notes, layer names and ticks, and PNG output."""

from __future__ import annotations

import base64
import io
from typing import Sequence

from matplotlib.figure import Figure

from .._look import MARKS, METRIC_LABELS, elide
from ..run import Run
from ..schema import metric_index
from .._rows import drawn_rows

CMAP_NAME = "viridis"
VANISHING_COLOR, EXPLODING_COLOR, NONFINITE_COLOR, NODATA_COLOR = (
    MARKS[k] for k in ("vanishing", "exploding", "nonfinite", "nodata")
)

#: heatmap figures wider than this many steps are downsampled (max |g| and non-finite keep their maxima).
FIGURE_MAX_STEPS = 600


def metric_label(metric: str) -> str:
    """A metric's name as the figures and the page label it (one table: the panel protocol's)."""
    return METRIC_LABELS.get(metric, metric)


def check_metric(metric: str) -> None:
    metric_index(metric)  # a KeyError listing the metrics for any other name


def check_run(run) -> Run:
    if not isinstance(run, Run):
        inner = getattr(run, "run", None)  # a Recorder, a GradientPanel or an analysis Report
        if isinstance(inner, Run):
            return inner
        raise TypeError(f"expected a gradwidget Run (or something with .run), got {type(run).__name__}")
    return run


def new_ax(ax, figsize):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def empty_axes(ax, text: str = "no steps recorded yet", axis_off: bool = True) -> None:
    """Say in the middle of ``ax`` why it has nothing to draw."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    if axis_off:
        ax.set_axis_off()


def empty_note(run: Run) -> str | None:
    """Why a run has nothing to draw (no step, or no layer), or None when it has."""
    if run.n_steps == 0:
        return "no steps recorded yet"
    if run.n_layers == 0:
        return "empty run: no layers recorded"
    return None


def layers_axes(run, metric: str, ax, width: float):
    """Checked run (layers merged past ``MAX_DRAWN_ROWS``), figure and axes sized for one row per
    drawn layer (empty runs get a note)."""
    run = check_run(run)
    check_metric(metric)
    run = drawn_rows(run)
    fig, ax = new_ax(ax, (width, 0.6 + 0.22 * max(run.n_layers, 4)))
    note = empty_note(run)
    if note:
        empty_axes(ax, note)
    return run, fig, ax


def literal(text: str) -> str:
    """A user's string (a layer or model name) as matplotlib text drawn as written: every ``$`` is
    escaped, so ``$x^2$`` is not typeset as math and ``$\\foo$`` or ``$$`` cannot fail the figure
    (matplotlib shows ``\\$`` as a plain ``$`` in text without math)."""
    return text.replace("$", r"\$")


def short_name(name: str, width: int = 28) -> str:
    """A layer name for a figure (``literal``), elided by ``elide``: the block index and the parameter kept."""
    return literal(elide(name, width))


def depth_axis(ax, n: int) -> None:
    """Row 0 (the input side) at the top, the loss side at the bottom."""
    ax.set_ylim(n - 0.5, -0.5)


def layer_ticks(ax, names: Sequence[str], axis: str = "y", max_labels: int = 40) -> None:
    n = len(names)
    every = max(1, -(-n // max_labels))
    idx = list(range(0, n, every))
    labels = [short_name(names[i]) for i in idx]
    if axis == "y":
        ax.set_yticks(idx, labels, fontsize=7)
    else:
        ax.set_xticks(idx, labels, fontsize=7, rotation=90)


def figure_to_png(fig: Figure, dpi: int = 96) -> bytes:
    """PNG bytes of a figure (Agg canvas; no pyplot, no display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_to_data_uri(fig: Figure, dpi: int = 96) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_to_png(fig, dpi)).decode("ascii")
