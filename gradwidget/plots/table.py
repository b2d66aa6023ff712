"""The per-layer health table as a figure (PNG/PDF exports), its health cells coloured and spelled out."""

from __future__ import annotations

from matplotlib.figure import Figure

from .._look import HEALTH_COLORS, HEALTH_COLUMNS, format_cell
from .common import new_ax, literal, short_name


def _health_frame(report):
    layers = getattr(report, "layers", None)
    if layers is None or not hasattr(layers, "columns"):
        raise TypeError(
            "expected an analysis Report (gradwidget.analyze(run)) with a .layers DataFrame, "
            f"got {type(report).__name__}"
        )
    return layers


def health_table_figure(report, ax=None, max_rows: int = 40) -> Figure:
    """The per-layer health table as a figure (for PNG/PDF exports where HTML cannot go).

    Why: the table is the panel's verdict per layer; the health cell is coloured and spelled out,
    so it reads without colour too.
    """
    df = _health_frame(report)
    cols = [c for c in HEALTH_COLUMNS if c[0] in df.columns]
    rows = df.head(max_rows)
    fig, ax = new_ax(ax, (10, 0.5 + 0.24 * (len(rows) + 1)))
    ax.set_axis_off()
    cells = [
        [literal(format_cell(r[c], f)) if c != "layer" else short_name(str(r[c]), 34) for c, _, f in cols]
        for _, r in rows.iterrows()
    ]
    if not cells:
        ax.text(0.5, 0.5, "no layers", ha="center", va="center", transform=ax.transAxes)
        return fig
    table = ax.table(cellText=cells, colLabels=[h for _, h, _ in cols], loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(list(range(len(cols))))
    hcol = [c for c, _, _ in cols].index("health") if "health" in df.columns else None
    for (r, c), cell in table.get_celld().items():
        cell.set_edgecolor("0.85")
        if r == 0:
            cell.set_facecolor("#eeeeee")
            cell.get_text().set_fontweight("bold")
        elif c == hcol:
            h = str(rows.iloc[r - 1]["health"])
            cell.set_facecolor(HEALTH_COLORS.get(h, HEALTH_COLORS["Unknown"]))
            cell.get_text().set_color("white")
            cell.get_text().set_fontweight("bold")
    if len(df) > max_rows:
        ax.set_title(f"layer health (first {max_rows} of {len(df)} layers)", fontsize=10)
    else:
        ax.set_title("layer health", fontsize=10)
    return fig
