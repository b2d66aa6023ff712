"""Which rows the panel draws. Up to ``plots.MAX_DRAWN_ROWS`` layers: one row per layer. Beyond it,
the static figures' groups (``plots.layer_row_groups``: consecutive layers by module, then by
block), and every group the user expanded shown as its members in its place (grouped the same way
again when they are more than the cap). Why: 10,000 tensors cannot be 10,000 rows of a heatmap,
a table the page can keep, or a payload sent four times a second; a group row is measured as if
its tensors were one (``rules.merge_layers_at``), and says how many it holds.

Every row is a run of consecutive layers (depth order), so the rows are ``starts`` alone and a
group is named by its layer range ``[start, stop)``. ``expanded`` (the panel's trait) lists such
ranges: a group shows its members when it holds one of them, so ``[i, i + 1]`` reveals layer ``i``
through every group around it, and a group's own range expands that group alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..run import Run


@dataclass(frozen=True)
class Rows:
    """The panel's rows over a run's layers (depth order)."""

    starts: np.ndarray  #: (R,) first layer of each row
    counts: np.ndarray  #: (R,) layers in each row (> 1: a group)
    labels: list[str]  #: a layer's name, or the group's label with its size
    depth: np.ndarray  #: (R,) how many expanded groups hold the row
    parents: list[tuple[int, int] | None]  #: the innermost expanded group holding the row
    numel: np.ndarray  #: (layers,) each layer's size, at least 1 (the merge's weights)
    entries: list[dict]  #: ``meta.layers``: one per row, a group's with its range, nesting and parent

    @property
    def n(self) -> int:
        return len(self.starts)

    def row_of(self, layer: int) -> int:
        """The row that shows ``layer`` (its own, or its group's)."""
        return int(np.searchsorted(self.starts, layer, side="right")) - 1

    def key(self) -> tuple:
        """What a heatmap update's rows were (an update whose rows differ is sent whole)."""
        return tuple(self.starts.tolist())


def _entries(run: Run, starts, counts, labels, depth, parents) -> list[dict]:
    out = []
    for a, n, label, d, p in zip(starts, counts, labels, depth, parents):
        if n == 1:
            li = run.layers[a]
            entry = {"name": li.name, "module_type": li.module_type, "status": li.status, "numel": int(li.numel)}
        else:
            members = run.layers[a : a + n]
            entry = {
                "name": label,
                "module_type": f"{n} tensors",
                "status": "trainable" if any(x.status != "frozen" for x in members) else "frozen",
                "numel": int(sum(x.numel for x in members)),
            }
        entry.update(start=a, count=n, depth=d, parent=list(p) if p else None)
        out.append(entry)
    return out


def _holds(group: tuple[int, int], expanded: list[tuple[int, int]]) -> bool:
    a, b = group
    return any(a <= s and e <= b for s, e in expanded)


def row_layout(run: Run, expanded=(), max_rows: int | None = None) -> Rows | None:
    """The rows of ``run`` with the groups holding a range of ``expanded`` shown as their members;
    None when every layer has its own row (at most ``max_rows``, the static figures' cap)."""
    from .._rows import MAX_DRAWN_ROWS, layer_row_groups

    cap = MAX_DRAWN_ROWS if max_rows is None else int(max_rows)
    top = layer_row_groups(run, cap)
    if top is None:
        return None
    ranges = [(int(s), int(e)) for s, e in expanded]
    starts: list[int] = []
    counts: list[int] = []
    labels: list[str] = []
    depth: list[int] = []
    parents: list[tuple[int, int] | None] = []

    def add(groups, names, level: int, parent):
        for g, label in zip(groups, names):
            a, n = int(g[0]), len(g)
            if n > 1 and _holds((a, a + n), ranges):
                sub = layer_row_groups(Run(run.layers[a : a + n]), cap)
                if sub is None:
                    add([[i] for i in range(a, a + n)], [""] * n, level + 1, (a, a + n))
                else:
                    add([[a + i for i in s] for s in sub[0]], sub[1], level + 1, (a, a + n))
                continue
            starts.append(a)
            counts.append(n)
            labels.append(run.layers[a].name if n == 1 else label)
            depth.append(level)
            parents.append(parent)

    add(*top, 0, None)
    first = np.asarray(starts, np.intp)
    return Rows(
        first,
        np.asarray(counts, np.intp),
        labels,
        np.asarray(depth, np.intp),
        parents,
        numel=np.array([max(1, li.numel) for li in run.layers], np.float64),
        entries=_entries(run, starts, counts, labels, depth, parents),
    )


def toggled(expanded, group: tuple[int, int], expand: bool) -> list[list[int]]:
    """``expanded`` with ``group`` (a layer range) expanded, or collapsed (every range inside it
    removed: its subgroups fold back with it)."""
    a, b = int(group[0]), int(group[1])
    keep = [[int(s), int(e)] for s, e in expanded if not (a <= s and e <= b)]
    return keep + [[a, b]] if expand else keep
