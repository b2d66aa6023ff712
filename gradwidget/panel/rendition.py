"""The static panel: what a GradientPanel's output shows where no widget runs (an export without
widget state, ``--to gradwidget``, GitHub, the HTML report), the run as it ended.

One HTML block, inline styles only (no stylesheet, no script, nothing fetched): a title line; the
diagnoses, each whole (cause, where, since when, the action) with its evidence under a
``<details>``; an SVG with the heatmap image (``static.heat_png``, the page's colours, made in
milliseconds from the arrays the panel already sent) and, drawn around it as SVG text, every
layer's name (elided by ``_look.elide``, the full name in a ``<title>`` shown on hover), a step axis
on round numbers, the colour bar and the marks' legend; then the health table. Everything is
computed from its inputs alone, so the same run gives the same bytes whatever thread finished
first.
"""

from __future__ import annotations

import base64
import html
import math

import numpy as np

from .._look import elide
from .protocol import MARKS, METRIC_LABELS
from .static import heat_png, viridis

#: the SVG's width in px (a notebook column), the heatmap's height bounds, a row's most height.
WIDTH, MIN_HEAT_H, MAX_HEAT_H, ROW_MAX = 860, 120, 520, 16
#: smallest name font (px): rows at least this tall are all labelled (the page's MIN_LABEL_PX).
MIN_LABEL_PX = 8
#: characters of a layer name in the gutter.
NAME_CHARS = 30
_FONT = "system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif"
_MONO = "ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def fmt(v: float) -> str:
    """A number as the page prints it (js/src/colormap.ts ``fmt``)."""
    v = float(v)
    if v != v:
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0"
    if v.is_integer() and abs(v) < 1e9:
        return str(int(v))
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        m, e = f"{v:.2e}".split("e")
        return f"{m}e{int(e):+d}"
    return f"{float(f'{v:.3g}'):g}"


def nice_ticks(lo: float, hi: float, max_ticks: int) -> list[float]:
    """Round numbers (1, 2 or 5 times a power of ten) between ``lo`` and ``hi``, at most about
    ``max_ticks`` (js/src/ticks.ts ``niceTicks``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return []
    if hi == lo:
        return [lo]
    raw = (hi - lo) / max(2, int(max_ticks))
    p = 10.0 ** math.floor(math.log10(raw))
    step = next((k * p for k in (1, 2, 5, 10) if k * p >= raw), 10 * p)
    first = math.ceil(lo / step)
    return [round(k * step, 12) for k in range(first, int(math.floor(hi / step + 1e-9)) + 1)]


def col_position(col_steps: np.ndarray, step: float, last_step: float) -> float:
    """Fractional column of ``step`` (js/src/ticks.ts ``colPosition``); -1 before the first column."""
    C = len(col_steps)
    if not C or step < col_steps[0]:
        return -1.0
    c = int(np.searchsorted(col_steps, step, side="right")) - 1
    end = col_steps[c + 1] if c + 1 < C else last_step + 1
    frac = (step - col_steps[c]) / (end - col_steps[c]) if end > col_steps[c] else 0.0
    return min(c + frac, C - 0.5)


def _png_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def heatmap_html(meta: dict, heat: np.ndarray, flags: np.ndarray, col_steps: np.ndarray, cursor: int | None) -> str:
    """The heatmap image (an ``<img>``, sized to its rows) between SVG drawings of its layer names
    and its step axis, then the colour bar and the marks' legend."""
    rows, cols = heat.shape
    names = [str(r.get("name", i)) for i, r in enumerate(meta.get("layers") or [])][:rows]
    names += [str(i) for i in range(len(names), rows)]
    heat_h = float(np.clip(rows * ROW_MAX, MIN_HEAT_H, MAX_HEAT_H))
    row_h = heat_h / max(rows, 1)
    every = max(1, math.ceil(MIN_LABEL_PX / row_h - 1e-9))
    size = float(np.clip(row_h, MIN_LABEL_PX, 11))
    shown = [elide(n, NAME_CHARS) for n in names]
    gutter = round(min(230, 12 + 0.62 * size * max((len(s) for s in shown), default=4)))
    heat_w = WIDTH - gutter - 8
    metric = str(meta.get("metric", "mean_abs"))
    label = METRIC_LABELS.get(metric, metric)
    # every row a name where rows are tall enough (else every k-th), the full name on hover
    texts = "".join(
        f'<text x="{gutter - 4}" y="{(i + 0.5) * row_h:.1f}" font-size="{size:.1f}" font-family="{_MONO}" '
        f'fill="#444" text-anchor="end" dominant-baseline="central"><title>{_esc(names[i])}</title>'
        f"{_esc(shown[i])}</text>"
        for i in range(0, rows, every)
    )
    names_svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{gutter}" height="{heat_h:.0f}" '
        f'style="flex:none" aria-label="layer names">{texts}</svg>'
    )
    # the cells as the page colours them, stretched crisp over the area
    png = heat_png(heat, flags, tuple(meta.get("scale", (0.0, 1.0))), cursor)  # type: ignore[arg-type]
    img = (
        f'<img class="gradwidget-panel-image" alt="{_esc(label)} per layer (rows) and step (columns)" '
        f'src="{_png_uri(png)}" width="{heat_w}" height="{heat_h:.0f}" '
        f'style="display:block;width:{heat_w}px;height:{heat_h:.0f}px;image-rendering:pixelated"/>'
    )
    # step axis on round numbers
    ticks = []
    last = float(meta.get("last_step", col_steps[-1] if len(col_steps) else 0))
    block = int(meta.get("block", 1))
    if len(col_steps):
        for s in nice_ticks(float(col_steps[0]), last, max(2, int(heat_w // 90))):
            pos = col_position(col_steps, s, last)
            if pos < 0:
                continue
            x = ((pos + 0.5) if block <= 1 else pos) / cols * heat_w
            anchor = "start" if x < 20 else "end" if heat_w - x < 20 else "middle"
            ticks.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="4" stroke="#888"/>'
                f'<text x="{x:.1f}" y="15" font-size="10" fill="#555" text-anchor="{anchor}">{fmt(s)}</text>'
            )
        ticks.append(f'<text x="{heat_w}" y="28" font-size="10" fill="#555" text-anchor="end">step</text>')
    axis_svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="{heat_w}" height="32">{"".join(ticks)}</svg>'
    grid = (
        f'<div style="display:flex;align-items:flex-start;overflow-x:auto">{names_svg}'
        f'<div style="flex:none">{img}{axis_svg}</div></div>'
    )
    return grid + legend_svg(meta, label)


def legend_svg(meta: dict, label: str) -> str:
    """The colour bar (viridis over the run's one log scale) and the marks' colours."""
    lo, hi = (list(meta.get("scale", (0.0, 1.0))) + [0.0, 1.0])[:2]
    lut = viridis()
    out = [f'<text x="0" y="9" font-size="11" fill="#444">{_esc(label)}: {fmt(10**lo)}</text>']
    bx = 14 + 6.2 * (len(label) + 2 + len(fmt(10**lo)))
    # the bar as 35 cells of 4 px (a gradient would be a url() reference, which some pages refuse)
    for k in range(35):
        c = lut[round(k / 34 * 255)]
        out.append(f'<rect x="{bx + 4 * k:.1f}" y="0" width="4.2" height="10" fill="#{c[0]:02x}{c[1]:02x}{c[2]:02x}"/>')
    out.append(f'<rect x="{bx:.1f}" y="0" width="140" height="10" fill="none" stroke="#bbb"/>')
    out.append(
        f'<text x="{bx + 146:.1f}" y="9" font-size="11" fill="#444">{fmt(10**hi)} (log, one scale for all steps)</text>'
    )
    th = meta.get("thresholds") or {}
    marks = [
        ("vanishing", f"vanishing (mean|g| &lt; {fmt(th.get('vanishing', 1e-7))})"),
        ("exploding", f"exploding (max|g| &gt; {fmt(th.get('exploding', 1e3))})"),
        ("nonfinite", "NaN / Inf"),
        ("nodata", "no gradient"),
    ]
    x = 0.0
    for key, text in marks:
        out.append(f'<rect x="{x:.1f}" y="18" width="10" height="10" fill="{MARKS[key]}" stroke="#999"/>')
        out.append(f'<text x="{x + 14:.1f}" y="27" font-size="11" fill="#444">{text}</text>')
        x += 30 + 6.0 * len(html.unescape(text))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="34" font-family="{_FONT}" '
        f'style="max-width:100%;display:block;margin:2px 0 8px" aria-label="colour scale and marks">'
        + "".join(out)
        + "</svg>"
    )


def diagnoses_html(diagnoses: list[dict]) -> str:
    """Each diagnosis whole: cause · where · since step N, the action, the evidence under a click."""
    if not diagnoses:
        return ""
    items = []
    for d in diagnoses:
        names = list(d.get("layers") or [])
        n = int(d.get("n_layers", len(names)))
        where = ", ".join(names[:3]) + (f" and {n - 3} more" if n > 3 else "")
        head = [str(d.get("cause", "")).replace("_", " ")]
        if where:
            head.append(where)
        if d.get("first_step") is not None:
            head.append(f"since step {d['first_step']}")
        colour = {"critical": "#c62828", "low": "#bbb"}.get(str(d.get("priority", "")).lower(), "#ef8f00")
        evidence = "\n".join(x for x in (str(d.get("text") or ""), str(d.get("evidence") or "")) if x.strip())
        details = (
            f'<details style="font-size:11px;color:#555"><summary>evidence</summary>'
            f'<div style="white-space:pre-wrap;padding-left:12px">{_esc(evidence)}</div></details>'
            if evidence
            else ""
        )
        items.append(
            f'<div class="gradwidget-diagnosis" style="border-left:4px solid {colour};padding:3px 8px;margin:2px 0">'
            f'<div style="font-weight:600">{_esc(" · ".join(head))}</div>'
            f"<div>→ {_esc(d.get('action', ''))}</div>{details}</div>"
        )
    return f'<div class="gradwidget-diagnoses" style="margin:4px 0 8px">{"".join(items)}</div>'


def title_html(meta: dict, step: int | None) -> str:
    n_layers, rows = int(meta.get("n_layers", 0)), int(meta.get("rows", 0))
    grouped = f" in {rows} rows" if meta.get("grouped") else ""
    where = f" · steps {fmt(meta.get('first_step', 0))}–{fmt(meta.get('last_step', 0))}"
    at = f" · cursor at step {fmt(step)}" if step is not None else ""
    return (
        f'<div style="font-weight:600;margin:2px 0 4px">gradwidget · {n_layers} layers{grouped}{where}{at}'
        f'<span style="font-weight:normal;color:#666"> · static copy of the panel (no widget runs here)</span></div>'
    )


def rendition_html(
    meta: dict, arrays: dict, cursor: int | None, step: int | None, diagnoses: list[dict], table_html: str
) -> str:
    """The whole static panel as one HTML block (see the module's docstring)."""
    from ..fallback import FALLBACK_CLASS

    heat = np.asarray(arrays.get("heat", np.zeros((0, 0))))
    body = ""
    if heat.size:
        label = METRIC_LABELS.get(str(meta.get("metric")), str(meta.get("metric")))
        body = f'<div style="font-weight:600;margin:6px 0 2px">{_esc(label)} per layer (rows: input side at the top) and step</div>'

        body += heatmap_html(meta, heat, np.asarray(arrays["flags"]), np.asarray(arrays["col_steps"]), cursor)
    else:
        body = f'<p style="color:#666">{_esc(meta.get("message") or "no step recorded yet")}</p>'
    table = f'<div style="max-width:100%;overflow-x:auto">{table_html}</div>' if table_html else ""
    return (
        f'<div class="{FALLBACK_CLASS}" style="font-family:{_FONT};font-size:12px;color:#222;background:#fff;'
        f'max-width:{WIDTH + 20}px">{title_html(meta, step)}{diagnoses_html(diagnoses)}{body}{table}</div>'
    )


def run_rendition(run, report=None, metric: str = "mean_abs", columns: int = 600, table: bool = True) -> str:
    """The static panel of a whole Run at its last step (the HTML report, the CLI, a panel whose
    widget never drew): the panel's own heat view, diagnoses and (``table``) health table."""
    from ..fallback import health_table_html
    from .payload import heat_view
    from .rows import row_layout
    from .table import diagnoses_from_report

    if run.n_steps == 0 or run.n_layers == 0:
        return rendition_html({"message": "no step recorded yet", "n_layers": run.n_layers}, {}, None, None, [], "")
    if report is None:
        from ..analysis import analyze

        report = analyze(run)
    meta, arrays = heat_view(run, metric, columns, row_layout(run))
    cols = int(meta["cols"])
    html = health_table_html(report, compact=True) if table else ""
    return rendition_html(meta, arrays, cols - 1, int(run.steps[-1]), diagnoses_from_report(report, run), html)


class StaticRendition:
    """The static rendition, a part of the panel: the static copy of what the page shows (its
    ``static_png`` and ``static_html`` traits, the notebook output's image and HTML) kept for
    exports and saved notebooks.

    It owns the view last sent to the page (``note_view``), the health table's HTML of the analysis
    it goes with (``note_table``), and what the copy was last made from; ``make`` returns the
    traits' new values (the panel sets them) only when one of those changed. Milliseconds."""

    def __init__(self) -> None:
        self._view: tuple | None = None  # (version, step, heat, flags, scale, cursor column, meta, col_steps)
        self._table: tuple[int, str] = (-1, "")  # (run version, the health table's HTML)
        self._key: tuple | None = None  # what the copy was made from
        #: the run version the copy shows (-1: none)
        self.version = -1
        #: the step the copy shows (``GradientPanel.static_step``)
        self.step: int | None = None

    def note_view(self, version: int, step: int, arrays: dict, meta: dict, cursor: int) -> None:
        """The view of a full update: the heatmap arrays sent, at ``step`` (column ``cursor``)."""
        self._view = (version, step, arrays["heat"], arrays["flags"], meta["scale"], cursor, meta, arrays["col_steps"])

    def note_table(self, version: int, html: str) -> None:
        """The health table (HTML) of the analysis of run version ``version`` (-1: none)."""
        self._table = (version, html)

    @property
    def table_version(self) -> int:
        """The run version of the analysis whose table the copy shows (-1: none yet)."""
        return self._table[0]

    def made(self, version: int, step: int | None) -> None:
        """A copy of run version ``version`` at ``step`` was made elsewhere (a comparison's figures)."""
        self.version, self.step = version, step

    def make(self, layer: int, metric: str, diagnoses: list) -> dict | None:
        """``static_png`` (the heatmap last sent, as an image) and ``static_html`` (``rendition_html``:
        that image with its names, axis and legend around it, the diagnoses and the health table of
        the analysis noted last); None when nothing changed since the last copy or no view was sent."""
        view = self._view
        if view is None:
            return None
        version, step, heat, flags, scale, col, meta, col_steps = view
        table_version, table = self._table
        analysed = table_version >= 0
        key = (version, table_version, layer, metric)
        if key == self._key:
            return None
        png = heat_png(heat, flags, scale, col)
        arrays = {"heat": heat, "flags": flags, "col_steps": col_steps}
        html = rendition_html(meta, arrays, col, step, list(diagnoses) if analysed else [], table if analysed else "")
        self.version, self.step, self._key = version, step, key
        return {"static_png": _png_uri(png), "static_html": html}
