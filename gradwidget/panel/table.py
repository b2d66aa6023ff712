"""The health table's rows and the top diagnoses, as JSON for the page (sanitised by ``gradwidget.jsonsafe``).

Grades come from the analysis engine alone (``report.layers["health"]``, made by
``analysis.causes.layer_verdicts``); when the analysis fails, ``table_from_run`` shows the run's
statistics ungraded.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .._warnings import GradwidgetWarning
from ..jsonsafe import jsonable
from ..run import Run
from .protocol import HEALTH_RANK, MAX_DIAGNOSES, TABLE_KEYS
from .rows import Rows


def changed_rows(old: list[dict], new: list[dict]) -> list[int] | None:
    """Positions of the rows of ``new`` that differ from ``old`` (the same layers in the same
    order); None when the rows cannot be matched (send them all)."""
    if not old or len(old) != len(new) or any(a.get("index") != b.get("index") for a, b in zip(old, new)):
        return None
    return [i for i, (a, b) in enumerate(zip(old, new)) if a != b]


def _shown(v: Any) -> Any:
    """A table number to 4 significant digits (the page shows 3): rows whose numbers did not
    change as they read stay equal, so only changed rows travel."""
    return float(f"{v:.4g}") if isinstance(v, float) else v


def table_from_report(report, run: Run) -> list[dict]:
    """Rows of the health table from an analysis Report's per-layer DataFrame. A row's
    ``suggestion`` is the action of the top diagnosis naming its layer, as the diagnosis words it
    (no layer name in front: the page shows it once for the rows of one diagnosis), and
    ``diagnosis`` that diagnosis' rank (0: the top one), which the page groups a health's rows by."""
    top: dict[str, tuple[int, str]] = {}
    for rank, d in enumerate(getattr(report, "diagnoses", []) or []):
        for n in getattr(d, "layers", None) or []:
            top.setdefault(str(n), (rank, str(d.action)))
    rows = []
    for i, rec in enumerate(report.layers.to_dict("records")):
        name = rec.get("layer")
        try:
            idx = run.layer_index(name) if name is not None else i
        except KeyError:
            idx = i
        row = {k: _shown(jsonable(v)) for k, v in rec.items() if k in TABLE_KEYS}
        row["index"] = int(idx)
        row["layer"] = str(name if name is not None else run.layers[idx].name)
        if row["layer"] in top:
            row["diagnosis"], row["suggestion"] = top[row["layer"]]
        rows.append(row)
    return rows


def _num(rows: list[dict], key: str) -> np.ndarray:
    """A numeric column of table rows (``jsonable``'s 'Infinity' strings back to numbers; NaN: none)."""

    def one(v):
        return float(v) if isinstance(v, (int, float)) or v in ("Infinity", "-Infinity") else np.nan

    return np.array([one(r.get(key)) for r in rows], np.float64)


def _flags(v) -> list[str]:
    """A row's flags: the analysis writes them as one comma-separated string, the fallback as a list."""
    return [f.strip() for f in v.split(",") if f.strip()] if isinstance(v, str) else list(v or [])


def group_row(members: list[dict], label: str, start: int, numel: np.ndarray) -> dict:
    """One health row for a group of layers' rows (``members``, depth order), each statistic
    combined as the heatmap merges its metric (``rules.merge_of``): the members' median norms in
    quadrature, median mean |g| and mean zero fraction weighted by size, the largest max |g|, the
    non-finite entries summed; the worst member's health (Unknown only when every member's is),
    the union of their flags, and how many members have the worst health, with the worst one's
    suggestion."""
    from ..rules import merge_layers_at

    known = [r for r in members if r.get("health") != "Unknown"] or members
    worst = max(known, key=lambda r: HEALTH_RANK.get(str(r.get("health")), 1))
    health = str(worst.get("health", "Unknown"))
    flags = ", ".join(sorted({f for r in members for f in _flags(r.get("flags"))}))
    n_bad = sum(r.get("health") == health for r in members)
    stats = {}
    for key, metric in (
        ("grad_norm_median", "grad_norm"),
        ("mean_abs_median", "mean_abs"),
        ("max_abs_max", "max_abs"),
        ("zero_frac_mean", "zero_frac"),
        ("nonfinite_total", "nonfinite"),
    ):
        stats[key] = _shown(
            jsonable(merge_layers_at(_num(members, key)[None, :], metric, np.zeros(1, np.intp), numel)[0, 0])
        )
    suggestion = ""
    if HEALTH_RANK.get(health, 1) > HEALTH_RANK["Unknown"]:  # a member needs attention
        said = str(worst.get("suggestion") or "")
        suggestion = f"{n_bad} of {len(members)} tensors {health}; {said}".rstrip("; ")
    return {
        "index": int(start),
        "layer": label,
        "module_type": f"{len(members)} tensors",
        "numel": int(numel.sum()),
        "status": "trainable" if any(r.get("status") != "frozen" for r in members) else "frozen",
        "health": health,
        "flags": flags,
        **stats,
        "trend": worst.get("trend", ""),
        "suggestion": suggestion,
        **({"diagnosis": worst["diagnosis"]} if "diagnosis" in worst else {}),
        "count": len(members),
    }


def group_rows(layer_rows: list[dict], rows: Rows | None, run: Run) -> list[dict]:
    """The health table on the panel's rows: the layers' own rows, or past the cap one row per
    row of ``rows`` (a group's: ``group_row``), each marked with the expanded group it is shown in."""
    if rows is None or not layer_rows:
        return layer_rows
    by_index = {r["index"]: r for r in layer_rows}
    numel = rows.numel
    out = []
    for a, n, label, parent in zip(rows.starts.tolist(), rows.counts.tolist(), rows.labels, rows.parents):
        if n == 1:
            row = dict(by_index.get(a) or {"index": a, "layer": run.layers[a].name, "health": "Unknown"})
        else:
            members = [by_index[i] for i in range(a, a + n) if i in by_index]
            if not members:
                continue
            row = group_row(members, label, a, numel[a : a + n])
        row["parent"] = list(parent) if parent else None
        out.append(row)
    out.sort(key=lambda r: -HEALTH_RANK.get(str(r.get("health")), 1))  # worst first, then depth order
    return out


def diagnoses_from_report(report, run: Run) -> list[dict]:
    """The top diagnoses (at most MAX_DIAGNOSES, the report's order): what the panel lists above
    the heatmap and the static panel prints. ``cause`` and ``first_step`` are read where the
    analysis provides them. The one place the panel and its static rendition read the analysis'
    diagnoses: a change of the analysis' types is adapted here."""
    out = []
    for rec in list(getattr(report, "diagnoses", []) or [])[:MAX_DIAGNOSES]:
        layers = [str(n) for n in (getattr(rec, "layers", None) or [])]
        index = -1
        for name in layers:
            try:
                index = run.layer_index(name)
                break
            except KeyError:
                continue
        first = getattr(rec, "first_step", None)
        out.append(
            {
                "cause": str(rec.cause),
                "title": str(getattr(rec, "title", "") or rec.cause).strip(),
                "priority": str(rec.priority),
                "text": str(rec.text),
                "action": str(rec.action),
                "evidence": str(getattr(rec, "evidence", "") or ""),
                "layers": layers[:20],
                "n_layers": len(layers),
                "layer_index": int(index),
                "first_step": None if first is None else int(first),
            }
        )
    return out


#: the health of every row when the analysis failed: grades come from the analysis engine alone
#: (``analysis.causes.layer_verdicts``), so without it a layer is not graded at all
UNGRADED = "Unknown"
#: what an ungraded row says in its suggestion cell
UNGRADED_NOTE = "not graded: the analysis failed (see the warning)"


def table_from_run(run: Run) -> list[dict]:
    """Rows straight from the run, for when the analysis fails: medians/maxima over steps, the
    marks the Run's flag rules put on any step (``gradwidget.rules``), and no grade (``UNGRADED``):
    a second set of cut-offs here would grade layers differently from every other output."""
    n = run.n_steps
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        gn = np.nanmedian(run.metric("grad_norm"), axis=0) if n else np.full(run.n_layers, np.nan)
        ma = np.nanmedian(run.metric("mean_abs"), axis=0) if n else np.full(run.n_layers, np.nan)
        mx = np.nanmax(run.metric("max_abs"), axis=0) if n else np.full(run.n_layers, np.nan)
        zf = np.nanmean(run.metric("zero_frac"), axis=0) if n else np.full(run.n_layers, np.nan)
        nf = np.nansum(run.metric("nonfinite"), axis=0) if n else np.zeros(run.n_layers)
    # the steps the Run's flag rules mark, per layer (names as the page's filter reads them)
    marked: dict[str, np.ndarray] = (
        {
            k: np.asarray(m.any(axis=0))
            for k, m in (("nonfinite", run.nonfinite()), ("exploding", run.exploding()), ("vanishing", run.vanishing()))
        }
        if n
        else {}
    )
    rows = []
    for j, info in enumerate(run.layers):
        rows.append(
            {
                "index": j,
                "layer": info.name,
                "module_type": info.module_type,
                "numel": int(info.numel),
                "status": info.status,
                "health": UNGRADED,
                "grad_norm_median": jsonable(gn[j]),
                "mean_abs_median": jsonable(ma[j]),
                "max_abs_max": jsonable(mx[j]),
                "zero_frac_mean": jsonable(zf[j]),
                "nonfinite_total": jsonable(nf[j]),
                "flags": ", ".join(k for k, m in marked.items() if m[j]),
                "suggestion": UNGRADED_NOTE,
            }
        )
    return rows


def verdict_line(diagnoses: list[dict], n_steps: int, reading: str = "") -> str:
    """The analysis in one line, always shown above the heatmap (``analysis.report.verdict_line``,
    which the report's summary says too), with how many more diagnoses follow and what the loss
    was read as (``reading``: ``Task.reading``, "" when no loss was logged)."""
    from ..analysis.report import verdict_line as line

    read = f" · the loss read as {reading}" if reading else ""
    if not diagnoses:
        return line(None, "", None, None, n_steps) + read
    d = diagnoses[0]
    more = f" (+{len(diagnoses) - 1} more below)" if len(diagnoses) > 1 else ""
    return (
        line(d["priority"], d["title"], d["layers"][0] if d["layers"] else None, d["first_step"], n_steps) + more + read
    )


def analyse(run: Run) -> tuple[Any, list[dict], list[dict]]:
    """(report, table rows, diagnoses) of ``run``; on an analysis failure, (None, the fallback
    rows, []) with a warning: an analysis bug must not take the panel down."""
    if run.n_layers == 0:
        return None, [], []
    try:
        from ..analysis import analyze

        report = analyze(run)
        return report, table_from_report(report, run), diagnoses_from_report(report, run)
    except Exception as e:
        warnings.warn(f"gradwidget: analysing the run failed ({e!r}); showing basic statistics", GradwidgetWarning)
        return None, table_from_run(run), []
