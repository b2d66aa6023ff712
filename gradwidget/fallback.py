"""What a notebook shows where no widget runs: ``health_table_html(report)``, the table the panel's
static fallback and the HTML report both show, and the image + table bundle beside the widget view.

Plain HTML with inline styles only (no ``<style>`` sheet, no scripts, no external resources), so it
survives notebook sanitisers, nbconvert, and being pasted anywhere.
"""

from __future__ import annotations

import html


from ._look import HEALTH_COLORS, HEALTH_COLUMNS, HEALTH_NOTES, format_cell
from .outputs import to_ascii
from .run import Run

#: marker class on every element gradwidget emits into notebook outputs (the exporter looks for it).
FALLBACK_CLASS = "gradwidget-static"

_TD = "padding:2px 8px;border-bottom:1px solid #e3e3e3;text-align:left;vertical-align:top;"
_TH = "padding:3px 8px;border-bottom:2px solid #bbb;text-align:left;background:#f4f4f4;"


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _as_report(obj):
    """A Report from a Report, a Run, or anything with ``.run`` (Recorder, GradientPanel)."""
    if hasattr(obj, "layers") and hasattr(getattr(obj, "layers"), "columns"):
        return obj
    run = obj if isinstance(obj, Run) else getattr(obj, "run", None)
    if isinstance(run, Run):
        from .analysis import analyze

        return analyze(run)
    raise TypeError(f"expected an analysis Report (gradwidget.analyze(run)) or a Run, got {type(obj).__name__}")


#: the columns a reader decides with, in the static panel's compact table (it fits ~800 px)
COMPACT_COLUMNS = ("health", "layer", "grad_norm_median", "trend", "flags")


def health_table_html(report, max_rows: int = 200, suggestions: bool = True, compact: bool = False) -> str:
    """The per-layer health table as an HTML ``<table>`` with inline styles.

    Rows are layers in depth order; the health cell is coloured and spelled out (readable without
    colour). ``report`` is an analysis Report (a Run is analysed first). ``compact``: the columns a
    reader decides with (``COMPACT_COLUMNS`` and the suggestion), names and suggestions wrapped, so
    that it fits a notebook column.
    """
    report = _as_report(report)
    df = report.layers
    cols = [c for c in HEALTH_COLUMNS if c[0] in df.columns]
    if compact:
        by = {c[0]: c for c in cols}
        cols = [by[k] for k in COMPACT_COLUMNS if k in by]
    if suggestions and "suggestion" in df.columns:
        cols.append(("suggestion", "suggestion", "{}"))
    head = "".join(f'<th style="{_TH}">{_esc(h)}</th>' for _, h, _ in cols)
    body = []
    for _, row in df.head(max_rows).iterrows():
        tds = []
        for c, _, fmt in cols:
            text = format_cell(row[c], fmt)
            style = _TD
            title = ""
            if c == "health":
                color = HEALTH_COLORS.get(str(row[c]), HEALTH_COLORS["Unknown"])
                style += f"background:{color};color:#fff;font-weight:bold;"
                note = HEALTH_NOTES.get(str(row[c]))
                title = f' title="{_esc(note)}"' if note else ""  # why a state that is no grade is normal
            elif c == "layer":
                style += "font-family:monospace;" + ("min-width:9em;" if compact else "white-space:nowrap;")
            elif c == "suggestion" and compact:
                style += "min-width:220px;"
            elif fmt != "{}":
                style += "text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;"
            cell = _esc(text).replace(".", ".<wbr>") if compact and c == "layer" else _esc(text)  # breaks at dots
            tds.append(f'<td style="{style}"{title}>{cell}</td>')
        layer = _esc(row["layer"]) if "layer" in df.columns else ""
        body.append(f'<tr data-layer="{layer}">{"".join(tds)}</tr>')
    more = ""
    if len(df) > max_rows:
        more = (
            f'<caption style="caption-side:bottom;font-size:11px;color:#666;text-align:left">'
            f"first {max_rows} of {len(df)} layers</caption>"
        )
    overall = getattr(report, "overall_health", None)
    title = ""
    if overall is not None:
        title = (
            f'<caption style="caption-side:top;text-align:left;font-weight:bold;padding:4px 0">'
            f"Layer health — overall: {_esc(_enum_text(overall))}</caption>"
        )
    return (
        f'<table class="gradwidget-health" style="border-collapse:collapse;font-size:12px;'
        f"font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;color:#222;"
        f'background:#fff">{title}{more}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _enum_text(x) -> str:
    v = getattr(x, "value", x)
    return str(v)


def static_fallback_html(png: bytes | None, table_html: str = "", alt: str = "gradwidget panel") -> str:
    """The HTML a GradientPanel output carries for places where no widget runs: the panel image
    (embedded as a data URI) above the health table, inside one ``div.gradwidget-static``."""
    import base64

    img = ""
    if png:
        uri = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        img = f'<img class="gradwidget-panel-image" alt="{_esc(alt)}" src="{uri}" style="max-width:100%"/>'
    return f'<div class="{FALLBACK_CLASS}">{img}{table_html}</div>'


def static_mimebundle(run, step=None, layer=None, metric: str = "grad_norm", report=None, dpi: int = 80) -> dict:
    """``{'image/png': b64, 'text/html': img + health table, 'text/plain': ASCII heatmap}`` for a
    run's current view: what ``GradientPanel._repr_mimebundle_`` adds beside the widget view.
    ``text/html`` holds the image too, because an exporter without widget state shows only one of
    the other mime types; ``text/plain`` is what CI logs and terminals print."""
    import base64

    if run is None or (not isinstance(run, Run) and getattr(run, "run", 0) is None):
        note = '<p style="font-family:sans-serif;color:#666">GradientPanel: no step recorded yet</p>'
        return {"text/html": f'<div class="{FALLBACK_CLASS}">{note}</div>'}
    from . import plots  # the static figure (matplotlib), drawn only where one is asked for

    run = plots.check_run(run)
    fig = plots.panel_figure(run, step=step, layer=layer, metric=metric)
    png = plots.figure_to_png(fig, dpi=dpi)
    table = ""
    if run.n_steps and run.n_layers:  # a run without layers has nothing to analyse: the image alone
        table = health_table_html(report if report is not None else run, suggestions=False)
    return {
        "image/png": base64.b64encode(png).decode("ascii"),
        "text/html": static_fallback_html(png, table),
        "text/plain": to_ascii(run, width=60),
    }
