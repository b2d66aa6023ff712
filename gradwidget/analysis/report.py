"""The ``Report`` object: every analysis of a Run as dataclasses and DataFrames that serialise to
JSON. Rendering it as HTML is the top-level ``gradwidget.report`` module.

``report.layers`` is the health table (one row per layer, depth order); ``report.diagnoses``
the ranked diagnoses; ``summary_text()`` the plain-language digest. The analysis writes no HTML:
``gradwidget.write_report(report, path)`` (an output) does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..jsonsafe import jsonable
from ..origin import NonfiniteOrigin
from ..run import Run
from ..thresholds import Thresholds
from . import advice, dynamics, flow, health, interplay, network, stability
from .causes import Diagnosis
from .stability import FORECAST_CONFIDENCE
from .loss import LossEvidence
from .noise_scale import NoiseScale
from .stats import Series
from .weights import drift_from_run, gradient_explosion


def to_jsonable(x: Any) -> Any:
    """``x`` as plain JSON types for a file any reader can read: NaN and +-Inf become null."""
    return jsonable(x, inf="null")


@dataclass
class Summary:
    """A report's summary in sentences: what it says first, and the further analyses."""

    verdict: str  #: the analysis in one sentence (``verdict_line``)
    graded: str  #: how many layers over how many steps, and how they are graded
    diagnoses: list[str]  #: the top diagnoses, each its priority, what and where, and the action
    progress: str  #: the loss's progress, said only where it agrees with the verdict (no diagnosis, not rising)
    more: list[str]  #: the original crate's stability score and outlook, the critical path, the notes


def verdict_line(priority: str | None, title: str, layer: str | None, first_step: int | None, n_steps: int) -> str:
    """The analysis in one line, as the panel and the report say it: the top diagnosis' priority,
    title, first layer and since when, or (``priority`` None) that nothing was found in how many
    recorded steps."""
    if priority is None:
        return f"Healthy: nothing found in {n_steps:,} recorded step{'s' * (n_steps != 1)}"
    where = f" in {layer}" if layer else ""
    since = f" since step {first_step}" if first_step is not None else ""
    return f"{priority}: {title}{where}{since}"


def _sentence(text: str) -> str:
    """``text`` as a sentence: a capital first, a full stop last."""
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _slope(tr) -> str:
    """A loss trend's slope with its interval, in numbers."""
    return f"{tr.slope:+.3g} per step (99% interval {tr.low:+.3g} to {tr.high:+.3g}, {tr.n} points)"


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
    """What every output shows: the verdict, the health table and the ranked diagnoses. The original
    crate's other analyses are properties computed on first use (see ``_PARTS``)."""

    run: Run = field(metadata={"json": False})
    thresholds: Thresholds
    overall_health: str  #: the verdict: Healthy / Warning / Critical / Unknown (``causes.verdict``)
    layers: pd.DataFrame  #: the health table, one row per layer in depth order
    diagnoses: list[Diagnosis]  #: ranked: what is wrong, where, since when, and the one change to make
    loss: LossEvidence  #: what the logged loss did (its trend with its confidence interval)
    weights: Any = None  #: WeightReport when weights were given
    nonfinite_origin: NonfiniteOrigin | None = None  #: the module, step and pass that made the first NaN/Inf
    noise_scale: NoiseScale | None = None  #: the gradient noise scale B_simple, when the run saw two batch sizes
    notes: list = field(default_factory=list)
    #: what the loss was read as (``task.Task``: from its graph, or as ``objective=`` said)
    task: Any = field(default=None, metadata={"json": False})
    _series: Any = field(default=None, repr=False, metadata={"json": False})
    _parts: dict = field(default_factory=dict, repr=False, metadata={"json": False})

    def _part(self, name: str):
        if name not in self._parts:
            s = self._series if self._series is not None else Series(self.run)
            self._series = s
            self._parts[name] = _PARTS[name](self, s)
        return self._parts[name]

    # the original crate's analyses, on demand (none of them is on the panel's path)
    statistics = property(lambda self: self._part("statistics"), doc="per (metric, layer) statistics over the steps")
    flow = property(lambda self: self._part("flow"), doc="per-layer flow characteristics and direction")
    health = property(lambda self: self._part("health"), doc="per-layer health details")
    risk_factors = property(lambda self: self._part("risk_factors"), doc="the measured risk factors")
    regions = property(lambda self: self._part("regions"), doc="vanishing/exploding/dead regions")
    dynamics = property(lambda self: self._part("dynamics"), doc="learning phase and plateau")
    convergence = property(lambda self: self._part("convergence"), doc="convergence over the last window")
    network = property(lambda self: self._part("network"), doc="the flow network (FlowNetwork)")
    critical_paths = property(lambda self: self._part("critical_paths"), doc="where the gradient falls most")
    distribution = property(lambda self: self._part("distribution"), doc="distribution of layer levels")
    interactions = property(lambda self: self._part("interactions"), doc="correlated layer pairs")
    stability = property(lambda self: self._part("stability"), doc="stability and its forecast")
    groups = property(lambda self: self._part("groups"), doc="layer groups by module")
    suggestions = property(lambda self: self._part("suggestions"), doc="per-risk-factor suggestions")
    priorities = property(lambda self: self._part("priorities"), doc="the original crate's priorities")
    weight_drift = property(lambda self: self._part("weight_drift"), doc="drift read from update/weight ratios")
    explosion = property(
        lambda self: self._part("explosion"), doc="the original crate's explosion check on each layer's largest |g|"
    )

    # ------------------------------------------------------------------ text
    def verdict_text(self) -> str:
        """The analysis in one sentence (``verdict_line``): the top diagnosis, or that nothing was found."""
        d = self.diagnoses[0] if self.diagnoses else None
        if d is None:
            return verdict_line(None, "", None, None, self.run.n_steps)
        return verdict_line(d.priority, d.title or d.cause, d.layers[0] if d.layers else None, d.first_step, 0)

    def summary_parts(self) -> Summary:
        """The summary in sentences (``Summary``). No sentence outside ``more`` contradicts the
        verdict: with a diagnosis, the loss's trend is given as numbers among the further analyses,
        not judged ("the loss is falling" beside "the model learns nothing")."""
        run = self.run
        h = self.layers["health"].value_counts()
        span = f"steps {int(run.steps[0])}–{int(run.steps[-1])}" if run.n_steps else "no steps"
        graded = ", ".join(
            f"{int(h.get(k, 0))} {k.lower()}"
            for k in ("Critical", "Warning", "Healthy", "Unknown", health.CANNOT_MOVE)
            if h.get(k, 0)
        )
        more = []
        tr = self.loss.trend if self.loss.logged else None
        judged = not self.diagnoses and not (tr is not None and tr.rising)  # a rising loss: numbers, no verdict
        if not judged and tr is not None:
            more.append(f"The loss's slope over the run: {_slope(tr)}.")
        st = self.stability
        more.append(
            f"Stability of the gradient norms (the original crate's score, 0 to 1, 1 is steady): {st.overall:.2f}, "
            f"trend {st.trend.lower()}; {_outlook(st.forecast)}."
            if np.isfinite(st.overall)
            else "Stability of the gradient norms: too few steps to score."
        )
        if not self.network.available:
            more.append("The flow network (critical path) is unavailable: " + self.network.reason + ".")
        elif self.critical_paths:
            p = self.critical_paths[0]
            grows = p.kind == "amplification"
            amount = (
                "the gradient falls to exactly zero"
                if p.reaches_zero
                else f"the gradient norm {'grows' if grows else 'shrinks'} {10 ** abs(p.decades):.2g}-fold "
                f"({abs(p.decades):.2f} decades)"
            )
            more.append(
                f"Critical path, where the gradient {'grows' if grows else 'is lost'} most on its way back: "
                f"{p.layers[0]} → {p.layers[-1]}, {amount}"
                + (f"; bottlenecks {', '.join(p.bottleneck_layers[:4])}" if p.bottleneck_layers else "")
                + ("; the graph has cycles (a reused module), each reuse counted once" if p.graph_had_cycles else "")
                + "."
            )
        if self.noise_scale is not None:
            more.append(_sentence(self.noise_scale.text()))
        more.extend(f"Note: {n}." for n in self.notes)
        return Summary(
            verdict=self.verdict_text() + ".",
            graded=f"{run.n_layers} layers over {run.n_steps} recorded steps ({span})"
            + f"; gradient health {self.overall_health}"
            + (f": {graded}." if graded else "."),
            diagnoses=[f"{d.priority}: {_sentence(d.text)} {_sentence(d.action)}" for d in self.diagnoses[:6]],
            progress=self.progress_text() if judged else "",
            more=more,
        )

    def summary_text(self) -> str:
        """The summary (``summary_parts``) as lines: the verdict, the grades, the diagnoses numbered,
        the loss's progress where it agrees with the verdict, then the further analyses."""
        s = self.summary_parts()
        lines = [s.verdict, s.graded, *(f"{i}. {t}" for i, t in enumerate(s.diagnoses, 1))]
        return "\n".join(lines + ([s.progress] if s.progress else []) + s.more)

    def progress_text(self) -> str:
        """The loss's progress in one sentence, from the same evidence the diagnoses read: a plateau
        when one was diagnosed, else the loss's trend with its confidence interval."""
        plateau = next((d for d in self.diagnoses if d.cause == "plateau"), None)
        if plateau is not None:
            return f"Training progress: on a plateau since step {plateau.first_step}."
        L = self.loss
        tr = L.trend
        if not L.logged or tr is None:
            return (
                "Training progress: no loss logged (pass it to the recorder to judge progress)."
                if not L.logged
                else ("Training progress: too few loss values to judge a trend.")
            )
        per = _slope(tr)
        word = "is falling" if tr.falling else "is rising" if tr.rising else "has no clear trend yet"
        return f"Training progress: the loss {word}, {per}."

    def direction_series(self, layer) -> pd.DataFrame:
        """Per-step direction of one layer's gradient norm (``flow.direction_series``), on demand."""
        from .flow import direction_series

        return direction_series(self.run, layer)

    def __repr__(self) -> str:
        return f"<Report {self.overall_health}: {len(self.layers)} layers, {len(self.diagnoses)} diagnoses>"

    # ------------------------------------------------------------------ export
    def to_dict(self) -> dict:
        """Every field and every on-demand analysis (computed now), as plain JSON types."""
        d = to_jsonable(self)
        d.update({name: to_jsonable(self._part(name)) for name in _PARTS})
        d["run"] = {
            "n_layers": self.run.n_layers,
            "n_steps": self.run.n_steps,
            "first_step": int(self.run.steps[0]) if self.run.n_steps else None,
            "last_step": int(self.run.steps[-1]) if self.run.n_steps else None,
        }
        return d

    def to_json(self, path=None, indent: int | None = 1, force: bool = False) -> str:
        """The report as JSON; written to ``path`` if given (an existing file is replaced only with
        ``force``)."""
        text = json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        if path is not None:
            from ..storage import atomic_output

            with atomic_output(path, force, encoding="utf-8") as f:
                f.write(text)
        return text


def _hl(r: Report, s: Series):
    """The health details with the diagnoses' verdicts, as the health table has them."""
    hl = health.layer_health(s, r.flow, r.risk_factors)
    hl["health"] = r.layers["health"].to_numpy()
    return hl


def _stability(r: Report, s: Series):
    return stability.stability(s, r.flow, r.risk_factors)


#: how each on-demand part is computed from the report and its shared views.
_PARTS = {
    "statistics": lambda r, s: s.stats,
    "flow": lambda r, s: flow.flow_characteristics(s),
    "health": _hl,
    "risk_factors": lambda r, s: health.risk_factors(s, r.flow),
    "regions": lambda r, s: flow.regions(s),
    "dynamics": lambda r, s: dynamics.dynamics(s),
    "convergence": lambda r, s: dynamics.convergence(s, r.health),
    "network": lambda r, s: network.flow_network(s, r.flow),
    "critical_paths": lambda r, s: network.critical_paths(s),
    "distribution": lambda r, s: interplay.distribution(s, (r.health["health"] != "Unknown").to_numpy()),
    "interactions": lambda r, s: interplay.interactions(s),
    "stability": _stability,
    "groups": lambda r, s: advice.layer_groups(s, r.health),
    "suggestions": lambda r, s: advice.suggestions(r.risk_factors, r.regions),
    "priorities": lambda r, s: advice.priorities(
        r.health, r.suggestions, r.regions, r.groups, r.dynamics, r.stability.forecast
    ),
    "weight_drift": lambda r, s: drift_from_run(r.run, s.update_rows),
    "explosion": lambda r, s: gradient_explosion(r.run.layer_names, s.exact["max_abs_max"], r.thresholds.exploding),
}
