"""Which rows a layers view draws (the panel's heatmap, its static copy and every figure): every
layer, or past ``MAX_DRAWN_ROWS`` consecutive layers merged by module path (each merged row
measured as one tensor, ``Run.merge_layers``); and the layer a view focuses on first. Numpy only."""

from __future__ import annotations

import numpy as np

from .run import Run


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
                b = g[a : a + size]
                cut.append(b)
                cut_labels.append(f"{names[b[0]]} … {names[b[-1]]} ({len(b)} tensors)" if len(b) > 1 else names[b[0]])
        groups, labels = cut, cut_labels
    return groups, labels


def drawn_rows(run: Run, max_rows: int = MAX_DRAWN_ROWS) -> Run:
    """The run as a figure draws it: itself, or its layers merged into at most ``max_rows`` groups
    (``Run.merge_layers``: each group measured as one tensor, labelled with its size)."""
    g = layer_row_groups(run, max_rows)
    return run if g is None else run.merge_layers(*g)


def default_layer(run: Run) -> int:
    """The layer a view focuses on when none is chosen: the one flagged most often (non-finite,
    exploding, vanishing, in that order of weight; a parameter the loss cannot move is never flagged
    vanishing, ``Run.cannot_move``), else the first layer the loss can move; -1 (none) when the
    run has no layers."""
    if run.n_layers == 0:
        return -1
    if run.n_steps == 0:
        return 0
    score = 1e6 * run.nonfinite().sum(axis=0) + 1e3 * run.exploding().sum(axis=0) + run.vanishing().sum(axis=0)
    if score.max() > 0:
        return int(np.argmax(score))
    movable = np.flatnonzero(~run.cannot_move())
    return int(movable[0]) if movable.size else 0
