"""matplotlib figures of a Run: the static renditions of what the live panel shows.

They are what survives where no widget runs (exported HTML, GitHub, CI logs, the HTML report), so
they draw the same things the front end draws, the same way:

Colour scale (shared with the front end and ``Run.to_ascii``)
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
"""
from __future__ import annotations

import base64
import io
from typing import Iterable, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import offset_copy

from .outputs import log_levels
from .run import METRICS, Run
from .panel.protocol import HEALTH_COLORS, MARKS, METRIC_LABELS  # noqa: F401  (HEALTH_COLORS: plots.HEALTH_COLORS)

CMAP_NAME = "viridis"
VANISHING_COLOR, EXPLODING_COLOR, NONFINITE_COLOR, NODATA_COLOR = (
    MARKS[k] for k in ("vanishing", "exploding", "nonfinite", "nodata"))

#: heatmaps wider than this many steps are downsampled (max |g| and non-finite keep their maxima).
MAX_COLUMNS = 600

_METRIC_LABELS = METRIC_LABELS  # one definition: the panel protocol


def metric_label(metric: str) -> str:
    return _METRIC_LABELS.get(metric, metric)


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r}; metrics are {list(METRICS)}")


def _check_run(run) -> Run:
    if not isinstance(run, Run):
        inner = getattr(run, "run", None)  # a Recorder, a GradientPanel or an analysis Report
        if isinstance(inner, Run):
            return inner
        raise TypeError(f"expected a gradwidget Run (or something with .run), got {type(run).__name__}")
    return run


def _new_ax(ax, figsize):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _empty(ax, text: str = "no steps recorded yet", axis_off: bool = True) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    if axis_off:
        ax.set_axis_off()


def _empty_note(run: Run) -> str | None:
    """Why a run has nothing to draw (no step, or no layer), or None when it has."""
    if run.n_steps == 0:
        return "no steps recorded yet"
    if run.n_layers == 0:
        return "empty run: no layers recorded"
    return None


#: most rows a layers figure draws: beyond it, layers are merged (``drawn_rows``) so the figure's
#: height, memory and time stay bounded for 10,000 tensors.
MAX_DRAWN_ROWS = 200


#: a module grouping with fewer rows than ``max_rows // COARSE_GROUPING`` is too coarse to read (a
#: model of 10,000 tensors as ``embed``, ``layers (9,998 tensors)``, ``norm``): its big groups are cut in blocks.
COARSE_GROUPING = 8


def layer_row_groups(run: Run, max_rows: int = MAX_DRAWN_ROWS) -> tuple[list[list[int]], list[str]] | None:
    """How to draw more layers than ``max_rows``: consecutive layers (depth order) grouped by the
    deepest module-path prefix that leaves at most ``max_rows`` groups (and more than one); when
    that leaves too few (``COARSE_GROUPING``) or none, the groups are cut in equal blocks of
    consecutive layers, as small as ``max_rows`` allows. Each group labelled with its prefix (a
    block: first … last) and its size. None when every layer fits."""
    L = run.n_layers
    if L <= max_rows:
        return None
    paths = [(info.module or info.name.rsplit(".", 1)[0]).split(".") for info in run.layers]
    groups: list[list[int]] = [list(range(L))]
    labels = [""]
    for depth in range(1, max(len(p) for p in paths) + 1):
        keys = [".".join(p[:depth]) for p in paths]
        level: list[list[int]] = []
        for i, k in enumerate(keys):
            if level and keys[level[-1][0]] == k:
                level[-1].append(i)
            else:
                level.append([i])
        if len(level) > max_rows:
            break
        if len(level) > 1:  # one row for every layer says nothing: look deeper
            groups, labels = level, [keys[g[0]] + (f" ({len(g)} tensors)" if len(g) > 1 else "") for g in level]
    if len(groups) * COARSE_GROUPING <= max_rows:
        size = -(-L // max_rows)
        while sum(-(-len(g) // size) for g in groups) > max_rows:
            size += 1
        names = run.layer_names
        cut: list[list[int]] = []
        cut_labels: list[str] = []
        for g, label in zip(groups, labels):
            if len(g) <= size and label:
                cut.append(g)
                cut_labels.append(label)
                continue
            for a in range(0, len(g), size):
                b = g[a:a + size]
                cut.append(b)
                cut_labels.append(f"{names[b[0]]} … {names[b[-1]]} ({len(b)} tensors)" if len(b) > 1 else names[b[0]])
        groups, labels = cut, cut_labels
    return groups, labels


def drawn_rows(run: Run, max_rows: int = MAX_DRAWN_ROWS) -> Run:
    """The run as a figure draws it: itself, or its layers merged into at most ``max_rows`` groups
    (``Run.merge_layers``: each group measured as one tensor, labelled with its size)."""
    g = layer_row_groups(run, max_rows)
    return run if g is None else run.merge_layers(*g)


def _layers_axes(run, metric: str, ax, width: float):
    """Checked run (layers merged past ``MAX_DRAWN_ROWS``), figure and axes sized for one row per
    drawn layer (empty runs get a note)."""
    run = _check_run(run)
    _check_metric(metric)
    run = drawn_rows(run)
    fig, ax = _new_ax(ax, (width, 0.6 + 0.22 * max(run.n_layers, 4)))
    note = _empty_note(run)
    if note:
        _empty(ax, note)
    return run, fig, ax


def literal(text: str) -> str:
    """A user's string (a layer or model name) as matplotlib text drawn as written: every ``$`` is
    escaped, so ``$x^2$`` is not typeset as math and ``$\\foo$`` or ``$$`` cannot fail the figure
    (matplotlib shows ``\\$`` as a plain ``$`` in text without math)."""
    return text.replace("$", r"\$")


def short_name(name: str, width: int = 28) -> str:
    """A layer name for a figure (``literal``), elided in the middle: the start of a module path says
    which block, its end which parameter, and both are needed to tell ``encoder.layers.3…attn.q.weight``
    from its neighbours."""
    if len(name) > width:
        tail = (width - 1) // 2 + (width - 1) % 2
        name = name[: width - 1 - tail] + "…" + name[-tail:]
    return literal(name)


def _depth_axis(ax, n: int) -> None:
    """Row 0 (the input side) at the top, the loss side at the bottom."""
    ax.set_ylim(n - 0.5, -0.5)


#: most cells ``color_range`` reads; a larger array is read at an even stride (the 1st..99th
#: percentiles of a million evenly spread cells are the whole array's to a fraction of a percent).
SCALE_MAX_CELLS = 1 << 20


def color_range(values: np.ndarray) -> tuple[float, float]:
    """THE colour scale of gradwidget, shared by these figures and the live panel (the kernel sends
    it to the front end in ``meta["scale"]``): ``(lo, hi)`` in log10, the 1st..99th percentile of
    log10 of the finite, non-zero cells of ``values`` (``frames.log_levels``), over every step and
    layer at once. ``(0, 1)`` when there is no such cell."""
    v = np.asarray(values).ravel()
    if v.size > SCALE_MAX_CELLS:
        v = v[:: -(-v.size // SCALE_MAX_CELLS)]
    return log_levels(v)


def color_scale(run: Run, metric: str = "grad_norm") -> tuple[float, float]:
    """The log10 range (lo, hi) of the colour scale of a run's metric: ``color_range`` over every
    step of the run, its folded ``history`` included (as the live panel's ``meta["scale"]``)."""
    _check_metric(metric)
    full = run.with_history()
    return color_range(full.metric(metric)) if full.n_steps else (0.0, 1.0)


def shared_scale(runs: Sequence[Run], metric: str = "grad_norm") -> tuple[float, float]:
    """One log10 colour range over every step of several runs (a comparison: equal colours mean
    equal values in every run's heatmap)."""
    _check_metric(metric)
    full = [r.with_history() for r in runs]
    return color_range(np.concatenate([r.metric(metric).ravel() for r in full if r.n_steps] or [np.zeros(0)]))


def cell_colors(run: Run, metric: str = "grad_norm", scale: tuple[float, float] | None = None) -> np.ndarray:
    """RGBA ``(steps, layers, 4)``: viridis on log10(metric) over ``scale``, then the marks."""
    _check_metric(metric)
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


def _mark_legend(ax, run: Run) -> None:
    t = run.thresholds
    handles = [Patch(facecolor=VANISHING_COLOR, edgecolor="0.5", label=f"vanishing (mean|g| < {t.vanishing:g})"),
               Patch(facecolor=EXPLODING_COLOR, edgecolor="0.5", label=f"exploding (max|g| > {t.exploding:g})"),
               Patch(facecolor=NONFINITE_COLOR, edgecolor="0.5", label="NaN / Inf"),
               Patch(facecolor=NODATA_COLOR, edgecolor="0.5", label="no gradient")]
    # a fixed distance below the axes (under the tick labels and the x label), whatever its height
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-30, units="points")
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 0), bbox_transform=below, ncol=4,
              fontsize=7, frameon=False, handlelength=1.2, columnspacing=1.0)


def _layer_ticks(ax, names: Sequence[str], axis: str = "y", max_labels: int = 40) -> None:
    n = len(names)
    every = max(1, -(-n // max_labels))
    idx = list(range(0, n, every))
    labels = [short_name(names[i]) for i in idx]
    if axis == "y":
        ax.set_yticks(idx, labels, fontsize=7)
    else:
        ax.set_xticks(idx, labels, fontsize=7, rotation=90)


def flow_heatmap(run: Run, metric: str = "grad_norm", step: int | None = None, ax=None,
                 max_columns: int = MAX_COLUMNS, colorbar: bool = True, legend: bool = True,
                 scale: tuple[float, float] | None = None, title: str | None = None) -> Figure:
    """Layers x steps heatmap of a metric: where along the depth gradients fade or blow up, and when.

    Why: it is the panel's main view; one log scale across steps shows a network-wide fade that a
    per-step scale hides. ``step`` draws a cursor at that step (the panel's scrubber position).
    """
    run, fig, ax = _layers_axes(run, metric, ax, 9)
    if _empty_note(run):
        return fig
    scale = color_scale(run, metric) if scale is None else scale  # a comparison shares one scale
    run = run.with_history()  # the steps the live panel shows
    r = run.downsample(max_columns) if run.n_steps > max_columns else run
    rgba = cell_colors(r, metric, scale)  # (steps, layers, 4)
    steps = r.steps
    x0 = float(steps[0])
    x1 = float(run.steps[-1]) + (float(steps[-1] - steps[-2]) if len(steps) > 1 else 1.0)
    ax.imshow(rgba.transpose(1, 0, 2), aspect="auto", interpolation="nearest", origin="upper",
              extent=(x0 - 0.5, x1 - 0.5, r.n_layers - 0.5, -0.5))  # row 0 (input side) at the top
    _layer_ticks(ax, r.layer_names, "y")
    ax.set_xlabel("step")
    ax.set_title(title or f"Gradient flow: {metric_label(metric)} (log10, one scale across steps)", fontsize=10)
    if step is not None:
        ax.axvline(float(step), color="white", lw=2.2)
        ax.axvline(float(step), color="black", lw=1.0)
    values = run.metric(metric)
    if colorbar and not (np.isfinite(values) & (values > 0)).any():
        # all NaN/Inf/zero: any colour range would be made up, so none is drawn
        ax.text(1.01, 0.5, "no finite value:\nno colour scale", transform=ax.transAxes, rotation=90,
                ha="left", va="center", fontsize=7, color="0.4")
    elif colorbar:
        from matplotlib.cm import ScalarMappable

        sm = ScalarMappable(Normalize(*scale), colormaps[CMAP_NAME])
        cb = fig.colorbar(sm, ax=ax, pad=0.01, fraction=0.04)
        cb.set_label(f"log10 {metric_label(metric)}", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    if legend:
        _mark_legend(ax, run)
    return fig


#: the difference map's colour map: diverging, centred on no change, colour-blind safe (blue: the
#: later run's gradient is smaller, red: larger).
DIFF_CMAP = "RdBu_r"


def diff_limit(log_ratio: np.ndarray) -> float:
    """The difference map's symmetric range in decades: the 99th percentile of |log10 ratio| (at
    least 0.1, so noise around no change stays pale); the live panel sends it as ``meta.diff_max``."""
    v = np.abs(np.asarray(log_ratio, np.float64))
    v = v[np.isfinite(v)]
    return float(max(np.percentile(v, 99), 0.1)) if v.size else 1.0


def comparison_figure(cmp, metric: str = "grad_norm", label: str | None = None) -> Figure:
    """The comparison panel's static image: the first run's and a later run's heatmaps on one colour
    scale, then the difference map (log10 ratio of ``metric`` where it has one, else grad_norm)."""
    from .comparison import RATIO_METRICS

    label = cmp.labels[1] if label is None else label
    runs = [cmp.runs[0], cmp.runs[cmp.labels.index(label)]]
    scale = shared_scale(runs, metric)
    n = max(r.n_layers for r in runs)
    fig = Figure(figsize=(9, 3 * (0.8 + 0.16 * min(max(n, 4), 40))), layout="constrained")
    axes = fig.subplots(3, 1)
    for ax, lab, r in zip(axes, (cmp.labels[0], label), runs):
        flow_heatmap(r, metric, ax=ax, scale=scale, legend=False, title=f"{lab}: {metric_label(metric)} (one scale)")
    dm = metric if metric in RATIO_METRICS else "grad_norm"
    difference_heatmap(cmp.log_ratio(dm, label), f"{label} vs {cmp.labels[0]}: log10 ratio of {metric_label(dm)}",
                       ax=axes[2])
    return fig


def difference_heatmap(ratio, title: str = "", ax=None, max_decades: float | None = None) -> Figure:
    """Layers x steps map of log10(later / first) from ``Comparison.log_ratio``: a diverging colour
    scale centred on 0 (white: no change), symmetric, clipped at the 99th percentile of |change|
    (or ``max_decades``); grey where either run has no value."""
    fig, ax = _new_ax(ax, (9, 0.6 + 0.22 * max(ratio.shape[1], 4)))
    if ratio.empty or not np.isfinite(ratio.to_numpy()).any():
        _empty(ax, "no common steps with a value in both runs")
        return fig
    v = ratio.to_numpy(np.float64)
    lim = max_decades or diff_limit(v)
    from .panel.protocol import DIFF_NODATA

    cmap = colormaps[DIFF_CMAP].with_extremes(bad=DIFF_NODATA)
    steps = ratio.index.to_numpy()
    x1 = float(steps[-1]) + (float(steps[-1] - steps[-2]) if len(steps) > 1 else 1.0)
    im = ax.imshow(np.ma.masked_invalid(v.T), aspect="auto", interpolation="nearest", origin="upper",
                   cmap=cmap, vmin=-lim, vmax=lim, extent=(float(steps[0]) - 0.5, x1 - 0.5, v.shape[1] - 0.5, -0.5))
    _layer_ticks(ax, list(ratio.columns), "y")
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
    run, fig, ax = _layers_axes(run, metric, ax, 5)
    if _empty_note(run):
        return fig
    i = run.n_steps - 1 if step is None else run.step_position(step)
    colors = cell_colors(run, metric)[i]
    vals = run.metric(metric)[i].astype(np.float64)
    floor = 10.0 ** (color_scale(run, metric)[0] - 1)
    shown = np.where(np.isfinite(vals) & (vals > 0), vals, np.nan)
    y = np.arange(run.n_layers)
    ax.barh(y, np.nan_to_num(shown, nan=0.0) - floor, left=floor, color=colors, edgecolor="0.4", linewidth=0.3)
    ax.set_xscale("log")
    _depth_axis(ax, run.n_layers)  # as in the heatmap
    _layer_ticks(ax, run.layer_names, "y")
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


def histogram_plot(run: Run, layer: int | str, step: int | None = None, ax=None) -> Figure:
    """Histogram of log10|g| for one layer at (the histogram step nearest) ``step``.

    Why: a norm hides the shape; the histogram shows whether a layer's gradients are uniformly tiny
    (vanishing), have a few huge entries (exploding tail), or a spike of exact zeros (dead units).
    """
    run = _check_run(run)
    fig, ax = _new_ax(ax, (5, 3))
    j = run.layer_index(layer)
    name = run.layer_names[j]
    want = (int(run.steps[-1]) if run.n_steps else 0) if step is None else step
    got = run.histogram_at(j, want)
    if got is None:
        _empty(ax, "no histogram recorded", axis_off=False)
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
    ax.set_title(f"{short_name(name, 30)} at step {hstep}" + (f"\nzeros: {zf:.0%}" if zf == zf else ""),
                 fontsize=9)
    ax.legend(fontsize=7)
    return fig


def histogram_over_time(run: Run, layer: int | str, ax=None, step: int | None = None) -> Figure:
    """Every recorded histogram of one layer as a column (steps x log10|g|, colour = share of entries).

    Why: shows how a layer's whole distribution drifts, e.g. sliding below the vanishing threshold
    or growing an exploding tail, which a single histogram or a norm cannot show.
    """
    run = _check_run(run)
    fig, ax = _new_ax(ax, (6, 3))
    j = run.layer_index(layer)
    name = run.layer_names[j]
    if len(run.hist_steps) == 0:
        _empty(ax, "no histogram recorded", axis_off=False)
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
        ax.set_ylim(min(run.hist_edges[nz[0]], np.log10(t.vanishing)) - 1,
                    max(run.hist_edges[nz[-1] + 1], np.log10(t.exploding)) + 1)
    if step is not None:
        ax.axvline(float(step), color="black", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("log10 |g|")
    ax.set_title(f"{short_name(name, 30)}: distribution over steps", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")
    return fig


def metric_series(run: Run, layers: Iterable[int | str] | int | str | None = None, metric: str = "mean_abs",
                  ax=None, step: int | None = None) -> Figure:
    """A metric over steps for a few layers (log y), with the threshold that applies to it.

    Why: shows whether a problem is permanent, growing, or a transient spike, and when it began.
    """
    run = _check_run(run)
    _check_metric(metric)
    fig, ax = _new_ax(ax, (6, 3))
    if layers is None:
        layers = range(run.n_layers)
    elif isinstance(layers, (int, np.integer, str)):
        layers = [layers]
    idx = [run.layer_index(x) for x in layers]
    note = _empty_note(run)
    if note:
        _empty(ax, note)
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
    run = _check_run(run)
    fig, ax = _new_ax(ax, (6, 2.6))
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
        ax.text(0.5, 0.5, "no loss logged (recorder.log(loss=...))", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_title("loss and global gradient norm", fontsize=10)
    return fig


def weight_plot(run: Run, ax=None, layers: Sequence[int | str] | None = None) -> Figure:
    """Update/weight norm ratio per layer over steps (or weight norms when updates are not recorded).

    Why: the ratio says whether the learning rate suits each layer (about 1e-3 is typical): far
    below, the layer barely moves; far above, it is being rewritten every step.
    """
    run = _check_run(run)
    fig, ax = _new_ax(ax, (6, 3))
    note = _empty_note(run)
    if note:
        _empty(ax, note)
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
            ax.plot(run.steps[ok], data[ok, j], lw=1.0, marker="." if ok.sum() < 30 else None,
                    color=cmap(0.1 + 0.75 * k / max(1, len(idx) - 1)), label=short_name(run.layer_names[j], 32))
    pos = data[:, idx][np.isfinite(data[:, idx]) & (data[:, idx] > 0)]
    if pos.size:
        ax.set_yscale("log")
    if use_ratio:
        t = run.thresholds
        ax.axhspan(t.update_ratio_low, t.update_ratio_high, color="#2e7d32", alpha=0.07,
                   label=f"healthy band {t.update_ratio_low:g}..{t.update_ratio_high:g}")
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.set_title(f"weights: {label} per layer", fontsize=10)
    if not ax.get_legend_handles_labels()[0]:  # no finite weight norm: say so, not an empty legend
        ax.text(0.5, 0.5, "no finite weight norm recorded", ha="center", va="center", transform=ax.transAxes)
    elif len(idx) <= 12:
        ax.legend(fontsize=6, ncol=2)
    return fig


def _health_frame(report):
    layers = getattr(report, "layers", None)
    if layers is None or not hasattr(layers, "columns"):
        raise TypeError("expected an analysis Report (gradwidget.analyze(run)) with a .layers DataFrame, "
                        f"got {type(report).__name__}")
    return layers


#: columns of the health table, in order, with their headers and formats.
HEALTH_COLUMNS = (
    ("layer", "layer", "{}"),
    ("module_type", "type", "{}"),
    ("health", "health", "{}"),
    ("grad_norm_median", "median ‖g‖", "{:.2e}"),
    ("mean_abs_median", "median mean|g|", "{:.2e}"),
    ("max_abs_max", "max |g|", "{:.2e}"),
    ("zero_frac_mean", "zeros", "{:.0%}"),
    ("trend", "trend", "{}"),
    ("flags", "flags", "{}"),
)


def format_cell(value, fmt: str) -> str:
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return ", ".join(str(v) for v in value)
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return "–"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def health_table_figure(report, ax=None, max_rows: int = 40) -> Figure:
    """The per-layer health table as a figure (for PNG/PDF exports where HTML cannot go).

    Why: the table is the panel's verdict per layer; the health cell is coloured and spelled out,
    so it reads without colour too.
    """
    df = _health_frame(report)
    cols = [c for c in HEALTH_COLUMNS if c[0] in df.columns]
    rows = df.head(max_rows)
    fig, ax = _new_ax(ax, (10, 0.5 + 0.24 * (len(rows) + 1)))
    ax.set_axis_off()
    cells = [[literal(format_cell(r[c], f)) if c != "layer" else short_name(str(r[c]), 34) for c, _, f in cols]
             for _, r in rows.iterrows()]
    if not cells:
        ax.text(0.5, 0.5, "no layers", ha="center", va="center", transform=ax.transAxes)
        return fig
    table = ax.table(cellText=cells, colLabels=[h for _, h, _ in cols], loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(list(range(len(cols))))
    hcol = [c for c, _, _ in cols].index("health") if "health" in df.columns else None
    for (r, c), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        if r == 0:
            cell.set_facecolor("#eeeeee")
            cell.get_text().set_fontweight("bold")
        elif c == hcol:
            h = str(rows.iloc[r - 1]["health"])
            cell.set_facecolor(HEALTH_COLORS.get(h, HEALTH_COLORS["Unknown"]))
            cell.get_text().set_color("white")
            cell.get_text().set_fontweight("bold")
    if len(df) > max_rows:
        ax.set_title(f"layer health (first {max_rows} of {len(df)} layers)", fontsize=10)
    else:
        ax.set_title("layer health", fontsize=10)
    return fig


def default_layer(run: Run) -> int:
    """The layer a static view focuses on when none is chosen: the one flagged most often
    (non-finite, exploding, vanishing, in that order of weight), else the input-side layer;
    -1 (none) when the run has no layers."""
    if run.n_layers == 0:
        return -1
    if run.n_steps == 0:
        return 0
    score = (1e6 * run.nonfinite().sum(axis=0) + 1e3 * run.exploding().sum(axis=0)
             + run.vanishing().sum(axis=0))
    return int(np.argmax(score)) if score.max() > 0 else 0


def panel_figure(run, step: int | None = None, layer: int | str | None = None,
                 metric: str = "grad_norm") -> Figure:
    """One figure with what the live panel shows: heatmap with the step cursor, per-layer bars at
    the step, and the selected layer's histogram and metric over time.

    Why: it is the static rendition a GradientPanel carries in its output, so exported notebooks,
    GitHub and CI logs show the panel's current view where no widget runs.
    """
    run = _check_run(run)
    _check_metric(metric)
    L = max(run.n_layers, 4)
    h_top = 0.9 + 0.2 * min(L, 48)
    fig = Figure(figsize=(12, h_top + 3.0), layout="constrained")
    gs = fig.add_gridspec(2, 3, height_ratios=[h_top, 3.0], width_ratios=[1.0, 1.0, 1.0])
    ax_heat = fig.add_subplot(gs[0, :2])
    ax_bars = fig.add_subplot(gs[0, 2])
    ax_hist = fig.add_subplot(gs[1, 0])
    ax_series = fig.add_subplot(gs[1, 1])
    ax_loss = fig.add_subplot(gs[1, 2])
    note = _empty_note(run)
    if note:
        for ax in (ax_heat, ax_bars, ax_hist, ax_series, ax_loss):
            ax.set_axis_off()
        ax_heat.text(0.5, 0.5, f"GradientPanel ({run.n_layers} layers, {run.n_steps} steps): {note}",
                     ha="center", va="center", transform=ax_heat.transAxes)
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
    fig.suptitle(f"gradwidget · {run.n_layers} layers · steps {int(run.steps[0])}..{int(run.steps[-1])} "
                 f"· step {s} · layer {literal(run.layer_names[j])}", fontsize=11)
    return fig


def figure_to_png(fig: Figure, dpi: int = 96) -> bytes:
    """PNG bytes of a figure (Agg canvas; no pyplot, no display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def figure_to_data_uri(fig: Figure, dpi: int = 96) -> str:
    return "data:image/png;base64," + base64.b64encode(figure_to_png(fig, dpi)).decode("ascii")
