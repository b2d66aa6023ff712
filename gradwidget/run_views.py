"""Runs derived from a Run, each a new Run (the store is never changed): a slice of steps and
layers, a downsampled copy, layers merged into groups, the rolling window with its history in
front; and the long table of a run. ``Run``'s methods of the same names call these."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from .layers import LayerInfo
from .rules import fold_of, merge_layers_at, reduce_blocks
from .run import Run, concat_rows
from .schema import METRICS, NONFINITE_ROW

if TYPE_CHECKING:
    import pandas as pd


def slice_run(run: Run, steps: slice | None = None, layers: Sequence[int | str] | None = None) -> "Run":
    """A copy restricted to a range of step rows and/or a subset of layers (kept in depth order)."""
    if steps is not None and not isinstance(steps, slice):
        raise TypeError(
            f"steps must be a slice of step rows (e.g. slice(10, 50) or slice(-100, None)) or None, "
            f"got {type(steps).__name__} {steps!r}"
        )
    if layers is not None and (isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence)):
        raise TypeError(f"layers must be a list of layer names or indices, got {type(layers).__name__} {layers!r}")
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    a, b, st = (steps if steps is not None else slice(None)).indices(run._n)
    if st != 1:
        raise ValueError("step slices must be contiguous (use downsample to thin a run)")
    r = run._slice_rows(a, b)
    if layers is None:
        return r
    idx = sorted({run.layer_index(x) for x in layers})
    remap = {old: new for new, old in enumerate(idx)}
    out = Run(
        [run.layers[i] for i in idx],
        thresholds=run.thresholds,
        meta=run.meta,
        edges=[(remap[u], remap[v]) for u, v in run.edges if u in remap and v in remap],
    )
    out._steps, out._n, out._cap = r._steps, r._n, r._n
    out._metrics = r._metrics[:, :, idx].copy()
    out._nonfinite = r._nonfinite[:, idx].copy()
    out._scalars = r._scalars
    out._hist, out._hist_steps, out._hn = r._hist[:, idx].copy(), r._hist_steps, r._hn
    out.noise = r.noise.select_layers(idx) if r.noise is not None else None
    return out


def downsample_by(run: Run, k: int) -> "Run":
    """Fold every ``k`` consecutive steps into one (max for max |g| and non-finite, mean otherwise)."""
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    r = Run(run.layers, thresholds=run.thresholds, edges=run.edges, meta=run.meta)
    if run._n == 0:
        return r
    m = run._M3
    parts = [reduce_blocks(m[:, j], k, fold_of(name)) for j, name in enumerate(METRICS)]
    r._metrics = np.stack(parts, axis=1)
    r._nonfinite = reduce_blocks(run._NF, k, fold_of("nonfinite"))
    r._steps = reduce_blocks(run.steps, k, "first")
    r._scalars = reduce_blocks(run._S2, k, "mean")
    r._n = r._cap = len(r._steps)
    r._hist, r._hist_steps, r._hn = run.hist.copy(), run.hist_steps.copy(), run._hn
    return r


def merge_layers(run: Run, groups: Sequence[Sequence[int]], names: Sequence[str]) -> "Run":
    """A run with one layer per group of this run's layers, each group measured as if its
    tensors were one: L2 norms (gradient, weight, update) combined in quadrature, mean |g| and
    zero fraction weighted by size, max |g| the largest, std from the members' variances
    weighted by size (their signed means are not recorded), non-finite counts summed (exactly),
    histograms added in 64 bits (``rules.merge_of``; a member without a value that step is left out).
    Why: a figure of 10,000 tensors needs rows it can draw, and a merged row must say the truth about its members."""
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    if len(groups) != len(names):
        raise ValueError(f"{len(groups)} groups for {len(names)} names")
    numel = np.array([max(1, info.numel) for info in run.layers], np.float64)
    layers = [
        LayerInfo(
            str(n),
            module=str(n),
            module_type=f"{len(g)} tensors" if len(g) > 1 else run.layers[g[0]].module_type,
            numel=int(numel[list(g)].sum()),
            status="trainable" if any(run.layers[i].status != "frozen" for i in g) else "frozen",
        )
        for g, n in zip(groups, names)
    ]
    r = Run(layers, thresholds=run.thresholds, meta=run.meta)
    if run.history is not None:
        r.history = run.history.merge_layers(groups, names)
    if run._n == 0:
        return r
    if groups:  # the one definition of each metric's merge: rules.merge_layers_at
        order = np.concatenate([np.asarray(g, np.intp) for g in groups])
        starts = np.cumsum([0] + [len(g) for g in groups[:-1]])
        m = run._M3[:, :, order]
        r._metrics = np.stack(
            [merge_layers_at(m[:, k], name, starts, numel[order]) for k, name in enumerate(METRICS)], axis=1
        ).astype(np.float32)
        r._nonfinite = merge_layers_at(run._NF[:, order], "nonfinite", starts, numel[order])  # summed exactly
        r._metrics[:, NONFINITE_ROW] = np.nan  # kept once, in _nonfinite (Run.block)
    else:
        r._metrics = np.zeros((run._n, len(METRICS), 0), np.float32)
        r._nonfinite = np.zeros((run._n, 0), np.float64)
    r._steps, r._scalars = run.steps.copy(), run._S2.copy()
    r._n = r._cap = run._n
    if run._hn:
        h = run.hist
        # a group's counts are summed in 64 bits and kept so: a group may hold more than 2**32 entries
        r._hist = np.stack([h[:, list(g)].sum(axis=1, dtype=np.uint64) for g in groups], axis=1)
        r._hist_steps, r._hn = run.hist_steps.copy(), run._hn
    return r


def with_history(run: Run) -> "Run":
    """This run with the decimated steps its rolling window folded into ``history`` in front
    (histograms: the window's only), or the run itself when it has no history.

    Why: the live panel shows (and scales its colours over) history and window; the static
    figures show the same steps so that they agree with it.
    """
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    h = run.history
    if h is None or h.n_steps == 0:
        return run
    full = concat_rows(h, run)
    full._hist, full._hist_steps, full._hs, full._hn = run.hist.copy(), run.hist_steps.copy(), 0, run._hn
    return full


def to_frame(run: Run) -> "pd.DataFrame":
    """Long table: one row per (step, layer) with every metric and the original crate's flags."""
    import pandas as pd

    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    n, L = run._n, run.n_layers
    data = {
        "step": np.repeat(run.steps, L),
        "layer": pd.Categorical(
            np.tile(np.array(run.layer_names, dtype=object), n), categories=run.layer_names, ordered=True
        ),
    }
    for name in METRICS:
        data[name] = run.metric(name).reshape(-1)
    data["is_vanishing"] = run.vanishing().reshape(-1)
    data["is_exploding"] = run.exploding().reshape(-1)
    data["flow_intensity"] = run.flow_intensity().reshape(-1)
    return pd.DataFrame(data)
