"""From evidence to causes: what is wrong, where, since when, and how sure we are.

One vocabulary (``CAUSES``), one rule per cause. A cause names the layers at fault (most affected
first), the step it began, the numbers that show it, and the symptoms it explains: a learning rate
that is too high explains the exploding gradients and the NaN that follow, so those are folded into
it instead of being listed as problems of their own (``EXPLAINS``). Ranking: priority first, then
``CAUSES`` order, which puts a root cause above the symptoms it can produce.
"""

from __future__ import annotations

import numpy as np

from . import rules_layers, rules_noise, rules_setup
from .evidence import Architecture, LossEvidence, architecture, loss_evidence
from .flow import Region
from .health import Dynamics, RiskFactor
from .stats import Series
from .vocabulary import CAUSE_TITLES, CAUSES, EXPLAINS, PRIORITY_ORDER, WEIGHT_BLOWUP, Cause, Context, start_step

__all__ = [
    "CAUSES",
    "CAUSE_TITLES",
    "EXPLAINS",
    "PRIORITY_ORDER",
    "RULES",
    "WEIGHT_BLOWUP",
    "Cause",
    "Context",
    "find_causes",
    "layer_verdicts",
    "verdict",
]

RULES = {name: {**rules_setup.RULES, **rules_layers.RULES, **rules_noise.RULES}[name] for name in CAUSES}  # in order


# --------------------------------------------------------------------------- folding and ranking
def _fold(found: dict[str, Cause], loss: LossEvidence, start: int | None) -> None:
    """Fold each symptom into the first found cause (in ``CAUSES`` order) that explains it. The NaN
    is folded into a too-high learning rate only when the loss had already climbed before it (a NaN
    out of a steady run has a cause of its own: its origin)."""
    for name in CAUSES:
        cause = found.get(name)
        if cause is None:
            continue
        for sym in EXPLAINS.get(name, ()):
            if sym not in found or sym == name:
                continue
            if sym == "nonfinite" and (name == "lr_too_high" or found[sym].origin is not None):
                if found[sym].origin is not None and name != "lr_too_high":
                    found[sym].after = name  # a consequence, but where it began is worth its own line
                continue
            if sym == "dead_units" and found[sym].first_step == start:  # dead from the start: the init
                continue
            if name == "saturated_output" and sym == "vanishing" and not cause.at_init:
                continue  # guessed from the loss alone, a softmax explains no vanishing (the reverse is likelier)
            if sym == "saturated_output" and found[sym].at_init:
                continue  # read off the loss's graph: a cause of its own, never another's symptom
            s = found.pop(sym)
            cause.explains.append(f"{sym}: {s.evidence}")
            if s.priority == "Critical" or sym == "nonfinite":
                cause.priority = "Critical"
            elif name == "loss_scale":  # a summed loss that blew the steps up is no longer harmless
                cause.priority = min(cause.priority, "High", key=PRIORITY_ORDER.index)
    nf, hi = found.get("nonfinite"), found.get("lr_too_high")
    if (
        nf is not None
        and hi is not None
        and hi.first_step is not None
        and nf.first_step is not None
        and hi.first_step < nf.first_step
    ):
        hi.priority = "Critical"
        if nf.origin is None:
            found.pop("nonfinite")
            hi.explains.append(f"nonfinite: {nf.evidence}")
        else:
            nf.after = "lr_too_high"


def find_causes(
    s: Series, factors: list[RiskFactor], regions: list[Region], dyn: Dynamics, arch: Architecture | None = None
) -> list[Cause]:
    """Every cause the evidence supports, symptoms folded into their causes, ranked: priority first,
    then ``CAUSES`` order."""
    ctx = Context(s, factors, regions, dyn, loss_evidence(s.run), arch or architecture(s.run))
    found = {}
    for name, rule in RULES.items():
        c = rule(ctx)
        if c is not None:
            found[name] = c
    ex = found.get("exploding")
    if ex is not None and ex.at_init:  # outputs huge before any update: the init, not the step size
        for sym in ("lr_too_high", "nonfinite", "dead_units"):
            if sym == "nonfinite" and sym in found and found[sym].origin is not None:
                found[sym].after, ex.priority = "exploding", "Critical"
                continue
            if sym in found:
                folded = found.pop(sym)
                ex.explains.append(f"{sym}: {folded.evidence}")
                if folded.priority == "Critical":
                    ex.priority = "Critical"
    _fold(found, ctx.loss, start_step(s.run))
    out = list(found.values())
    for c in out:  # a consequence ranks with its cause
        if c.after is not None and c.after in found:
            c.priority = found[c.after].priority
    out.sort(
        key=lambda c: (
            PRIORITY_ORDER.index(c.priority),
            CAUSES.index(c.after) + 0.5 if c.after in found else CAUSES.index(c.cause),
        )
    )
    return out


# --------------------------------------------------------------------------- one verdict
def verdict(causes: list) -> str:
    """The run's health from its causes, used by every output (analyze, run.summary(), the panel, the
    report, the CLI): Critical with a Critical cause, Warning with a High or Medium one, else Healthy
    (Low causes, such as frozen layers or a converged plateau, are information)."""
    prios = {c.priority for c in causes}
    if "Critical" in prios:
        return "Critical"
    if prios & {"High", "Medium"}:
        return "Warning"
    return "Healthy"


def layer_verdicts(run, causes: list) -> np.ndarray:
    """Per layer, the worst health any cause gives it: Critical for a Critical cause naming it,
    Warning for a High or Medium one; Healthy otherwise; Unknown for a layer without any gradient
    that no cause names (frozen layers: their status says why)."""
    L = run.n_layers
    rank = np.zeros(L, int)  # 0 healthy, 1 warning, 2 critical
    idx = {n: i for i, n in enumerate(run.layer_names)}
    for c in causes:
        lvl = 2 if c.priority == "Critical" else 1 if c.priority in ("High", "Medium") else 0
        for n in c.layers:
            i = idx.get(n)
            if i is not None:
                rank[i] = max(rank[i], lvl)
    got = np.isfinite(run.metric("grad_norm")).any(axis=0) if run.n_steps else np.zeros(L, bool)
    out = np.where(rank == 2, "Critical", np.where(rank == 1, "Warning", "Healthy")).astype(object)
    out[(rank == 0) & ~got] = "Unknown"
    return out
