"""Measured damage to the objective: what lets a statistical pattern (a *symptom*: weight growth,
small or large gradients, a spike, a rebound, a plateau, update ratios) be more than information.
A symptom alone is at most Low; with damage it keeps its priority (``causes._engine``). A NaN/Inf
gradient is damage whatever the objective.

Damage is read from the loss the run logged, against its own noise (``loss.loss_evidence``) and its
task (``task.Task``): the loss went NaN/Inf; it diverged (rose above its running minimum beyond its
own step-to-step noise and ended above where it started); it sits at or above the task's chance
level; or it stopped improving (``_stalled``: it did not fall, or came down by less than half and
its last third no longer falls beyond its noise). An objective that is not judged (adversarial, a policy gradient, an unclassified
expression) has unknown damage: only a NaN counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .loss import LOSS_SMOOTH_STEPS, LossEvidence
from .stats import trailing_median
from .task import Task
from .trend import MIN_POINTS, theil_sen

#: a loss that came down by less than this share of where it started (or of chance level) and no
#: longer falls has stopped improving: damage. Set between the zoo's too-high learning rates that
#: stall high (GPT-2 at 0.68-0.70 of chance) and healthy training that came down far (a GCN at 0.14);
#: 33 of the zoo's 90 healthy runs end above it (fine-tuning from a low start, slow steady falls),
#: and none of them shows a Medium or higher symptom, with or without the damage rule.
STALLED_LEVEL = 0.5


@dataclass(frozen=True)
class Damage:
    """What the loss shows of the harm done."""

    kind: str  #: nonfinite, diverged, chance, stalled
    text: str  #: in words, with the numbers
    total: bool  #: the run is lost (NaN, diverged, never left chance): its top finding is Critical
    #: the step the damage began (the first NaN/Inf, the loss's rebound), when it has one: a symptom
    #: that began after it is its consequence, not its cause (chance level and a stall have none)
    onset: int | None = None


def skipped_rows(run, L: LossEvidence) -> np.ndarray | None:
    """The recorded steps (rows) with non-finite gradients in a trainable layer, when every one of
    them was left out of the weights (every trainable layer's weight norm finite at the next
    recorded step) and the loss stayed finite: AMP's GradScaler skipping a step whose scaled
    gradient overflowed, by design, which harms nothing. None otherwise (also when the weights were
    not recorded, or the last step is one of them: what the optimizer did with it is unknown)."""
    if L.nonfinite_step is not None or not run.n_steps:
        return None
    trainable = np.flatnonzero(run.trainable_mask())
    rows = np.flatnonzero((run.metric("nonfinite")[:, trainable] > 0).any(axis=1))
    if not rows.size or rows[-1] + 1 >= run.n_steps:
        return None
    after = run.metric("weight_norm")[np.ix_(rows + 1, trainable)]
    return rows if bool(np.isfinite(after).all()) else None


def damage(run, L: LossEvidence, task: Task, chance_tolerance: float) -> Damage | None:
    """The damage the logged loss shows, or None (none measured, or none measurable). Non-finite
    gradients that were left out of the weights (``skipped_rows``) are none."""
    if L.nonfinite_step is not None:
        return Damage("nonfinite", f"the loss diverged (NaN/Inf from step {L.nonfinite_step})", True, L.nonfinite_step)
    bad = np.nansum(run.metric("nonfinite"), axis=1) > 0 if run.n_steps else np.zeros(0, bool)
    if bad.any() and skipped_rows(run, L) is None:  # a NaN loss is stored as not logged: the gradients say it
        first = int(run.steps[np.argmax(bad)])
        return Damage("nonfinite", f"the gradients went NaN/Inf from step {first}", True, first)
    if not L.logged:
        return None
    if not task.judged:
        return None
    if L.diverged:
        return Damage(
            "diverged",
            f"the loss diverged: it climbed back to {L.rebound_to:.3g} from {L.rebound_from:.3g} and ended at "
            f"{L.end:.3g}, above its start {L.start:.3g}",
            True,
            L.rebound_step,
        )
    chance = task.chance
    if chance is not None and L.trend is not None and L.trend.n >= MIN_POINTS:
        tol = chance_tolerance * chance
        y = run.scalar("loss").astype(np.float64)
        y = y[np.isfinite(y)]
        low = float(trailing_median(y, LOSS_SMOOTH_STEPS).min())
        if abs(L.end - chance) <= tol and low >= chance - tol:
            return Damage(
                "chance",
                f"the loss never left chance level, ln({task.classes or 2}) = {chance:.3g}: the model learned nothing",
                True,
            )
        if L.end >= chance - tol:
            return Damage(
                "chance",
                f"the loss ended at {L.end:.3g}, "
                + (f"{L.end / chance:.3g}x" if L.end > chance + tol else "at")
                + f" the chance level ln({task.classes or 2}) = {chance:.3g}",
                False,
            )
    stalled = _stalled(run, L, chance)
    if stalled is not None:
        return Damage("stalled", stalled, False)
    return None


def _stalled(run, L: LossEvidence, chance: float | None) -> str | None:
    """Why the loss stopped improving, or None: it did not fall (``LossEvidence.fell``: by
    ``LOSS_FELL`` with a certain trend) and did not converge; or it came down by less than
    ``STALLED_LEVEL`` (from its start, or from chance level when it started above it: a first
    explosion inflates the start) and its last third no longer falls beyond its own noise."""
    if L.converged or L.trend is None or L.trend.n < MIN_POINTS:
        return None
    if not L.fell:
        return f"the loss did not improve beyond its noise: {L.start:.3g} at the start, {L.end:.3g} at the end"
    ref = min(L.start, chance) if chance is not None else L.start
    if not (ref > 0 and L.end > STALLED_LEVEL * ref):
        return None
    y, steps = run.scalar("loss").astype(np.float64), run.steps.astype(np.float64)
    fin = np.isfinite(y)
    y, steps = y[fin], steps[fin]
    k = y.size // 3
    tail = theil_sen(y[-k:], steps[-k:]) if k >= MIN_POINTS else None
    if tail is None or tail.falling:
        return None
    what = "chance level" if chance is not None and ref == chance else "its start"
    return (
        f"the loss stopped improving at {L.end:.3g}, {L.end / ref:.0%} of {what} ({ref:.3g}): its last "
        f"{k} values no longer fall beyond their noise"
    )
