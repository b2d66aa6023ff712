"""Small lookups several causes share: layer names, first flagged steps, the output layer and its
classes, and the phrases two actions use."""

from __future__ import annotations

import numpy as np

from ...collect.loss_graph import LossGraph
from ..risk_factor import RiskFactor
from ..loss import LOSS_SMOOTH_STEPS
from ..stats import _quiet, trailing_median
from ..trend import MIN_POINTS


def names_of(run, idx) -> list[str]:
    return [run.layer_names[i] for i in idx]


def first_flagged_step(run, flags: np.ndarray) -> int | None:
    """The first recorded step on which any column of ``flags`` (steps x layers) is set."""
    rows = np.flatnonzero(np.asarray(flags).reshape(run.n_steps, -1).any(axis=1)) if run.n_steps else np.zeros(0, int)
    return int(run.steps[rows[0]]) if len(rows) else None


def start_step(run) -> int | None:
    return int(run.steps[0]) if run.n_steps else None


def factors_of(factors: list[RiskFactor], kind: str) -> list[RiskFactor]:
    return sorted((f for f in factors if f.kind == kind), key=lambda f: -f.severity)


def tensors(run, idx, kind: str = "") -> str:
    """ "3 trainable parameter tensors (1,234 values)": how many of them, and how big."""
    return (
        f"{len(idx)} {kind}parameter tensor{'s' * (len(idx) != 1)} ({sum(run.layers[i].numel for i in idx):,} values)"
    )


def growing_first(run) -> list[str]:
    """Every layer with a gradient, the one whose norm grew most over the run first: a cause of the
    whole run (every gradient summed or scaled) affects them all."""
    g = run.metric("grad_norm").astype(np.float64)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        g = np.where(np.isfinite(g) & (g > 0), g, np.nan)
        growth = np.nanmax(g, axis=0) / g[0] if run.n_steps else np.zeros(run.n_layers)
    got = np.asarray(np.isfinite(g).any(axis=0)) if run.n_steps else np.zeros(run.n_layers, bool)
    order = np.argsort(-np.nan_to_num(growth, nan=0.0), kind="stable")
    return [run.layer_names[i] for i in order if got[i]]


def output_layer(run):
    """The output layer's weight: the 2-d weight nearest the loss in the backward order."""
    ws = [
        info
        for info in run.layers
        if info.name.endswith("weight") and len(info.shape) == 2 and info.backward_index >= 0
    ]
    return min(ws, key=lambda info: info.backward_index) if ws else None


def output_classes(run) -> int | None:
    """Classes of the output layer: its weight's number of rows."""
    out = output_layer(run)
    return int(out.shape[0]) if out is not None and out.shape[0] >= 2 else None


def output_bias_grad(run) -> float:
    """Largest |g| of the output layer's bias at the first recorded step (NaN without one). For a
    cross entropy averaged over the batch each entry is a mean of (p - y), so at most 1."""
    out = output_layer(run)
    if out is None or run.n_steps == 0:
        return float("nan")
    b = [i for i, info in enumerate(run.layers) if info.module == out.module and info.name.endswith("bias")]
    return float(run.metric("max_abs")[0, b[0]]) if b else float("nan")


def lr_text(run) -> str:
    """The learning rate in use, when the run logged one, and its peak when a schedule moved it
    well away from that (the rate a user set is the peak: a decayed last value alone misleads)."""
    lr = run.scalar("lr") if run.n_steps else np.zeros(0)
    lr = lr[np.isfinite(lr)]
    if not lr.size:
        return ""
    peak = float(lr.max())
    return f" (now {lr[-1]:.3g}, {peak:.3g} at its peak)" if peak > 1.5 * lr[-1] else f" (now {lr[-1]:.3g})"


def _typical_norm(run) -> str:
    g = run.scalar("global_norm") if run.n_steps else np.zeros(0)
    g = g[np.isfinite(g) & (g > 0)]
    return f"{np.median(g[: max(1, g.size // 4)]):.3g}" if g.size else "the typical global norm"


def clip_text(run) -> str:
    """Clipping advice, unless the trainer already clips (``run.meta["clipped_at"]``, written by the
    trainer callbacks): then its threshold is what to revisit."""
    at = run.meta.get("clipped_at") if isinstance(run.meta, dict) else None
    if at is not None:
        return f"the trainer already clips at {at:g}: that hides the explosion, it does not fix it"
    return (
        f"clip the global gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), "
        f"max_norm≈{_typical_norm(run)}))"
    )


def never_left_chance(run, L, t) -> float | None:
    """ln(classes) when a classifier's loss never left chance level: it ends within
    ``Thresholds.chance_tolerance`` of ln(classes) and its smoothed level never went below that band
    (the model learned nothing); None otherwise, or with too few values to say."""
    C = output_classes(run)
    if C is None or not L.logged or L.trend is None or L.trend.n < MIN_POINTS:
        return None
    graph = LossGraph.of_run(run)
    if graph is not None and not graph.cross_entropy:
        return None
    chance = float(np.log(C))
    y = run.scalar("loss").astype(np.float64)
    y = y[np.isfinite(y)]
    low = float(trailing_median(y, LOSS_SMOOTH_STEPS).min())
    tol = t.chance_tolerance * chance
    return chance if abs(L.end - chance) <= tol and low >= chance - tol else None
