"""Before and after the fix (``gradwidget.compare``): runs compared layer by layer and diagnosis by
diagnosis.

``compare(run_a, run_b, ...)`` matches layers by name (a renamed layer, same shape and place, is
paired and listed; added and removed ones are listed, never dropped), aligns steps by step number,
and measures per layer and metric the log10 ratio of each later run to the first (``log_ratio`` over
time, ``final`` over the last steps both runs have). The diagnoses of each run are set side by side:
which causes appeared, disappeared or persisted. Pure: Runs in, DataFrames and text out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .analysis.stats import _quiet
from .run import METRICS, Run

#: metrics whose ratio is compared (the fractions and counts have no meaningful ratio).
RATIO_METRICS = ("grad_norm", "mean_abs", "max_abs", "std", "weight_norm", "update_norm")
#: recorded steps at the end of each run whose median is its "final" level (batch noise).
FINAL_STEPS = 10
#: a layer's final level changed when its ratio to the first run is beyond this many decades.
CHANGE_DECADES = 0.5


def _as_run(x) -> Run:
    """A Run, a run directory loaded, or what shows or records one (a GradientPanel, a Recorder, an
    analysis Report: its run as it is now); anything else is a clear error."""
    if isinstance(x, Run):
        return x.snapshot()
    if isinstance(x, (str, Path)):
        from .storage import load_run

        return load_run(x)
    run = getattr(x, "run", None)
    if isinstance(run, Run):
        return run.snapshot()
    if hasattr(x, "run"):
        raise ValueError(f"the {type(x).__name__} has recorded no step yet: there is nothing to compare")
    raise TypeError(f"compare() takes Runs, run directories, GradientPanels or Recorders, not {type(x).__name__}")


def _labels(runs: list, labels) -> list[str]:
    if labels is None:
        return [str(r) if isinstance(r, (str, Path)) else f"run {i + 1}" for i, r in enumerate(runs)]
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (list, tuple)):
        raise TypeError(
            f"labels must be a list of one name per run (e.g. labels=['before', 'after']), got "
            f"{type(labels).__name__} {labels!r}"
        )
    labels = [str(x) for x in labels]
    if len(labels) != len(runs):
        raise ValueError(f"{len(labels)} labels for {len(runs)} runs")
    if len(set(labels)) != len(labels):
        raise ValueError(f"labels must differ: {labels}")
    return labels


def match_layers(a: Run, b: Run) -> tuple[list[str], list[tuple[str, str]], list[str], list[str]]:
    """(common names, renamed pairs (a, b), only in a, only in b). A layer of ``a`` missing from ``b``
    is paired with one of ``b`` missing from ``a`` when they have the same shape and the same rank
    among the unmatched layers of that shape (a model wrapped in a container or compiled: every
    name gains a prefix; a module renamed in place)."""
    nb = set(b.layer_names)
    common = [n for n in a.layer_names if n in nb]
    only_a = [info for info in a.layers if info.name not in nb]
    na = set(a.layer_names)
    only_b = [info for info in b.layers if info.name not in na]
    renamed = []
    by_shape: dict[tuple, list] = {}
    for info in only_b:
        by_shape.setdefault(tuple(info.shape), []).append(info)
    for info in only_a:
        cands = by_shape.get(tuple(info.shape))
        if cands and info.shape:
            renamed.append((info.name, cands.pop(0).name))
    ra = {x for x, _ in renamed}
    rb = {y for _, y in renamed}
    return (
        common,
        renamed,
        [info.name for info in only_a if info.name not in ra],
        [info.name for info in only_b if info.name not in rb],
    )


def _final_levels(run: Run, cols: list[int], metric: str, last_step: int | None) -> np.ndarray:
    """Median of a metric over the last ``FINAL_STEPS`` recorded steps up to ``last_step``."""
    steps = run.steps
    end = len(steps) if last_step is None else int(np.searchsorted(steps, last_step, side="right"))
    rows = slice(max(0, end - FINAL_STEPS), end)
    v = run.metric(metric)[rows][:, cols].astype(np.float64)
    v = np.where(np.isfinite(v) & (v > 0), v, np.nan)
    with np.errstate(invalid="ignore"), _quiet():  # a layer without a gradient has no level, and says so
        return np.nanmedian(v, axis=0) if v.shape[0] else np.full(len(cols), np.nan)


@dataclass
class CauseChange:
    cause: str
    status: str  #: "appeared", "disappeared" or "persisted"
    priority: dict  #: label -> priority (absent where the run has no such diagnosis)
    layers: dict  #: label -> the layers it names in that run
    first_step: dict  #: label -> the step it began


@dataclass
class Comparison:
    labels: list[str]
    runs: list[Run] = field(repr=False)
    reports: list = field(repr=False)
    layers: pd.DataFrame  #: one row per layer of the first run (and each layer only in a later one)
    final: pd.DataFrame  #: per (label, layer, metric): log10 ratio to the first run at the end
    causes: list[CauseChange]  #: per later run, the diagnoses that appeared / disappeared / persisted
    renamed: dict  #: label -> [(name in the first run, name in that run)]
    added: dict  #: label -> layers only in that run
    removed: dict  #: label -> layers of the first run missing from that run
    verdict: list[str]  #: plain-language lines, most important first

    def log_ratio(self, metric: str = "grad_norm", label: str | None = None) -> pd.DataFrame:
        """log10(later / first) of ``metric`` per common step (rows) and matched layer (columns, the
        first run's names): the steps both runs recorded, aligned by step number."""
        if metric not in RATIO_METRICS:
            raise ValueError(f"metric must be one of {list(RATIO_METRICS)}, got {metric!r}")
        label = self.labels[1] if label is None else label
        if label not in self.labels[1:]:
            raise ValueError(f"label must be one of {self.labels[1:]}, got {label!r}")
        a, b = self.runs[0], self.runs[self.labels.index(label)]
        pairs = _pairs(a, b)
        steps, ia, ib = np.intersect1d(a.steps, b.steps, return_indices=True)
        va = a.metric(metric)[ia][:, [a.layer_index(x) for x, _ in pairs]].astype(np.float64)
        vb = b.metric(metric)[ib][:, [b.layer_index(y) for _, y in pairs]].astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.log10(np.where((va > 0) & (vb > 0), vb / va, np.nan))
        r = np.where(np.isfinite(r), r, np.nan)
        return pd.DataFrame(r, index=pd.Index(steps, name="step"), columns=[x for x, _ in pairs])

    def summary_text(self) -> str:
        head = " vs ".join(
            f"{lab} ({r.n_layers} layers, {r.n_steps} steps, {rep.overall_health})"
            for lab, r, rep in zip(self.labels, self.runs, self.reports)
        )
        return "\n".join([f"Comparison: {head}"] + [f"- {v}" for v in self.verdict])

    def __repr__(self) -> str:
        return f"<Comparison {' vs '.join(self.labels)}: {len(self.verdict)} findings>"


def _pairs(a: Run, b: Run) -> list[tuple[str, str]]:
    common, renamed, _, _ = match_layers(a, b)
    return [(n, n) for n in common] + renamed


def _cause_changes(labels: list[str], reports: list) -> list[CauseChange]:
    """Per cause found in any run: where it is, and whether the later runs gained or lost it."""
    first = {r.cause: r for r in reports[0].diagnoses}
    out = []
    for lab, rep in zip(labels[1:], reports[1:]):
        later = {r.cause: r for r in rep.diagnoses}
        for cause in list(first) + [c for c in later if c not in first]:
            a, b = first.get(cause), later.get(cause)
            status = "persisted" if a and b else "disappeared" if a else "appeared"
            pr = {k: r.priority for k, r in ((labels[0], a), (lab, b)) if r is not None}
            ly = {k: list(r.layers) for k, r in ((labels[0], a), (lab, b)) if r is not None}
            fs = {k: r.first_step for k, r in ((labels[0], a), (lab, b)) if r is not None}
            out.append(CauseChange(cause, status, pr, ly, fs))
    return out


def _span(names: list[str]) -> str:
    if not names:
        return "the whole run"
    return names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)} layers)"


def _fold(log_ratio: float) -> str:
    """A change as words: "340x lower", "12x higher"."""
    return f"{10 ** abs(log_ratio):,.3g}x {'higher' if log_ratio > 0 else 'lower'}"


def _verdict(labels, reports, changes, final, renamed, added, removed) -> list[str]:
    """The comparison in words: the diagnoses that went or came (Critical/High/Medium first), the
    layers whose gradient level moved most, and what could not be matched."""
    lines = []
    order = {"Critical": 0, "High": 1, "Medium": 2, "Low": 3}

    def rank(c: CauseChange) -> int:
        return min(order.get(p, 4) for p in c.priority.values())

    from .analysis.causes import CAUSE_TITLES

    for c in sorted(changes, key=rank):
        later = [k for k in c.priority if k != labels[0]]
        lab = later[0] if later else labels[0]
        title = CAUSE_TITLES.get(c.cause, c.cause.replace("_", " "))
        if c.status == "disappeared":
            lines.append(f"{lab}: {title}, found in {labels[0]}, is gone ({_span(c.layers[labels[0]])}).")
        elif c.status == "appeared":
            lines.append(
                f"{lab}: new, {title} ({c.priority[lab]}) since step {c.first_step[lab]}: {_span(c.layers[lab])}."
            )
        elif rank(c) < 3:
            lines.append(
                f"{lab}: still {title} ({c.priority[labels[0]]} in {labels[0]}, {c.priority[lab]} now; "
                f"{_span(c.layers[lab])})."
            )
    if not final.empty:
        g = final[final.metric == "grad_norm"].dropna(subset=["log_ratio"])
        moved = g[g.log_ratio.abs() >= CHANGE_DECADES].sort_values("log_ratio", key=np.abs, ascending=False)
        for lab, grp in moved.groupby("label", sort=False):
            top = grp.head(3)
            shown = ", ".join(f"{r.layer} {_fold(r.log_ratio)}" for r in top.itertuples())
            lines.append(
                f"{lab}: the final gradient norm changed more than {10**CHANGE_DECADES:.2g}-fold from {labels[0]} in "
                f"{len(grp)} layer{'s' * (len(grp) != 1)} ({shown})."
            )
    for lab in labels[1:]:
        if renamed.get(lab):
            lines.append(
                f"{lab}: {len(renamed[lab])} layers matched by shape under new names "
                f"(e.g. {renamed[lab][0][0]} -> {renamed[lab][0][1]})."
            )
        if removed.get(lab):
            lines.append(
                f"{lab}: {len(removed[lab])} layers of {labels[0]} are missing: {', '.join(removed[lab][:6])}"
                + (" …" if len(removed[lab]) > 6 else "")
                + "."
            )
        if added.get(lab):
            lines.append(
                f"{lab}: {len(added[lab])} layers are new: {', '.join(added[lab][:6])}"
                + (" …" if len(added[lab]) > 6 else "")
                + "."
            )
    if not lines:
        lines.append(
            "No change: the same diagnoses, and no layer's final gradient level changed more than "
            f"{10**CHANGE_DECADES:.2g}-fold."
        )
    return lines


def compare(*runs, labels=None) -> Comparison:
    """Compare two or more runs (Runs or run directories), the first as the reference: layers
    matched by name (renamed, added and removed ones listed), steps aligned by step number, per
    layer and metric the log10 ratio to the first run at the end (``final``, over the last steps
    they share) and over time (``log_ratio``), which diagnoses appeared, disappeared or persisted,
    and a plain-language verdict. Runs of different lengths, rolling windows (the folded history is
    used) or histogram schedules compare as they are."""
    if len(runs) == 1 and isinstance(runs[0], (list, tuple)):
        runs = tuple(runs[0])
    if len(runs) < 2:
        raise ValueError("compare() needs at least two runs (the first is the reference)")
    labs = _labels(list(runs), labels)
    rs = [_as_run(r).with_history() for r in runs]
    for lab, r in zip(labs, rs):
        if r.n_layers == 0:
            raise ValueError(f"{lab} has no layers: there is nothing to compare")
    from .analysis import analyze

    reports: list[Any] = [analyze(r) if r.n_steps else None for r in rs]
    for lab, rep in zip(labs, reports):
        if rep is None:
            raise ValueError(f"{lab} has no recorded steps: there is nothing to compare")
    a = rs[0]
    rows, renamed, added, removed = [], {}, {}, {}
    for lab, b in zip(labs[1:], rs[1:]):
        common, ren, only_a, only_b = match_layers(a, b)
        renamed[lab], added[lab], removed[lab] = ren, only_b, only_a
        last = int(min(a.steps[-1], b.steps[-1]))
        pairs = [(n, n) for n in common] + ren
        ca = [a.layer_index(x) for x, _ in pairs]
        cb = [b.layer_index(y) for _, y in pairs]
        for metric in RATIO_METRICS:
            fa, fb = _final_levels(a, ca, metric, last), _final_levels(b, cb, metric, last)
            with np.errstate(invalid="ignore", divide="ignore"):
                lr = np.log10(fb / fa)
            for (x, y), va, vb, r in zip(pairs, fa, fb, lr):
                rows.append((lab, x, y, metric, va, vb, r if np.isfinite(r) else np.nan))
    final = pd.DataFrame(rows, columns=["label", "layer", "layer_in_run", "metric", "first", "later", "log_ratio"])
    table = pd.DataFrame({"layer": a.layer_names, f"health ({labs[0]})": reports[0].layers["health"].to_numpy()})
    for lab, b, rep in zip(labs[1:], rs[1:], reports[1:]):
        name_in_b = dict(_pairs(a, b))
        h = dict(zip(b.layer_names, rep.layers["health"]))
        table[f"health ({lab})"] = [h.get(name_in_b.get(n, ""), "missing") for n in a.layer_names]
        g = final[(final.label == lab) & (final.metric == "grad_norm")].set_index("layer")["log_ratio"]
        table[f"log10 grad_norm ratio ({lab})"] = [g.get(n, np.nan) for n in a.layer_names]
    extra = [n for lab in labs[1:] for n in added[lab]]
    if extra:  # layers only a later run has: listed, never dropped
        more = pd.DataFrame({"layer": list(dict.fromkeys(extra)), f"health ({labs[0]})": "missing"})
        for lab, b, rep in zip(labs[1:], rs[1:], reports[1:]):
            h = dict(zip(b.layer_names, rep.layers["health"]))
            more[f"health ({lab})"] = [h.get(n, "missing") for n in more["layer"]]
        table = pd.concat([table, more], ignore_index=True)
    changes = _cause_changes(labs, reports)
    return Comparison(
        labs,
        rs,
        reports,
        table,
        final,
        changes,
        renamed,
        added,
        removed,
        _verdict(labs, reports, changes, final, renamed, added, removed),
    )


__all__ = ["compare", "Comparison", "CauseChange", "match_layers", "RATIO_METRICS", "METRICS"]
