"""Analysis engine: pure, vectorised functions from a Run to a Report (no I/O, no widgets).

``analyze(run)`` computes what every output shows, once, over shared views of the run
(``stats.Series``): the per-layer flow characteristics and risk factors the health table reads,
the evidence, and the diagnoses (``causes/``: one module per cause). The original crate's other
analyses (network, critical paths, stability, groups, advice, interplay, the explosion table) are
the Report's on-demand properties: computed on first use, never on the panel's refresh.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd

from ..rules import CANNOT_MOVE_WHY
from ..run import Run
from .._args import check_objective
from ..thresholds import as_thresholds
from . import causes, dynamics, evidence, flow, health, network, noise_scale, nonfinite, stats
from .task import task_of
from .report import Report
from .weights import analyze_weights, weights_from_module

__all__ = ["analyze", "Report", "analyze_weights", "weights_from_module"]


def analyze(
    run: Run,
    thresholds=None,
    weights=None,
    previous_weights=None,
    max_rows: int = stats.MAX_ROWS,
    objective: str = "auto",
) -> Report:
    """Analyse ``run`` and return a Report.

    ``thresholds`` overrides ``run.thresholds`` (a Thresholds or a dict of overrides). ``weights``
    (``{name: array}`` or a torch module) adds the weight section; ``previous_weights`` adds drift
    between the two snapshots. Runs longer than ``max_rows`` recorded steps are analysed on bounded
    views (see ``stats.Series``); extremes and flag counts stay exact. ``objective`` says what the
    loss is (``gradwidget._args.OBJECTIVES``): ``"auto"`` takes what the user stated when recording
    (``Recorder(..., objective=...)``, kept in ``run.meta["objective"]``), else reads it off the
    loss's autograd graph; ``"loss"`` a loss to minimise; ``"adversarial"``, ``"policy_gradient"``
    or ``"other"`` an objective whose trajectory is not judged. Any other value overrides the one
    stated when recording. The report's notes say what was assumed.
    """
    check_objective(objective)
    weights, previous_weights = _check_args(run, weights, previous_weights, max_rows)
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    if thresholds is not None:  # a Thresholds replaces the run's; a dict overrides some of them
        t = as_thresholds(dict(run.thresholds.to_dict(), **thresholds) if isinstance(thresholds, dict) else thresholds)
        run = copy.copy(run)  # shares the arrays; only this view sees the new thresholds
        run.thresholds = t
    t = run.thresholds  # checked when it was made (Thresholds.__post_init__)
    notes = []
    if run.n_steps == 0:
        notes.append("the run has no recorded steps: every layer is Unknown")
    if run.history is not None and run.history.n_steps:
        notes.append(
            f"the analysis covers the rolling window (steps {int(run.steps[0])}–{int(run.steps[-1])}); "
            f"{run.history.n_steps} older, decimated rows are in run.history"
        )
    notes.extend(
        n for n in (network.dropped_edges_note(run), network.cycle_note(run), noise_scale.no_estimate_note(run)) if n
    )
    s = stats.Series(run, max_rows)
    if run.n_steps > max_rows:
        notes.append(
            f"{run.n_steps} steps: distribution statistics use {max_rows} evenly spaced steps, "
            f"trends a {s.block}-step block average; extremes and flag counts use every step"
        )
    fl = flow.flow_characteristics(s)
    factors = health.risk_factors(s, fl)
    hl = health.layer_health(s, fl, factors)
    regs = flow.regions(s)
    dyn = dynamics.dynamics(s)
    loss = evidence.loss_evidence(run)
    task = task_of(run, objective)
    if loss.logged and task.assumed:
        notes.append(f"objective: {task.assumed}")
    ctx = causes.Context(s, factors, regs, dyn, loss, evidence.architecture(run), task)
    found = causes.diagnose(ctx)
    hl["health"] = causes.layer_verdicts(run, found, s.cannot_move)  # one verdict: the layers the diagnoses name
    overall = causes.verdict(found)
    if overall == "Healthy" and (hl["health"] == "Unknown").all():  # nothing recorded to judge
        overall = "Unknown"
    wrep = analyze_weights(weights, previous_weights, t) if weights is not None else None
    report = Report(
        run=run,
        thresholds=t,
        overall_health=overall,
        layers=_layers_table(run, s, fl, hl, found),
        diagnoses=found,
        loss=loss,
        weights=wrep,
        nonfinite_origin=nonfinite.nonfinite_origin(run),
        noise_scale=ctx.noise,
        notes=notes,
        task=task,
    )
    report._series = s
    report._parts.update(flow=fl, health=hl, risk_factors=factors, regions=regs, dynamics=dyn)
    if wrep is not None:
        wrep.explosion = report.explosion
    return report


#: fewest rows ``max_rows`` may keep: trends, plateaus and correlations need a handful of points.
ANALYSIS_MIN_ROWS = 16


def _check_args(run, weights, previous_weights, max_rows):
    """Reject wrong arguments at the API edge with a message saying what to pass (a deep
    AttributeError or ZeroDivisionError says neither); return the weights as ``{name: array}``."""
    if not isinstance(run, Run):
        raise TypeError(f"analyze() needs a gradwidget Run (e.g. recorder.run), not {type(run).__name__}")
    if run.n_layers == 0:
        raise ValueError(
            "the run has no layers, so there is nothing to analyse: record a model with trainable "
            "parameters (or pass named arrays to ArrayRecorder.record)"
        )
    if isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer)):
        raise TypeError(f"max_rows must be an int (rows analysed at full resolution), not {type(max_rows).__name__}")
    if max_rows < ANALYSIS_MIN_ROWS:
        raise ValueError(
            f"max_rows must be at least {ANALYSIS_MIN_ROWS} (trends need a handful of rows), got {max_rows}"
        )
    if previous_weights is not None and weights is None:
        raise ValueError("previous_weights needs weights too: drift is measured between the two snapshots")
    return _as_weights(weights, "weights"), _as_weights(previous_weights, "previous_weights")


def _as_weights(w, what: str):
    """``{name: array}`` from a dict or a torch module; None stays None; anything else is an error."""
    if w is None:
        return None
    if isinstance(w, dict):
        if not w:
            raise ValueError(f"{what} is an empty dict: pass {{layer name: array}} or a torch module")
        bad = [k for k in w if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{what} keys must be layer names (str), got {type(bad[0]).__name__} {bad[0]!r}")
        return w
    if callable(getattr(w, "named_parameters", None)):
        return weights_from_module(w)
    raise TypeError(
        f"{what} must be a dict {{layer name: array}} or a torch module (nn.Module), not {type(w).__name__}"
    )


def _layers_table(run: Run, s: stats.Series, fl: pd.DataFrame, hl: pd.DataFrame, found) -> pd.DataFrame:
    """The health table: one row per layer; ``cause`` and ``suggestion`` are the top-ranked
    diagnosis naming the layer and its action."""
    o = run.nonfinite_origin
    row = nonfinite.origin_layer(run, o) if o is not None else None
    origin = ["" for _ in run.layer_names]
    if o is not None and row is not None:
        origin[row] = f"first NaN/Inf made here: {o.module} ({o.phase}, step {o.step})"
    top: dict[str, tuple[str, str]] = {}
    for r in found:  # ranked: the first per layer is its top diagnosis
        for n in r.layers:
            top.setdefault(n, (r.cause, f"{n}: {r.action}"))
    for i in np.flatnonzero(hl["health"].to_numpy() == health.CANNOT_MOVE):  # normal: say why
        top.setdefault(run.layer_names[i], ("", f"nothing to do: {CANNOT_MOVE_WHY}"))
    ex = s.exact
    return pd.DataFrame(
        {
            "layer": run.layer_names,
            "module_type": [info.module_type for info in run.layers],
            "numel": [int(info.numel) for info in run.layers],
            "status": [info.status for info in run.layers],
            "tied": [", ".join(info.tied) for info in run.layers],  # its other names (tied weights)
            "health": hl["health"].to_numpy(),
            "risk": hl["risk"].to_numpy(),
            "grad_norm_median": s.stat("grad_norm", "median"),
            "mean_abs_median": s.stat("mean_abs", "median"),
            "max_abs_max": ex["max_abs_max"],
            "zero_frac_mean": s.stat("zero_frac", "mean"),
            "nonfinite_total": ex["nonfinite_total"],
            "vanishing_share": ex["vanishing_share"],
            "exploding_share": ex["exploding_share"],
            "dead_share": ex["dead_share"],
            "stability": fl["stability"].to_numpy(),
            "trend": fl["trend"].to_numpy(),
            "direction": fl["direction"].to_numpy(),
            "flags": hl["flags"].to_numpy(),
            "cause": [top.get(n, ("", ""))[0] for n in run.layer_names],
            "origin": origin,  # the row standing for where the first NaN/Inf was made
            "suggestion": [top.get(n, ("", ""))[1] for n in run.layer_names],
        }
    )
