"""The ``Report`` object: every analysis of a Run as dataclasses and DataFrames that serialise to
JSON. Rendering it as HTML is the top-level ``gradwidget.report`` module.

``report.layers`` is the health table (one row per layer, depth order); ``report.recommendations``
the ranked advice; ``summary_text()`` the plain-language digest. ``to_html`` hands the report to
``gradwidget.report.write_report`` (imported lazily: the analysis does no I/O of its own).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..jsonsafe import jsonable
from ..run import Run
from ..thresholds import Thresholds
from .health import FORECAST_CONFIDENCE


def to_jsonable(x: Any) -> Any:
    """``x`` as plain JSON types for a file any reader can read: NaN and +-Inf become null."""
    return jsonable(x, inf="null")


def _outlook(f) -> str:
    """The forecast in words: its outlook, the projected change with its 95% interval, and how
    probable the outlook is under that interval."""
    if not np.isfinite(f.projected_decades):
        return f"outlook {f.outlook} (no trend to extrapolate)"
    lo, hi = f.interval
    what = {
        "Stable": f"it stays within ±{f.stable_band:.2f}",
        "Deteriorating": f"it rises by more than {f.stable_band:.2f}",
        "Improving": f"it falls by more than {f.stable_band:.2f}",
    }
    if f.outlook in what:
        why = f"{f.confidence:.0%} probability {what[f.outlook]}"
    elif f.most_likely == "Stable" and not f.steady and f.confidence >= FORECAST_CONFIDENCE:
        why = f"{f.confidence:.0%} probability {what['Stable']}, but the layers' gradients are unsteady"
    else:
        why = f"no outlook reaches {FORECAST_CONFIDENCE:.0%}: the most likely, {f.most_likely}, has {f.confidence:.0%}"
    return (
        f"outlook {f.outlook} (global norm projected to change {f.projected_decades:+.2f} decades over the "
        f"next {f.horizon} recorded steps, 95% interval {lo:+.2f} to {hi:+.2f}; {why})"
    )


@dataclass
class Report:
    run: Run = field(metadata={"json": False})
    thresholds: Thresholds
    overall_health: str
    layers: pd.DataFrame  #: the health table, one row per layer in depth order
    statistics: pd.DataFrame  #: per (metric, layer) statistics over the steps
    flow: pd.DataFrame  #: per-layer flow characteristics and direction
    health: pd.DataFrame  #: per-layer health details and comparative analysis
    risk_factors: list
    regions: list
    network: Any  #: FlowNetwork (``available`` False without a recorded graph)
    critical_paths: list
    distribution: Any
    interactions: list
    convergence: Any
    dynamics: Any
    stability: Any
    groups: list
    suggestions: list
    priorities: list
    recommendations: list
    weights: Any = None  #: WeightReport when weights were given
    weight_drift: Any = None  #: drift read from the run's update/weight ratios
    explosion: Any = None  #: the original crate's weight analysis's gradient-explosion check on each layer's largest |g| (the flags' metric)
    nonfinite_origin: Any = None  #: NonfiniteOrigin: the module, step and pass that made the first NaN/Inf
    noise_scale: Any = None  #: NoiseScale: the gradient noise scale B_simple, when the run saw two batch sizes
    notes: list = field(default_factory=list)

    @property
    def crate_summary(self):
        """The original crate's ``GradientFlowSummary`` of the run (``gradwidget.outputs.summary``),
        computed on first use."""
        if self._crate_summary is None:
            from ..outputs import summary

            self._crate_summary = summary(self.run, self)
        return self._crate_summary

    @property
    def seed_summary(self):
        """Deprecated name of ``crate_summary``."""
        from .._warnings import GradwidgetDeprecationWarning

        warnings.warn(
            "Report.seed_summary is deprecated: use Report.crate_summary", GradwidgetDeprecationWarning, stacklevel=2
        )
        return self.crate_summary

    _crate_summary: Any = field(default=None, repr=False, metadata={"json": False})

    # ------------------------------------------------------------------ text
    def summary_text(self) -> str:
        """Plain-language lines: overall verdict first, then the problems by rank."""
        run = self.run
        h = self.layers["health"].value_counts()
        span = f"steps {int(run.steps[0])}–{int(run.steps[-1])}" if run.n_steps else "no steps"
        lines = [
            f"Gradient health: {self.overall_health} — {run.n_layers} layers over {run.n_steps} recorded steps "
            f"({span}): {int(h.get('Critical', 0))} critical, {int(h.get('Warning', 0))} warning, "
            f"{int(h.get('Healthy', 0))} healthy, {int(h.get('Unknown', 0))} unknown."
        ]
        for r in self.regions:
            where = (
                f"{r.start_layer} … {r.end_layer} ({len(r.layers)} layers"
                if len(r.layers) > 1
                else f"{r.start_layer} (1 layer"
            )
            lines.append(
                f"{r.kind.capitalize()} region: {where}, {r.parameters} parameters) on {r.duration_steps} steps "
                f"({r.first_step}–{r.last_step}){', still active' if r.active_now else ''}."
            )
        for i, rec in enumerate(self.recommendations[:6], 1):
            lines.append(f"{i}. [{rec.priority}] {rec.text} {rec.action[:1].upper()}{rec.action[1:]}.")
        d = self.dynamics
        lines.append(
            f"Training phase: {d.learning_phase} (from the {d.series})"
            + (f"; plateau for {d.plateau.duration_steps} steps." if d.plateau.is_plateau else ".")
        )
        c = self.convergence
        if c.trend == "Converging":
            lines.append(
                f"Convergence: the {c.series} is converging; "
                + (
                    f"it should flatten (change below {self.thresholds.plateau_rel_change:g} per step) in about "
                    f"{c.estimated_steps_to_convergence} steps."
                    if c.estimated_steps_to_convergence is not None
                    else f"no estimate of when it flattens: {c.estimate_basis}."
                )
            )
        st = self.stability
        lines.append(
            f"Stability: {st.overall:.2f} (trend {st.trend}); {_outlook(st.forecast)}."
            if np.isfinite(st.overall)
            else "Stability: not enough data."
        )
        if not self.network.available:
            lines.append("Flow network: unavailable — " + self.network.reason + ".")
        elif self.critical_paths:
            p = self.critical_paths[0]
            amount = "gradient falls to exactly zero" if p.reaches_zero else f"{p.decades:.2f} decades"
            lines.append(
                f"Critical path ({p.kind}): {p.layers[0]} → {p.layers[-1]}, {amount}"
                + (f"; bottlenecks {', '.join(p.bottleneck_layers[:4])}" if p.bottleneck_layers else "")
                + ("; the graph has cycles (a reused module), each reuse counted once" if p.graph_had_cycles else "")
                + "."
            )
        if self.noise_scale is not None:
            lines.append(self.noise_scale.text()[:1].upper() + self.noise_scale.text()[1:] + ".")
        if not self.recommendations:
            lines.append("No problems found: gradients look healthy.")
        lines.extend(f"Note: {n}." for n in self.notes)
        return "\n".join(lines)

    def direction_series(self, layer) -> pd.DataFrame:
        """Per-step direction of one layer's gradient norm (``flow.direction_series``), on demand."""
        from .flow import direction_series

        return direction_series(self.run, layer)

    def __repr__(self) -> str:
        return f"<Report {self.overall_health}: {len(self.layers)} layers, {len(self.recommendations)} recommendations>"

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        d = to_jsonable(self)
        d["crate_summary"] = to_jsonable(self.crate_summary)
        d["run"] = {
            "n_layers": self.run.n_layers,
            "n_steps": self.run.n_steps,
            "first_step": int(self.run.steps[0]) if self.run.n_steps else None,
            "last_step": int(self.run.steps[-1]) if self.run.n_steps else None,
        }
        return d

    def to_json(self, path=None, indent: int | None = 1) -> str:
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            from pathlib import Path

            Path(path).write_text(text, encoding="utf-8")
        return text

    def to_html(self, path):
        from ..report import write_report

        return write_report(self, path)
