"""Users' strings (layer names) are drawn and exported as written: never parsed as matplotlib math,
never read as a spreadsheet formula."""

import csv

import numpy as np
import pytest
from matplotlib.table import Table
from matplotlib.text import Text

from gradwidget import plots
from gradwidget.analysis import analyze
from gradwidget.collect.arrays import ArrayRecorder
from gradwidget.report import render_report
from gradwidget.outputs import export_csv, spreadsheet_safe

HOSTILE = ("$\\foo$", "$$", "$x^2$", "a$b", '=HYPERLINK("http://x")', "+1", "-cmd", "@SUM(A1)", "plain.weight")


@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(0)
    rec = ArrayRecorder(histogram_every=2)
    for s in range(6):
        rec.record(
            s,
            {n: rng.normal(0, 10.0**-k, 32) for k, n in enumerate(HOSTILE)},
            weights={n: rng.normal(0, 1, 32) for n in HOSTILE},
            loss=1.0 / (s + 1),
        )
    return rec.run


def _texts(fig):
    cells = [c.get_text() for table in fig.findobj(Table) for c in table.get_celld().values()]
    return [t for t in fig.findobj(Text) + cells if t.get_text()]


@pytest.mark.parametrize(
    "draw",
    [
        lambda r: plots.panel_figure(r, layer="$x^2$"),
        lambda r: plots.flow_heatmap(r),
        lambda r: plots.layer_bars(r),
        lambda r: plots.metric_series(r, list(HOSTILE)),
        lambda r: plots.weight_plot(r, layers=list(HOSTILE[:4])),
        lambda r: plots.histogram_plot(r, "$\\foo$"),
        lambda r: plots.histogram_over_time(r, "$$"),
        lambda r: plots.health_table_figure(analyze(r)),
    ],
    ids=["panel", "heatmap", "bars", "series", "weights", "histogram", "hist_over_time", "health_table"],
)
def test_figures_draw_dollar_names_as_plain_text(run, draw):
    fig = draw(run)
    png = plots.figure_to_png(fig)  # mathtext of "$\\foo$" or "$$" used to raise here
    assert png.startswith(b"\x89PNG")
    dollar_names = [n for n in HOSTILE if "$" in n]
    # matplotlib's own log-axis labels are math ($\\mathdefault{10^{-3}}$); the names are not
    named = [t for t in _texts(fig) if any(n in t._preprocess_math(t.get_text())[0] for n in dollar_names)]
    assert named, "the figure draws some hostile name"
    for t in named:
        shown, is_math = t._preprocess_math(t.get_text())
        assert is_math is False, f"{t.get_text()!r} would be typeset as math"
        assert "\\$" not in shown  # the escape is not what the reader sees


def test_literal_round_trips_through_matplotlib():
    for name in HOSTILE:
        t = Text(text=plots.literal(name))
        assert t._preprocess_math(t.get_text()) == (name, False)


def test_report_with_dollar_names_renders(run):
    html = render_report(analyze(run))
    assert "$x^2$" in html and "<img" in html


def test_csv_cells_that_would_be_formulas_are_escaped(run, tmp_path):
    out = tmp_path / "t.csv"
    export_csv(run, out)
    with open(out, newline="") as f:
        names = {row["layer"] for row in csv.DictReader(f)}
    assert names == {spreadsheet_safe(n) for n in HOSTILE}
    assert '\'=HYPERLINK("http://x")' in names and "'+1" in names and "'-cmd" in names and "'@SUM(A1)" in names
    assert "plain.weight" in names and "$x^2$" in names
    assert all(not n.startswith(("=", "+", "-", "@")) for n in names)
