"""Two runs on the same rows and columns, for the comparison panel (``GradientPanel.compare``).

Rows: the first run's layers in its depth order, then the layers only the later run has (a renamed
layer, same shape and place, shares its row: ``compare.match_layers``). Columns: the steps either
run recorded, aligned by step number and folded to the page's width like a single run's. Each run
leaves NaN (drawn as "no data") where it has no such step or layer. One colour scale covers both
runs; the difference map is log10(later / first) per cell. Pure functions: no traitlets, no I/O.
"""

from __future__ import annotations

import numpy as np

from ..comparison import match_layers
from ..run import HIST_HI, HIST_LO, METRICS, N_BINS, Run
from ..rules import reduce_blocks
from .payload import all_steps, cell_flags, column_block, origin_mark, thresholds_of


def row_layout(a: Run, b: Run) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(row names, a's layer index per row, b's layer index per row); -1 where a run lacks it."""
    common, renamed, _, only_b = match_layers(a, b)
    in_b = {n: n for n in common} | dict(renamed)
    names = list(a.layer_names) + list(only_b)
    ia = np.array([a.layer_index(n) for n in a.layer_names] + [-1] * len(only_b), np.intp)
    ib = np.array(
        [b.layer_index(in_b[n]) if n in in_b else -1 for n in a.layer_names] + [b.layer_index(n) for n in only_b],
        np.intp,
    )
    return names, ia, ib


def _fold(run: Run, values: np.ndarray, col_starts: np.ndarray, how: str, fill) -> np.ndarray:
    """``values`` (run steps x k) folded into the shared columns (columns x k); ``fill`` where the
    run has no step in a column."""
    steps = all_steps(run)
    out = np.full((len(col_starts),) + values.shape[1:], fill, values.dtype)
    if len(steps) == 0:
        return out
    col = np.searchsorted(col_starts, steps, side="right") - 1
    starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
    out[col[starts]] = reduce_blocks(values, 1, how, starts=starts)
    return out


def _rows(values: np.ndarray, index: np.ndarray, fill) -> np.ndarray:
    """Columns of ``values`` (steps x layers) picked per row; ``fill`` for -1."""
    out = np.full((values.shape[0], len(index)), fill, values.dtype)
    ok = index >= 0
    out[:, ok] = values[:, index[ok]]
    return out


def compare_view(a: Run, b: Run, metric: str, columns: int, labels: list[str]) -> tuple[dict, dict]:
    """``meta`` and the arrays of the comparison panel: heat/flags (the first run), heat_b/flags_b
    (the later one), diff, col_steps and loss (the later run's), on shared rows and columns."""
    from .._scale import diff_limit, shared_scale

    names, ia, ib = row_layout(a, b)
    steps = np.union1d(all_steps(a), all_steps(b))
    k = column_block(len(steps), columns)
    col_starts = steps[::k]
    heats, flags = [], []
    for run, index in ((a, ia), (b, ib)):
        full = run.with_history()
        mets = {m: full.metric(m) for m in ("mean_abs", "max_abs", "nonfinite", metric)}
        how = "max" if metric in ("max_abs", "nonfinite") else "mean"
        heats.append(_fold(run, _rows(mets[metric], index, np.nan), col_starts, how, np.nan).T)
        f = cell_flags(run, mets["mean_abs"], mets["max_abs"], mets["nonfinite"])
        flags.append(_fold(run, _rows(f, index, 0), col_starts, "or", 0).T)
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = np.log10(heats[1].astype(np.float64) / heats[0])
    diff = np.where(np.isfinite(diff), diff, np.nan).astype(np.float32)
    lo, hi = shared_scale([a, b], metric)
    layers = []
    for n, i, j in zip(names, ia, ib):
        li = (a if i >= 0 else b).layers[i if i >= 0 else j]
        layers.append({"name": n, "module_type": li.module_type, "status": li.status, "numel": int(li.numel)})
    R, C = len(names), len(col_starts)
    missing = [n for n, i, j in zip(names, ia, ib) if i < 0 or j < 0]
    meta = {
        "n_layers": R,
        "n_steps": int(len(steps)),
        "rows": R if C else 0,
        "cols": int(C),
        "scale": [float(lo), float(hi)],
        "diff_max": diff_limit(diff),
        "hist_all_step": -1,
        "layers": layers,
        "metric": metric,
        "metrics": list(METRICS),
        "hist_lo": HIST_LO,
        "hist_hi": HIST_HI,
        "n_bins": N_BINS,
        "thresholds": thresholds_of(b),
        "first_step": int(steps[0]) if C else 0,
        "last_step": int(steps[-1]) if C else 0,
        "block": int(k),
        "version": int(b.version),
        "message": (
            f"{len(missing)} layer(s) are in one run only (no data in the other): "
            + ", ".join(missing[:4])
            + (" …" if len(missing) > 4 else "")
        )
        if missing
        else "",
        "level": "info" if missing else "",
        "origin": origin_mark(a),
        "missing": missing,
        "compare_steps": [[int(s[0]), int(s[-1])] if len(s) else [] for s in (all_steps(a), all_steps(b))],
    }
    loss = _fold(b, b.with_history().scalar("loss").astype(np.float32)[:, None], col_starts, "mean", np.nan)[:, 0]
    arrays = {
        "heat": heats[0],
        "flags": flags[0],
        "heat_b": heats[1],
        "flags_b": flags[1],
        "diff": diff,
        "col_steps": col_starts.astype(np.float64),
        "loss": loss,
    }
    return meta, arrays


def nearest_shared_step(a: Run, b: Run | None, step: int) -> int:
    """The step of either run nearest ``step`` (ties to the earlier one)."""
    steps = np.union1d(all_steps(a), all_steps(b)) if b is not None else all_steps(a)
    if len(steps) == 0:
        return int(step)
    i = int(np.clip(np.searchsorted(steps, step), 0, len(steps) - 1))
    if i > 0 and step - steps[i - 1] <= steps[i] - step:
        i -= 1
    return int(steps[i])


def table_rows(cmp, names: list[str]) -> list[dict]:
    """The health table of a comparison (``Comparison.layers``) as panel rows: the later run's
    health (``health``), the first's (``health_a``) and the change of the final gradient norm
    (``change``, log10 later / first), one row per panel row (``index``)."""
    from .table import _shown, jsonable

    la, lb = cmp.labels[0], cmp.labels[1]
    frame = cmp.layers.set_index("layer")
    rows = []
    for i, n in enumerate(names):
        if n not in frame.index:
            continue
        r = frame.loc[n]
        rows.append(
            {
                "index": i,
                "layer": n,
                "health": str(r[f"health ({lb})"]),
                "health_a": str(r[f"health ({la})"]),
                "change": _shown(jsonable(r.get(f"log10 grad_norm ratio ({lb})", np.nan))),
            }
        )
    return rows
