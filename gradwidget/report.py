"""The HTML report: renders a ``Report`` (``gradwidget.analysis.report``, which computes and writes
nothing) as the self-contained report page, and a comparison of runs as another; this module writes
the files. The health table and the static fallback it shares with the panel live in ``fallback.py``
(re-exported here).

``write_report(report, path)`` writes one HTML file that opens with the network off: figures are
PNGs embedded as ``data:`` URIs, styles are inline in the document, nothing is fetched.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import numpy as np

from . import plots
from .fallback import (
    FALLBACK_CLASS,
    _as_report,
    _enum_text,
    _esc,
    health_table_html,
    static_fallback_html,
    static_mimebundle,
)
from .analysis.noise_scale import interval_text, no_estimate_note
from .run import Run

__all__ = [
    "FALLBACK_CLASS",
    "health_table_html",
    "main_report",
    "render_comparison",
    "render_report",
    "static_fallback_html",
    "static_mimebundle",
    "worst_layers",
    "write_comparison",
    "write_report",
]


# --------------------------------------------------------------------------- the full report
_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
main{max-width:1180px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 6px}
.meta{color:#666;font-size:13px}
.badge{display:inline-block;padding:2px 10px;border-radius:10px;color:#fff;font-weight:bold;font-size:13px}
.card{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 16px;margin:10px 0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:12px}
img.fig{max-width:100%;height:auto;display:block}
ol.recs li{margin:6px 0}
.ev{font-size:12px;color:#555;margin-top:2px}
.prio{font-size:11px;color:#fff;background:#555;border-radius:3px;padding:0 5px;margin-right:6px}
pre.summary{white-space:pre-wrap;font-size:13px;background:#fff;border:1px solid #e3e3e3;padding:10px;border-radius:6px}
.summary p.verdict{font-size:15px} details.more{font-size:13px;color:#444} details.more summary{cursor:pointer}
table.kv td{padding:1px 10px 1px 0;font-size:12px}
.scroll{overflow-x:auto}
"""


def _img(fig, alt: str, dpi: int = 90) -> str:
    return f'<img class="fig" alt="{_esc(alt)}" src="{plots.figure_to_data_uri(fig, dpi)}"/>'


def _rec_text(rec: Any) -> tuple[str, str]:
    """(priority label, text) of one recommendation, whatever its shape (dataclass, dict, str)."""
    if isinstance(rec, str):
        return "", rec
    d = (
        rec
        if isinstance(rec, dict)
        else (
            rec.to_dict() if hasattr(rec, "to_dict") else vars(rec) if hasattr(rec, "__dict__") else {"text": str(rec)}
        )
    )
    prio = d.get("priority", d.get("severity", d.get("level", "")))
    parts = []
    for key in ("title", "issue", "problem", "message", "text", "description"):
        if d.get(key):
            parts.append(str(d[key]))
            break
    for key in ("action", "suggestion", "recommendation", "fix"):
        if d.get(key):
            parts.append(str(d[key]))
            break
    layers = d.get("layers") or d.get("affected_layers")
    if layers and not any(str(x) in " ".join(parts) for x in layers):
        ls = list(layers) if not isinstance(layers, str) else [layers]
        parts.append("Layers: " + ", ".join(map(str, ls[:8])) + (" …" if len(ls) > 8 else ""))
    if not parts:
        parts = [str(rec)]
    return _enum_text(prio) if prio not in (None, "") else "", " — ".join(parts)


def _recommendations_html(report) -> str:
    recs = getattr(report, "diagnoses", None)
    if recs is None:
        return "<p>No recommendations.</p>"
    if hasattr(recs, "iterrows"):
        recs = [r.to_dict() for _, r in recs.iterrows()]
    recs = list(recs)
    if not recs:
        return "<p>No recommendations: nothing to fix.</p>"
    items = []
    for r in recs:
        prio, text = _rec_text(r)
        tag = f'<span class="prio">{_esc(prio)}</span>' if prio else ""
        ev = getattr(r, "evidence", "") or ""
        folded = getattr(r, "explains", None) or []
        detail = (f'<div class="ev">Evidence: {_esc(ev)}</div>' if ev else "") + (
            f'<div class="ev">Also explains: {_esc("; ".join(folded))}</div>' if folded else ""
        )
        items.append(f"<li>{tag}{_esc(text)}{detail}</li>")
    return f'<ol class="recs">{"".join(items)}</ol>'


def _summary_html(report) -> str:
    """The summary in plain words (``Report.summary_parts``): the verdict in bold, how the layers
    are graded, the diagnoses as a numbered list, and the further analyses (stability, outlook,
    critical path, notes) behind a disclosure."""
    if not hasattr(report, "summary_parts"):
        return ""
    s = report.summary_parts()
    return (
        '<div class="card summary">'
        f'<p class="verdict"><strong>{_esc(s.verdict)}</strong> {_esc(s.graded)}</p>'
        + (f'<ol class="recs">{"".join(f"<li>{_esc(t)}</li>" for t in s.diagnoses)}</ol>' if s.diagnoses else "")
        + (f"<p>{_esc(s.progress)}</p>" if s.progress else "")
        + (
            '<details class="more"><summary>More analyses: stability, outlook, critical path</summary>'
            f"<ul>{''.join(f'<li>{_esc(t)}</li>' for t in s.more)}</ul></details>"
            if s.more
            else ""
        )
        + "</div>"
    )


def worst_layers(report, k: int = 4) -> list[str]:
    """Names of up to ``k`` layers in most need of attention: the layers the ranked diagnoses name
    (Critical, High and Medium ones, in rank order), none for a healthy run."""
    out: list[str] = []
    for r in getattr(report, "diagnoses", None) or []:
        if r.priority == "Low":
            continue
        out.extend(n for n in r.layers if n not in out)
    return out[:k]


def _frame_html(frame) -> str:
    return '<div class="scroll">' + frame.to_html(index=False, border=0, float_format=lambda v: f"{v:.3g}") + "</div>"


def _kv_html(obj, caption: str = "") -> str:
    """A small two-column table of a result object's fields (dataclass, dict or plain object)."""
    import dataclasses

    if dataclasses.is_dataclass(obj):
        d = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    else:
        d = obj if isinstance(obj, dict) else vars(obj)
    rows = []
    for k, v in d.items():
        if isinstance(v, float):
            text = f"{v:.3g}"
        elif isinstance(v, (list, tuple)):
            text = ", ".join(map(str, v[:12])) + (" …" if len(v) > 12 else "") if v else "none"
        else:
            text = _short(v)
        rows.append(f"<tr><td>{_esc(k.replace('_', ' '))}</td><td>{_esc(text)}</td></tr>")
    cap = f"<h3>{_esc(caption)}</h3>" if caption else ""
    return f'{cap}<table class="kv">{"".join(rows)}</table>'


def _weights_html(report, run: Run) -> str:
    """Weight statistics when the analysis had the weights, the update/weight drift read from the
    run, and the per-layer update/weight ratio (or weight norm) over steps."""
    parts = []
    w = getattr(report, "weights", None)
    if w is not None:
        if callable(getattr(w, "summary_text", None)):
            parts.append(f'<pre class="summary">{_esc(w.summary_text())}</pre>')
        if hasattr(getattr(w, "layers", None), "to_html"):
            parts.append(_frame_html(w.layers))
    drift = getattr(report, "weight_drift", None)
    if drift is not None:  # an empty "affected layers" line says nothing on a healthy run
        parts.append(
            _kv_html(
                {k: v for k, v in vars(drift).items() if not (k == "affected_layers" and not v)},
                "Update / weight drift",
            )
        )
    if run.n_steps and np.isfinite(run.metric("weight_norm")).any():
        idx = [run.layer_index(n) for n in worst_layers(report, 6)] or list(range(min(6, run.n_layers)))
        parts.append(_img(plots.weight_plot(run, layers=idx), "weight health"))
    return "".join(parts) or "<p>No weight statistics recorded.</p>"


def _origin_html(origin) -> str:
    """The non-finite origin: its sentence, then module, step, pass and what was seen."""
    reached = origin.params_reached
    rows = [
        ("module", f"{origin.where} ({origin.module_type})"),
        ("step", origin.step),
        ("phase", origin.phase),
        ("call of the module in that step", origin.call + 1),
        ("inputs finite" if origin.phase != "backward" else "gradient received finite", origin.inputs_finite),
        ("output finite" if origin.phase != "backward" else "gradient passed on finite", origin.output_finite),
        (
            "non-finite parameter gradients at that step",
            "not recorded"
            if reached is None
            else f"{len(reached)}"
            + (f": {', '.join(reached[:6])}" + (" …" if len(reached) > 6 else "") if reached else ""),
        ),
    ]
    if origin.rank is not None:
        rows.append(("rank", origin.rank))
    body = "".join(f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in rows)
    return f'<p>{_esc(origin.describe())}</p><table class="kv">{body}</table>'


def _noise_html(report) -> str:
    """The batch size against the gradient noise scale (a figure and its numbers), or why it is
    not measured; empty for a report without the field."""
    ns = getattr(report, "noise_scale", None)
    if ns is None:
        why = no_estimate_note(report.run)
        if not why:
            return ""
        return f'<h2 id="noise-scale">Batch size</h2><div class="card"><p>{_esc(why)}.</p></div>'
    groups = "".join(
        f"<tr><td>{_esc(k)}</td><td>{b:,.0f}</td><td>{interval_text(lo, hi)}</td></tr>"
        for k, (b, lo, hi) in ns.groups.items()
        if np.isfinite(b)
    )
    table = f'<table class="kv"><tr><td>module</td><td>B_simple</td><td>95% interval</td></tr>{groups}</table>'
    return (
        '<h2 id="noise-scale">Batch size and the gradient noise scale</h2><div class="card">'
        f"<p>{_esc(ns.text()[:1].upper() + ns.text()[1:])}.</p>"
        + _img(plots.noise_scale_plot(ns), "gradient noise scale over steps")
        + (table if groups else "")
        + "</div>"
    )


def _short(v, n: int = 200) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 1] + "…"


def render_report(report, title: str | None = None) -> str:
    """The report as one HTML string (see ``write_report``)."""
    report = _as_report(report)
    run: Run = report.run
    overall = _enum_text(getattr(report, "overall_health", "Unknown"))
    color = {
        "Healthy": "#2e7d32",
        "Warning": "#ef8f00",
        "Critical": "#c62828",
    }.get(overall, "#8a8a8a")
    span = f"steps {int(run.steps[0])}–{int(run.steps[-1])}" if run.n_steps else "no steps"
    title = title or str(run.meta.get("name") or "gradwidget report")
    created = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")

    sections = []
    sections.append(f'<h2 id="summary">Summary</h2>{_summary_html(report)}')
    origin = getattr(report, "nonfinite_origin", None)
    if origin is not None:
        sections.append(
            f'<h2 id="nonfinite-origin">Where the NaN started</h2><div class="card">{_origin_html(origin)}</div>'
        )
    sections.append(
        f'<h2 id="recommendations">Recommendations</h2><div class="card">{_recommendations_html(report)}</div>'
    )
    if run.n_steps:
        from .panel.rendition import run_rendition  # the static panel, as a notebook export shows it

        sections.append(
            '<h2 id="flow">Gradient flow</h2><div class="card">'
            + run_rendition(run, report, table=False)  # the full table follows
            + _img(plots.loss_plot(run), "loss")
            + "</div>"
        )
    sections.append(_noise_html(report))
    sections.append(f'<h2 id="health">Layer health</h2><div class="card scroll">{health_table_html(report)}</div>')
    worst = worst_layers(report, 4)
    if run.n_steps and worst:
        figs = []
        for name in worst:
            figs.append(
                '<div class="card">'
                + f"<h3>{_esc(name)}</h3>"
                + _img(plots.histogram_plot(run, name), f"histogram of {name}", dpi=80)
                + _img(plots.histogram_over_time(run, name), f"distribution over steps of {name}", dpi=80)
                + _img(plots.metric_series(run, [name], "mean_abs"), f"mean |g| of {name}", dpi=80)
                + _img(plots.metric_series(run, [name], "max_abs"), f"max |g| of {name}", dpi=80)
                + "</div>"
            )
        sections.append(
            '<h2 id="distributions">Distributions of the layers most in need of attention</h2>'
            f'<div class="grid">{"".join(figs)}</div>'
        )
    sections.append(f'<h2 id="weights">Weight health</h2><div class="card">{_weights_html(report, run)}</div>')
    t = run.thresholds.to_dict()
    rows = "".join(f"<tr><td>{_esc(k)}</td><td>{v:g}</td></tr>" for k, v in t.items())
    sections.append(f'<h2 id="thresholds">Thresholds</h2><div class="card"><table class="kv">{rows}</table></div>')

    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{_esc(title)}</h1>"
        f'<p class="meta"><span class="badge" style="background:{color}">{_esc(overall)}</span> '
        f"&nbsp;{run.n_layers} layers · {run.n_steps} recorded steps ({span}) · generated {created} "
        "by gradwidget</p>" + "".join(sections) + "</main></body></html>\n"
    )


def write_report(report, path, force: bool = False) -> Path:
    """Write the self-contained HTML report (summary, recommendations, heatmap, health table,
    distributions of the worst layers, weight health) to ``path`` (an existing file is replaced only
    with ``force``); return the path."""
    from .storage import atomic_output, check_output_file

    path = check_output_file(path, force)  # before the work: a folder, a run's own file, a file there
    text = render_report(report)
    with atomic_output(path, force, encoding="utf-8") as f:
        f.write(text)
    return path


def main_report(run_path, out_path, force: bool = False) -> Path:
    """``gradwidget report RUN -o OUT``: load a run directory, analyse it, write the report."""
    from .storage import load_run

    run = load_run(run_path)
    if run.n_steps == 0:
        raise ValueError(f"{run_path} holds no recorded steps yet; train for a few steps first")
    from .analysis import analyze

    return write_report(analyze(run), out_path, force)


def render_comparison(cmp, metric: str = "grad_norm") -> str:
    """The comparison as one self-contained HTML page: the verdict, the diagnoses side by side, each
    run's heatmap on one colour scale, each later run's difference map, and the layer table."""
    from .plots import difference_heatmap, flow_heatmap, shared_scale

    scale = shared_scale(cmp.runs, metric)  # one scale for all
    verdict = "".join(f"<li>{_esc(v)}</li>" for v in cmp.verdict)
    rows = "".join(
        f"<tr><td>{_esc(c.cause)}</td><td>{_esc(c.status)}</td>"
        + "".join(
            f"<td>{_esc(c.priority.get(lab, '—'))}"
            + (f" since step {c.first_step[lab]}" if lab in c.first_step else "")
            + "</td>"
            for lab in (cmp.labels[0], *[k for k in c.priority if k != cmp.labels[0]][:1])
        )
        + "</tr>"
        for c in cmp.causes
    )
    heads = "".join(f"<th>{_esc(x)}</th>" for x in ("cause", "change", cmp.labels[0], "later run"))
    figs = [
        _img(
            flow_heatmap(r, metric, scale=scale, title=f"{lab}: {metric} (log10, one scale for every run)"),
            f"gradient flow heatmap of {lab}",
        )
        for lab, r in zip(cmp.labels, cmp.runs)
    ]
    diffs = [
        _img(
            difference_heatmap(cmp.log_ratio(metric, lab), f"{lab} vs {cmp.labels[0]}: log10 ratio of {metric}"),
            f"difference map of {lab}",
        )
        for lab in cmp.labels[1:]
    ]
    sections = [
        f'<h2 id="verdict">Verdict</h2><div class="card"><ul>{verdict}</ul></div>',
        f'<h2 id="diagnoses">Diagnoses</h2><div class="card"><table class="kv"><tr>{heads}</tr>{rows}</table></div>',
        '<h2 id="heatmaps">Gradient flow</h2>' + "".join(f'<div class="card">{f}</div>' for f in figs),
        '<h2 id="difference">Difference</h2>' + "".join(f'<div class="card">{f}</div>' for f in diffs),
        f'<h2 id="layers">Layers</h2><div class="card">{_frame_html(cmp.layers)}</div>',
    ]
    title = "gradwidget comparison: " + " vs ".join(cmp.labels)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body><main>"
        f"<h1>{_esc(title)}</h1>" + "".join(sections) + "</main></body></html>\n"
    )


def write_comparison(cmp, path, force: bool = False) -> Path:
    """Write ``render_comparison`` to ``path`` (through a temporary file renamed into place); an
    existing file is replaced only with ``force``, a run's own file never."""
    from .storage import atomic_output, check_output_file

    out = check_output_file(path, force)  # before the work
    html = render_comparison(cmp)
    with atomic_output(out, force, encoding="utf-8") as f:
        f.write(html)
    return out
