"""The comparison, a part of the comparison panel (``GradientPanel.compare``): two runs in one view.

The later run is the panel's own source (a Run, a run directory, or the current training: a
Recorder or another panel's), so live updates, the throttle and the analysis thread work as for one
run; the first run is a fixed reference (last night's run), owned here with the runs' labels, the
rows both share (layers matched by name) and the comparison of the newest state. Every update
carries both runs on the same rows and columns (``comparison.compare_view``): whole updates only,
no column patches. This module never imports the panel (``widget.py`` composes this part).
"""

from __future__ import annotations

import base64
from html import escape

import anywidget

from ..comparison import Comparison, _as_run, _labels, compare
from ..run import Run
from . import comparison as CV
from .protocol import COMPARE_MODES
from .table import diagnoses_from_report

#: lines of the comparison's verdict shown as the panel's message.
VERDICT_LINES = 3
_EMPTY = (
    "heat",
    "flags",
    "heat_b",
    "flags_b",
    "diff",
    "col_steps",
    "loss",
    "hist_all",
    "detail",
    "hists",
    "hist_steps",
)


def later_source(x):
    """What the later run's panel shows: a panel stands for its recorder (training now) or its run."""
    if isinstance(x, anywidget.AnyWidget) and hasattr(x, "recorder"):
        return x.recorder if x.recorder is not None else x.run
    return x


class Comparing:
    def __init__(self, run_a, run_b, labels, mode: str) -> None:
        if mode not in COMPARE_MODES:
            raise ValueError(f"mode must be one of {list(COMPARE_MODES)}, got {mode!r}")
        #: the first (reference) run
        self.base: Run = _as_run(run_a).with_history()
        if self.base.n_layers == 0 or self.base.n_steps == 0:
            raise ValueError("the first run has no recorded steps or no layers: there is nothing to compare")
        #: the runs' labels, first then later
        self.labels: list[str] = list(_labels([run_a, run_b], labels))
        self._comparison: Comparison | None = None
        self._version = -1
        self._names: list[str] = list(self.base.layer_names)  # the panel's rows
        #: the later run's source (a Run, a run directory, a Recorder)
        self.source = later_source(run_b)
        if self.source is None or isinstance(self.source, anywidget.AnyWidget):
            raise TypeError("the later run must be a Run, a run directory, a Recorder or a GradientPanel with a run")

    def comparison(self, run: Run | None) -> Comparison | None:
        """``gradwidget.compare(first, later)`` of ``run``, the later run (None before its first
        step), made again when it has changed."""
        if run is None or run.n_steps == 0:
            return None
        if self._comparison is None or self._version != run.version:
            self._comparison = compare(self.base, run, labels=self.labels)
            self._version = run.version
        return self._comparison

    def payload(self, run: Run | None, metric: str, columns: int, follow: bool, step: int, layer: int, default):
        """Both runs on shared rows and columns (``comparison.compare_view``); no per-step detail.
        ``default(run)``: the later run's layer a single panel would show first."""
        values: dict = {k: b"" for k in _EMPTY}
        later = run if run is not None and run.n_steps else Run(self.base.layer_names)
        meta, arrays = CV.compare_view(self.base, later, metric, columns, self.labels)
        self._names = [x["name"] for x in meta["layers"]]
        cmp = self._comparison
        if cmp is not None and run is not None and self._version == run.version:
            meta.update(self.verdict_message(cmp))
        values.update(arrays, meta=meta, detail_step=-1, hist_layer=-1)
        steps = arrays["col_steps"]
        if len(steps):
            step = int(meta["last_step"]) if follow else self.snap(run, step)
            if not 0 <= layer < len(self._names):
                layer = 0
                if run is not None and run.n_steps:
                    name = run.layers[default(run)].name
                    layer = self._names.index(name) if name in self._names else 0
            values.update(step=step, layer=layer)
        return values

    def snap(self, run: Run | None, step: int) -> int:
        return CV.nearest_shared_step(self.base, run, step)

    def check_row(self, v: int) -> int:
        n = len(self._names)
        if v < -1 or (n and v >= n):
            raise ValueError(f"layer must be -1 (none) or a row index below {n}, got {v}")
        return v

    def row(self, layer) -> int:
        """The row of a layer name (the first run's name) or a row index."""
        return self._names.index(layer) if isinstance(layer, str) else int(layer)

    def analyse(self, snap: Run) -> tuple[Comparison, list, list, str]:
        """The comparison of the reference with a copy of the later run: the health table (both
        runs' health and the change), the later run's diagnoses on the panel's rows, and the
        verdict with the table as HTML (the static copy's)."""
        cmp = compare(self.base, snap, labels=self.labels)
        names = self._names
        rows = CV.table_rows(cmp, names)
        diagnoses = diagnoses_from_report(cmp.reports[1], snap)
        for d in diagnoses:  # the later run's layer index -> the panel's row
            li = d.get("layer_index", -1)
            name = snap.layers[li].name if 0 <= li < snap.n_layers else None
            d["layer_index"] = names.index(name) if name in names else -1
        table = cmp.layers.to_html(index=False, border=0, float_format=lambda v: f"{v:.3g}")
        html = "<ul>" + "".join(f"<li>{escape(str(v))}</li>" for v in cmp.verdict) + "</ul>" + table
        return cmp, rows, diagnoses, html

    def keep(self, cmp: Comparison, version: int) -> None:
        """The comparison of the later run's version ``version`` (made by an analysis)."""
        self._comparison, self._version = cmp, version

    @staticmethod
    def verdict_message(cmp: Comparison) -> dict:
        """The verdict's first lines as the panel's message (what changed, in words)."""
        return {"message": " · ".join(cmp.verdict[:VERDICT_LINES]), "level": "info"}

    def verdict_of(self, version: int) -> dict:
        """The verdict message of the comparison of run version ``version`` ({}: not made yet)."""
        cmp = self._comparison
        return self.verdict_message(cmp) if cmp is not None and self._version == version else {}

    def static_png(self, run: Run, metric: str) -> str:
        """The comparison's figures (both heatmaps on one scale, the difference map) as a data URL."""
        from ..plots import comparison_figure, figure_to_png

        png = figure_to_png(comparison_figure(self.comparison(run), metric))
        return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
