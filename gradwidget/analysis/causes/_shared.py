"""Small lookups several causes share: layer names, first flagged steps, the output layer and its
classes, and the phrases two actions use."""

from __future__ import annotations

import numpy as np

from ..risk_factor import RiskFactor
from ..task import output_layer
from ..stats import _quiet


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


def output_bias_grad(run) -> float:
    """Largest |g| of the output layer's bias at the first recorded step (NaN without one). For a
    cross entropy averaged over the batch each entry is a mean of (p - y), so at most 1."""
    out = output_layer(run)
    if out is None or run.n_steps == 0:
        return float("nan")
    b = [i for i, info in enumerate(run.layers) if info.module == out.module and info.name.endswith("bias")]
    return float(run.metric("max_abs")[0, b[0]]) if b else float("nan")


def lr_change(run, verb: str, factor: float, upto: float | None = None) -> str:
    """ "lower the learning rate about 10x: from 0.1 (the schedule's peak; 0.001 at the end) to 0.01":
    the change, from the rate the user set (a schedule's peak: a decayed last value alone misleads)
    to a concrete value to try (up to ``upto`` times the rate, when a range is meant)."""
    lr = run.scalar("lr") if run.n_steps else np.zeros(0)
    lr = lr[np.isfinite(lr) & (lr > 0)]
    times = f"{factor:g}x" if factor >= 1 else f"{1 / factor:g}x"
    if upto is not None:
        times = f"{factor:g}-{upto:g}x" if factor >= 1 else f"{1 / factor:g}-{1 / upto:g}x"
    what = f"{verb} the learning rate about {times}"
    if not lr.size:
        return what
    peak, last = float(lr.max()), float(lr[-1])
    was = f"{peak:.3g}" + (f" (the schedule's peak; {last:.3g} at the end)" if peak > 1.5 * last else "")
    to = f"{peak * factor:.3g}" + (f" (up to {peak * upto:.3g})" if upto is not None else "")
    return f"{what}: from {was} to {to}"


def _typical_norm(run) -> str:
    g = run.scalar("global_norm") if run.n_steps else np.zeros(0)
    g = g[np.isfinite(g) & (g > 0)]
    return f"{np.median(g[: max(1, g.size // 4)]):.3g}" if g.size else "the typical global norm"


def clip_text(run, exploded: bool = True) -> str:
    """Clipping advice, unless the trainer already clips (``run.meta["clipped_at"]``, written by the
    trainer callbacks): then its threshold is what to revisit, and that it hides an explosion only
    where ``exploded`` (exploding gradients were seen)."""
    at = run.meta.get("clipped_at") if isinstance(run.meta, dict) else None
    if at is not None:
        if exploded:
            return f"the trainer already clips at {at:g}: that hides the explosion, it does not fix it"
        return f"the trainer already clips the gradient norm at {at:g}"
    return (
        f"clip the global gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), "
        f"max_norm≈{_typical_norm(run)}))"
    )
