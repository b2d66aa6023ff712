"""The comparison panel: a GradientPanel whose page shows two runs (``GradientPanel.compare``).

The later run is the panel's own source (a Run, a run directory, or the current training: a
Recorder or another panel's), so live updates, the throttle and the analysis thread work as for one
run; the first run is a fixed reference (last night's run). Every update carries both runs on the
same rows and columns (``comparison.compare_view``): whole updates only, no column patches.
"""

from __future__ import annotations

import base64
import numpy as np
import traitlets as t

from ..comparison import Comparison, _as_run, _labels, compare
from ..run import Run
from . import comparison as CV
from .protocol import COMPARE_MODES
from .table import diagnoses_from_report
from .widget import GradientPanel

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


def _later_source(x):
    """A GradientPanel stands for what it shows: its recorder (training now) or its run."""
    if isinstance(x, GradientPanel):
        return x.recorder if x.recorder is not None else x.run
    return x


class ComparisonPanel(GradientPanel):
    """Two runs in one panel: the first (reference) and the later one, on one colour scale side by
    side (``mode="side"``) or as a difference map (``mode="diff"``), one cursor for both."""

    def __init__(self, run_a, run_b, *, labels=None, mode: str = "side", **kwargs) -> None:
        if mode not in COMPARE_MODES:
            raise ValueError(f"mode must be one of {list(COMPARE_MODES)}, got {mode!r}")
        self._base: Run = _as_run(run_a).with_history()
        if self._base.n_layers == 0 or self._base.n_steps == 0:
            raise ValueError("the first run has no recorded steps or no layers: there is nothing to compare")
        self._labels = _labels([run_a, run_b], labels)
        self._comparison: Comparison | None = None
        self._comparison_version = -1
        self._names: list[str] = list(self._base.layer_names)
        source = _later_source(run_b)
        if isinstance(source, GradientPanel) or source is None:
            raise TypeError("the later run must be a Run, a run directory, a Recorder or a GradientPanel with a run")
        super().__init__(source, **kwargs)
        self._internal += 1
        try:
            self.labels = list(self._labels)
            self.mode = mode
        finally:
            self._internal -= 1

    @property
    def base(self) -> Run:
        """The first (reference) run."""
        return self._base

    @property
    def comparison(self) -> Comparison | None:
        """``gradwidget.compare(first, later)`` of the current state (None before the later run's
        first step), recomputed when the later run has changed."""
        run = self.run
        if run is None or run.n_steps == 0:
            return None
        if self._comparison is None or self._comparison_version != run.version:
            self._comparison = compare(self._base, run, labels=self._labels)
            self._comparison_version = run.version
        return self._comparison

    # ----------------------------------------------------------------- sending
    _patches = False

    def _payload(self, run: Run | None, version: int) -> dict:
        """Both runs on shared rows and columns (``comparison.compare_view``); no per-step detail."""
        values: dict = {k: b"" for k in _EMPTY}
        later = run if run is not None and run.n_steps else Run(self._base.layer_names)
        meta, arrays = CV.compare_view(self._base, later, self.metric, self.columns, self._labels)
        self._names = [x["name"] for x in meta["layers"]]
        cmp = self._comparison
        if cmp is not None and run is not None and self._comparison_version == run.version:
            meta.update(self._verdict_message(cmp))
        values.update(arrays, meta=meta, detail_step=-1, hist_layer=-1)
        steps = arrays["col_steps"]
        if len(steps):
            step = int(meta["last_step"]) if self.follow else self._snap(self.step)
            layer = self.layer if 0 <= self.layer < len(self._names) else self._default_row()
            values.update(step=step, layer=layer)
            col = int(np.searchsorted(steps, step, side="right")) - 1
            self._view = (version, step, arrays["heat"], arrays["flags"], meta["scale"], col, meta, arrays["col_steps"])
        return values

    def _default_row(self) -> int:
        """The row of the later run's most flagged layer (as a single panel would pick)."""
        run = self.run
        if run is None or run.n_steps == 0:
            return 0
        name = run.layers[self._default_layer(run)].name
        return self._names.index(name) if name in self._names else 0

    def _snap(self, step: int) -> int:
        return CV.nearest_shared_step(self._base, self.run, step)

    def _send_detail(self) -> None:
        """Exact per-step values and histograms belong to one run: the comparison shows the heatmaps'
        columns instead (nothing to send)."""

    @t.validate("layer")
    def _check_layer(self, proposal):
        v = int(proposal["value"])
        n = len(getattr(self, "_names", ()) or ())
        if v < -1 or (n and v >= n):
            raise t.TraitError(f"layer must be -1 (none) or a row index below {n}, got {v}")
        return v

    def select(self, layer) -> None:
        """Select a row by layer name (the first run's name) or row index."""
        self.layer = self._names.index(layer) if isinstance(layer, str) else int(layer)

    # ----------------------------------------------------------------- analysis and static image
    def _analyse_snapshot(self, snap: Run, final: bool = True) -> None:
        """The comparison of the reference with a copy of the later run: the health table (both
        runs' health and the change), the later run's diagnoses, and the verdict as HTML."""
        cmp = compare(self._base, snap, labels=self._labels)
        names = self._names
        rows = CV.table_rows(cmp, names)
        diagnoses = diagnoses_from_report(cmp.reports[1], snap)
        for d in diagnoses:  # the later run's layer index -> the panel's row
            li = d.get("layer_index", -1)
            name = snap.layers[li].name if 0 <= li < snap.n_layers else None
            d["layer_index"] = names.index(name) if name in names else -1
        from html import escape

        table = cmp.layers.to_html(index=False, border=0, float_format=lambda v: f"{v:.3g}")
        html = "<ul>" + "".join(f"<li>{escape(str(v))}</li>" for v in cmp.verdict) + "</ul>" + table
        with self._lock:
            if snap.version < self._analysed_version:
                return
            self._comparison, self._comparison_version = cmp, snap.version
            self._analysed_version = snap.version
            self._static_table = (snap.version, html)
            values: dict = {"table": rows, "diagnoses": diagnoses, "static_html": html}
            if self.meta.get("version") == snap.version:  # the verdict goes with the heatmaps it is about
                values["meta"] = {**self.meta, **self._verdict_message(cmp)}
            self._set(values)

    @staticmethod
    def _verdict_message(cmp: Comparison) -> dict:
        """The verdict's first lines as the panel's message (what changed, in words)."""
        return {"message": " · ".join(cmp.verdict[:VERDICT_LINES]), "level": "info"}

    def _refresh_static(self) -> None:
        """``static_png``: the comparison's figures (both heatmaps on one scale, the difference map)."""
        run = self.run
        if run is None or run.n_steps == 0 or run.version == self._static_version:
            return
        from ..plots import comparison_figure, figure_to_png

        cmp = self.comparison
        png = figure_to_png(comparison_figure(cmp, self.metric))
        self.static_png = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
        self._static_version, self.static_step = run.version, int(run.steps[-1])

    def _repr_mimebundle_(self, **kwargs):
        data, md = super()._repr_mimebundle_(**kwargs)
        cmp = self.comparison
        if cmp is not None:
            data["text/plain"] = cmp.summary_text()
        return data, md

    def __repr__(self) -> str:
        return f"GradientPanel.compare({' vs '.join(self._labels)})"
