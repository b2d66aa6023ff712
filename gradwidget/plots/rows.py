"""Which rows a layers figure draws: every layer, or past ``MAX_DRAWN_ROWS`` consecutive layers
merged by module path (each merged row measured as one tensor, ``Run.merge_layers``)."""
from __future__ import annotations

from ..run import Run


#: most rows a layers figure draws: beyond it, layers are merged (``drawn_rows``) so the figure's
#: height, memory and time stay bounded for 10,000 tensors.
MAX_DRAWN_ROWS = 200


def layer_row_groups(run: Run, max_rows: int = MAX_DRAWN_ROWS) -> tuple[list[list[int]], list[str]] | None:
    """How to draw more layers than ``max_rows``: consecutive layers (depth order) grouped by the
    deepest module-path prefix that leaves at most ``max_rows`` groups, else by equal blocks of
    consecutive layers; each group labelled with its prefix (or first … last) and its size. None
    when every layer fits."""
    L = run.n_layers
    if L <= max_rows:
        return None
    paths = [(info.module or info.name.rsplit(".", 1)[0]).split(".") for info in run.layers]
    best = None
    for depth in range(1, max(len(p) for p in paths) + 1):
        keys = [".".join(p[:depth]) for p in paths]
        groups: list[list[int]] = []
        for i, k in enumerate(keys):
            if groups and keys[groups[-1][0]] == k:
                groups[-1].append(i)
            else:
                groups.append([i])
        if len(groups) > max_rows:
            break
        best = (groups, [keys[g[0]] + (f" ({len(g)} tensors)" if len(g) > 1 else "") for g in groups])
    if best is None:
        size = -(-L // max_rows)
        groups = [list(range(a, min(a + size, L))) for a in range(0, L, size)]
        names = run.layer_names
        best = (groups, [f"{names[g[0]]} … {names[g[-1]]} ({len(g)} tensors)" if len(g) > 1 else names[g[0]]
                         for g in groups])
    return best


def drawn_rows(run: Run, max_rows: int = MAX_DRAWN_ROWS) -> Run:
    """The run as a figure draws it: itself, or its layers merged into at most ``max_rows`` groups
    (``Run.merge_layers``: each group measured as one tensor, labelled with its size)."""
    g = layer_row_groups(run, max_rows)
    return run if g is None else run.merge_layers(*g)
