"""``lr_too_high``: steps too large for the model. Reads the loss (a rebound above its running
minimum, spikes above its start), the typical layer's update/weight ratio (above
``Thresholds.update_ratio_high``, or far above it when the loss falls cleanly), the weight norms'
growth (``Thresholds.weight_blowup``) and units that died during training. It explains the
exploding gradients, dead units, plateau and the NaN that follow it; its evidence rules out a
learning rate too low."""

from __future__ import annotations

import numpy as np

from ..evidence import LOSS_SMOOTH_STEPS, LOSS_SPIKE, adaptive_optimizer, line_search_optimizer, weight_growth
from ...rules import vanishing_flags
from ..stats import _quiet, dead_flags
from ..stats import fmt_num as _fmt
from ._base import CauseRule, Context, Diagnosis
from ._shared import clip_text, first_flagged_step, lr_change, start_step

#: a loss that jumps back above LOSS_SPIKE x its start on this share of steps is swinging.
LOSS_SPIKE_SHARE = 0.05
#: the typical layer's update/weight ratio that counts when the loss still falls cleanly or is not
#: logged: small models learn well at 0.1-0.3 (the zoo's healthy MLP and CNN runs).
UPDATE_RATIO_UNLOGGED = 1.0


def find(c: Context) -> Diagnosis | None:
    run, L, t = c.run, c.loss, c.t
    signals: list[tuple[int | None, str]] = []
    if L.logged and L.rebound_step is not None:
        signals.append(
            (
                L.rebound_step,
                f"the loss (its median over the last {LOSS_SMOOTH_STEPS} steps) climbed back to "
                f"{L.rebound_to:.3g} at step {L.rebound_step} after reaching {L.rebound_from:.3g} (the median "
                f"of its first steps: {L.start:.3g})",
            )
        )
    if L.logged and L.spike_share >= LOSS_SPIKE_SHARE:
        signals.append(
            (
                L.spike_step,
                f"the loss jumped above {L.start * LOSS_SPIKE:.3g} ({LOSS_SPIKE:g}x where it started) on "
                f"{L.spike_share:.0%} of steps from step {L.spike_step}",
            )
        )
    # large updates and growing weights are how a small model learns fast; they are evidence only
    # when the loss did not fall cleanly (or was not logged: then only far beyond the healthy band)
    clean = L.logged and L.fell and L.rebound_step is None and L.spike_share < LOSS_SPIKE_SHARE
    too_high = t.update_ratio_high if L.logged and not clean else UPDATE_RATIO_UNLOGGED
    steps_u, ratio = c.update_ratio
    # a line search (LBFGS) sets each step's length itself: its steps' size is no learning rate's
    sized_by_lr = not line_search_optimizer(run)
    hi = np.flatnonzero(ratio > too_high) if sized_by_lr else np.zeros(0, int)
    first_lr = ""
    if adaptive_optimizer(run) and hi.size and hi[0] == 0:
        # an adaptive optimizer's first step moves each weight by about the learning rate, whatever
        # the gradient: its ratio is the learning rate against the weights' size. It is evidence
        # only when that step moved the typical layer by a whole weight norm and the loss then did
        # not fall cleanly (the weights were knocked far from where they started)
        if clean or ratio[0] <= UPDATE_RATIO_UNLOGGED:
            hi = hi[1:]
        else:
            first_lr = " (an adaptive optimizer's first step moves each weight by about the learning rate)"
    if hi.size:
        signals.append(
            (
                int(steps_u[hi[0]]),
                f"the typical layer's update was {_fmt(float(ratio[hi[0]]))} of its weight norm at step "
                f"{int(steps_u[hi[0]])}{first_lr} (healthy: {t.update_ratio_low:g} to {t.update_ratio_high:g})",
            )
        )
    wg = weight_growth(run)
    with _quiet():
        med_growth = float(np.nanmedian(wg[c.s.trainable])) if np.isfinite(wg[c.s.trainable]).any() else np.nan
    if med_growth > t.weight_blowup and sized_by_lr:
        w = run.metric("weight_norm")
        with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
            rows = np.flatnonzero(np.nanmedian(w / w[0], axis=1) > t.weight_blowup) if run.n_steps else np.zeros(0, int)
        signals.append(
            (int(run.steps[rows[0]]) if len(rows) else None, f"the typical layer's weight norm grew {med_growth:.3g}x")
        )
    dead = _died_during_training(c)
    if dead is not None and not clean:
        signals.append(dead)
    if not signals:
        return None
    first = min((s for s, _ in signals if s is not None), default=start_step(run))
    order = np.argsort(-np.nan_to_num(wg, nan=-1.0))  # most affected first: largest weight growth
    layers = [run.layer_names[i] for i in order if c.s.trainable[i] and np.isfinite(wg[i])]
    nonfinite = L.nonfinite_step is not None or (c.s.exact["nonfinite_share"] > 0).any()
    nf_after_rise = L.nonfinite_step is not None and L.rebound_step is not None and L.rebound_step < L.nonfinite_step
    text = "; ".join(s for _, s in signals) + _grey_after(c, first)
    if nf_after_rise or (nonfinite and first is not None):
        text += "; then the values went NaN/Inf"
    return Diagnosis(
        "lr_too_high",
        "Critical" if nonfinite else "High",
        layers,
        first,
        text,
        float(np.clip(0.4 + 0.3 * len(signals), 0, 1)),
    )


def _grey_after(c: Context, first: int | None) -> str:
    """The layers whose gradients sat below the vanishing threshold on most steps after ``first``
    though not before it (the heatmap's grey, which the large steps explain), as a sentence; ""
    when none did."""
    run, t = c.run, c.t
    if first is None or run.n_steps < 4:
        return ""
    after = run.steps > first
    if after.sum() < 2:
        return ""
    flags = vanishing_flags(run.metric("mean_abs"), t) & c.s.trainable[None, :]
    before = flags[~after].mean(axis=0) if (~after).any() else np.zeros(run.n_layers)
    grey = (flags[after].mean(axis=0) >= 0.5) & (before < 0.5)
    n = int(grey.sum())
    if not n:
        return ""
    return (
        f"; after it the gradients of {n} layer{'s' * (n != 1)} stayed below the vanishing threshold "
        f"{t.vanishing:g} on most steps (grey in the heatmap), as they were not before"
    )


def _died_during_training(c: Context) -> tuple[int, str] | None:
    """(step, text) when units that had a gradient went dead during training (too large steps knock
    ReLUs off for good); None when none did, or they were dead from the start (an init problem)."""
    run, t = c.run, c.t
    if run.n_steps < 2:
        return None
    dead = c.dead_layers
    if not dead.any():
        return None
    z = dead_flags(run.metric("zero_frac")[:, dead], run.metric("grad_norm")[:, dead], t)
    first = first_flagged_step(run, z)
    if z[0].any() or first is None:
        return None
    return (first, f"{int(dead.sum())} layers went dead at step {first} (their gradients were alive before)")


def action(d: Diagnosis, c: Context) -> str:
    warm = " with a warmup of a few hundred steps" if c.arch.has_attention else ""
    exploded = "exploding" in d.symptom_layers or any(e.startswith("exploding:") for e in d.explains)
    return f"{lr_change(c.run, 'lower', 0.1)}{warm}; {clip_text(c.run, exploded)}"


def _explains_when(cause: Diagnosis, symptom: Diagnosis) -> bool:
    """Exploding gradients at initialisation are the init's, not the step size's; a NaN only when
    the steps had gone wrong before it."""
    if symptom.cause == "exploding":
        return not symptom.at_init
    if symptom.cause == "nonfinite":
        return cause.first_step is not None and symptom.first_step is not None and cause.first_step < symptom.first_step
    return True


RULE = CauseRule(
    "lr_too_high",
    "learning rate too high",
    find,
    action,
    kind="symptom",
    explains=("exploding", "plateau", "dead_units", "nonfinite"),
    contradicts=("lr_too_low", "learns_nothing"),
    explains_when=_explains_when,
    whole_run=True,
)
