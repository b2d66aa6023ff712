"""Run + view -> the arrays the page draws. Pure functions: no traitlets, no threads, no I/O.

The heatmap is bounded by the page's width (``columns``) whatever the run's length: consecutive
steps are folded into columns (``column_block`` steps each), so a 100,000-step run costs about
``rows x columns x 5`` bytes per update. Rows are layers, or past ``plots.MAX_DRAWN_ROWS`` layers
the groups of ``rows.row_layout`` (each measured as one tensor: ``rules.merge_layers_at``), so an
update of 10,000 tensors is about as big as one of 200. Exact values at one step (``detail``) and
a row's histograms over time come on demand, when the step or the layer changes.
"""

from __future__ import annotations

import numpy as np

from ..rules import (
    fold_of,
    merge_layers_at,
    nearest_index,
    nonfinite_mask,
    over_threshold_mask,
    reduce_blocks,
    vanishing_mask,
)
from ..run import HIST_HI, HIST_LO, METRICS, N_BINS, Run
from .protocol import FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING
from .rows import Rows

#: most histogram steps of one layer sent at once (evenly thinned beyond).
MAX_HISTS = 128
#: most layers for which every layer's newest histogram (``hist_all``) is sent (512 bytes a layer).
MAX_HIST_ALL_LAYERS = 4096


def column_block(n_steps: int, columns: int) -> int:
    """Steps per heatmap column so that ``n_steps`` fit in at most ``columns`` columns."""
    return max(1, -(-int(n_steps) // max(1, int(columns))))


def cell_flags(
    run: Run, mean_abs: np.ndarray, max_abs: np.ndarray, nonfinite: np.ndarray, trainable: np.ndarray | None = None
) -> np.ndarray:
    """uint8 ``(steps, layers)`` flag bits by the Run's flag rules (``gradwidget.run``), on the
    given metric arrays (the window and the folded history together). No data: NaN mean |g|
    without a non-finite count (the layer got no gradient that step). ``trainable``: per column,
    whether it may be flagged vanishing (a group's rows: any member may); by default the run's
    trainable layers the loss can move (``Run.cannot_move``)."""
    nf = nonfinite_mask(nonfinite)
    trainable = run.trainable_mask() & ~run.cannot_move() if trainable is None else trainable
    f = np.where(vanishing_mask(mean_abs, run.thresholds, trainable), FLAG_VANISHING, 0).astype(np.uint8)
    f |= np.where(over_threshold_mask(max_abs, run.thresholds), FLAG_EXPLODING, 0).astype(np.uint8)
    f |= np.where(nf, FLAG_NONFINITE, 0).astype(np.uint8)
    f |= np.where(np.isnan(mean_abs) & ~nf, FLAG_NODATA, 0).astype(np.uint8)
    return f


def all_steps(run: Run) -> np.ndarray:
    """Every step the heatmap shows: the folded history's, then the window's."""
    h = run.history
    return run.steps if h is None or h.n_steps == 0 else np.concatenate([h.steps, run.steps])


def nearest_step(run: Run | None, step: int) -> int:
    """The recorded step nearest ``step`` (ties to the earlier one); ``step`` itself in an empty run."""
    if run is None or run.n_steps == 0:
        return int(step)
    steps = all_steps(run)
    return int(steps[nearest_index(steps, step)])


def thresholds_of(run: Run | None) -> dict:
    from ..thresholds import Thresholds

    th = run.thresholds if run is not None else Thresholds()
    return {"vanishing": float(th.vanishing), "exploding": float(th.exploding)}


def empty_view(metric: str, n_layers: int) -> tuple[dict, dict]:
    """meta and arrays before the first recorded step."""
    meta = {
        "n_layers": n_layers,
        "n_steps": 0,
        "rows": 0,
        "cols": 0,
        "layers": [],
        "metric": metric,
        "metrics": list(METRICS),
        "thresholds": thresholds_of(None),
        "first_step": 0,
        "last_step": 0,
        "hist_lo": HIST_LO,
        "hist_hi": HIST_HI,
        "n_bins": N_BINS,
        "block": 1,
        "version": 0,
        "level": "info",
        "message": "No step recorded yet: train the model and the panel fills in as it goes.",
    }
    return meta, {}


def _message(run: Run, mets: dict, values: np.ndarray, metric: str, n: int) -> tuple[str, str]:
    """The panel's message about the run's own arrays (layers, not rows: counts stay true when grouped)."""
    if n == 0:
        return "This run is empty: no step has been recorded yet.", "info"
    if run.n_layers == 0:
        return "This run is empty: it has no layers (no parameter was recorded).", "info"
    nf = mets["nonfinite"] > 0
    n_nf = int(np.count_nonzero(nf))
    if n_nf:
        bad = np.flatnonzero(nf.any(axis=0))
        names = ", ".join(run.layers[j].name for j in bad[:3]) + (" ..." if len(bad) > 3 else "")
        return (
            f"Non-finite gradients (NaN/Inf) in {n_nf} layer-steps, {len(bad)} layer(s): {names}. "
            "They are marked magenta; values there are not plotted."
        ), "error"
    if not np.isfinite(values).any():
        return (
            f"No finite values of {metric} in this run"
            + (" (update norms need an optimizer)" if metric == "update_norm" else "")
            + "."
        ), "warning"
    return "", ""


def merged(values: np.ndarray, metric: str, rows: Rows | None) -> np.ndarray:
    """``values`` (steps x layers) on the panel's rows: itself, or merged into its groups."""
    return values if rows is None else merge_layers_at(values, metric, rows.starts, rows.numel)


def heat_view(run: Run, metric: str, columns: int, rows: Rows | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """``meta`` and the heatmap's arrays (heat, flags, col_steps, loss, hist_all) of ``run``, one
    row per layer or per row of ``rows`` (``rows.row_layout``)."""
    from .._scale import color_scale

    full = run.with_history()
    steps = full.steps
    mets = {m: full.metric(m) for m in ("mean_abs", "max_abs", "nonfinite", metric)}
    N, L = len(steps), run.n_layers
    k = column_block(N, columns)
    message, level = _message(run, mets, mets[metric], metric, N)
    trainable = None
    if rows is not None:
        mets = {m: merged(v, m, rows) for m, v in mets.items()}
        trainable = np.logical_or.reduceat(run.trainable_mask() & ~run.cannot_move(), rows.starts)
    values = mets[metric]
    heat = reduce_blocks(values, k, fold_of(metric)).T
    flags = reduce_blocks(cell_flags(run, mets["mean_abs"], mets["max_abs"], mets["nonfinite"], trainable), k, "or").T
    cols = heat.shape[1]
    R = L if rows is None else rows.n
    lo, hi = color_scale(run, metric) if rows is None else _scale(values)
    hs = run.hist_steps
    hist_all = run.hist[-1] if len(hs) and R <= MAX_HIST_ALL_LAYERS else np.zeros((0, N_BINS), np.uint64)
    if rows is not None and len(hist_all):
        hist_all = np.add.reduceat(hist_all, rows.starts, axis=0)
    layers = (
        [
            {"name": li.name, "module_type": li.module_type, "status": li.status, "numel": int(li.numel)}
            for li in run.layers
        ]
        if rows is None
        else rows.entries
    )
    meta = {
        "n_layers": L,
        "n_steps": int(N),
        "rows": R if cols else 0,
        "cols": int(cols),
        "scale": [float(lo), float(hi)],
        "hist_all_step": int(hs[-1]) if len(hist_all) else -1,
        "layers": layers,
        "grouped": rows is not None,
        "metric": metric,
        "metrics": list(METRICS),
        "thresholds": thresholds_of(run),
        "first_step": int(steps[0]) if N else 0,
        "last_step": int(steps[-1]) if N else 0,
        "hist_lo": HIST_LO,
        "hist_hi": HIST_HI,
        "n_bins": N_BINS,
        "block": int(k),
        "version": int(run.version),
        "message": message,
        "level": level,
        "origin": origin_mark(run, rows),
    }
    arrays = {
        "heat": heat,
        "flags": flags,
        "col_steps": steps[::k].astype(np.float64),
        "loss": reduce_blocks(full.scalar("loss").astype(np.float32), k, "mean"),
        "hist_all": hist_all,
    }
    return meta, arrays


def _scale(values: np.ndarray) -> tuple[float, float]:
    """The colour range of grouped rows: the static figures' rule (``plots.color_range``) on the
    merged values, as the static figure of the same groups computes it."""
    from .._scale import color_range

    return color_range(values) if len(values) else (0.0, 1.0)


def origin_mark(run: Run, rows: Rows | None = None) -> dict | None:
    """Where the first NaN/Inf was made, for the heatmap's mark: its step, the layer row standing for
    its module (``analysis.nonfinite.origin_layer``, or the row of ``rows`` holding it; None for
    the loss or the input), the module and the pass. None when no origin was traced."""
    from ..analysis.nonfinite import origin_layer

    o = run.nonfinite_origin
    if o is None:
        return None
    row = origin_layer(run, o)
    if row is not None and rows is not None:
        row = rows.row_of(row)
    return {"step": int(o.step), "row": row, "module": o.module, "phase": o.phase}


#: what must be unchanged since the last update for new columns alone to be sent (``patch_start``)
PATCH_KEYS = ("metric", "block", "n_layers", "first_step", "history_steps", "rows")


def view_shape(run: Run, meta: dict, rows: Rows | None = None) -> dict:
    """What a heatmap update was made of: compared by ``patch_start`` with the next one."""
    shape = {k: meta.get(k) for k in ("metric", "block", "n_layers", "first_step", "n_steps")}
    shape["history_steps"] = run.history.n_steps if run.history is not None else 0
    shape["rows"] = rows.key() if rows is not None else None
    return shape


def patch_start(before: dict | None, now: dict) -> int | None:
    """The first heatmap column that differs from the update ``before`` when ``now`` only appended
    steps (the same metric, block, layers and first step): the columns before it are unchanged, so
    only the columns from it on need to travel. None: everything changed (send it all)."""
    if before is None or any(before[k] != now[k] for k in PATCH_KEYS) or now["n_steps"] < before["n_steps"]:
        return None
    return int(before["n_steps"]) // int(now["block"])


def detail_view(run: Run | None, step: int, layer: int, rows: Rows | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """Exact values of every row (layer, or group of ``rows``) at ``step`` and the histograms of
    ``layer``'s row (a group's: its members' added), thinned to MAX_HISTS, always with the one
    at or before ``step`` (the page never shows a later one): scalars and arrays. ``hist_layer`` is ``layer`` (the page finds its row)."""
    scalars = {"detail_step": -1, "hist_layer": -1}
    arrays: dict[str, np.ndarray] = {}
    if run is None or run.n_steps == 0:
        return scalars, arrays
    steps = run.steps
    i = int(np.searchsorted(steps, step))
    if i < len(steps) and steps[i] == step:
        d = run.step_row(i)  # float64: the non-finite counts exact at any size
        if rows is not None:
            d = np.stack([merged(d[k][None, :], name, rows)[0] for k, name in enumerate(METRICS)])
        arrays["detail"] = np.asarray(d, np.float64)  # float64 already: no copy
        scalars["detail_step"] = int(step)
    if 0 <= layer < run.n_layers:
        scalars["hist_layer"] = int(layer)
        a, b = layer, layer + 1
        if rows is not None:
            r = rows.row_of(layer)
            a, b = int(rows.starts[r]), int(rows.starts[r] + rows.counts[r])
        hs = run.hist_steps
        if len(hs):
            idx = np.unique(np.linspace(0, len(hs) - 1, min(len(hs), MAX_HISTS)).round().astype(int))
            at = int(np.searchsorted(hs, step, side="right")) - 1  # the histogram at or before the step
            idx = np.unique(np.append(idx, at)) if at >= 0 else idx
            arrays["hists"] = run.hist[idx, a:b, :].sum(axis=1, dtype=np.uint64)
            arrays["hist_steps"] = hs[idx].astype(np.float64)
    return scalars, arrays


def snapshot(run: Run) -> Run:
    """A copy of ``run`` (window, histograms, folded history) that later appends cannot change:
    what the analysis reads off the training thread. Taken on the thread that appends."""
    run = run.snapshot()  # consistent even off that thread (Run.snapshot)
    snap = run._slice_rows(0, run.n_steps)
    if run.n_steps == 0:
        snap._hist, snap._hist_steps, snap._hn = run.hist.copy(), run.hist_steps.copy(), run._hn
    if run.history is not None:
        snap.history = run.history._slice_rows(0, run.history.n_steps)
    snap.max_steps = run.max_steps
    snap.version = run.version
    return snap
