"""``lr_too_low``: steps too small to make progress. Reads the typical layer's update/weight ratio
(below ``Thresholds.update_ratio_low`` while the loss does not fall), the loss's trend (a fall that
is real, its Theil-Sen slope's confidence interval below zero, but slow), and the logged learning
rate: a schedule that took it to nearly nothing (``DEAD_LR`` of its peak) for a good part of the
run (``DEAD_LR_SHARE``) while the loss stopped falling there (a scheduler stepped once per batch
where it was written for epochs). Trainable parameters whose weight norm starts at zero
(zero-initialised layers, LoRA's B matrices) have no ratio and do not count; neither do adapters'
first steps."""

from __future__ import annotations

import numpy as np

from ..evidence import line_search_optimizer
from ..stats import _quiet
from ._base import CauseRule, Context, Diagnosis
from ._shared import lr_change, start_step

#: the loss's fall over the run, in units of its start, below which a significant fall is slow
#: (the zoo's lr x1e-3 runs: 1-15%; its healthy runs fall 20% or more within 120 steps).
SLOW_FALL = 0.2
#: fewest recorded loss values the slow-fall test reads (its trend needs them; fewer: no claim).
SLOW_FALL_MIN_STEPS = 20
#: ... and only with small steps: a typical update/weight ratio under this (the zoo's healthy
#: calibration runs: 2.9e-3 and up; its slow lr_too_low run, GPT-2 with SGD: 1.5e-3). A loss that
#: falls slowly under large steps is a hard task or a small adapter, not a small learning rate.
SLOW_FALL_MAX_UPDATE = 2e-3
#: a learning rate at or below this share of its peak no longer trains (a cosine or linear decay to
#: zero spends the last 2% of its run or less there)
DEAD_LR = 1e-3
#: ... and a run that spent at least this share of its recorded steps there, the loss not falling
#: over them (its median over their last tenth above ``DEAD_LR_FALL`` of the first tenth's), had
#: its schedule end too early
DEAD_LR_SHARE = 0.25
DEAD_LR_FALL = 0.95


def _reading(c: Context) -> tuple[float, bool, float | None, tuple[int, float, float] | None] | None:
    """Which reading of too small steps holds, the first of them that does: ``(med, tiny, slow,
    dead)`` with the typical update/weight ratio ``med`` and one of ``tiny`` (the ratio under the
    healthy band), ``slow`` (``_slow_steady_fall``) or ``dead`` (``decayed``) set; None when none
    holds. Read by ``find`` and by ``action``, which says the change that reading calls for."""
    run, L, t = c.run, c.loss, c.t
    _, ratio = c.update_ratio
    if not ratio.size or not np.isfinite(ratio).any() or L.converged:  # converged: the rate did its job
        return None
    if line_search_optimizer(run):  # a line search (LBFGS) sets each step's length: no rate to raise
        return None
    med = float(np.nanmedian(ratio))
    tiny = med < t.update_ratio_low and not (L.logged and not L.flat and L.fell)
    slow = None if tiny or med >= SLOW_FALL_MAX_UPDATE else _slow_steady_fall(c)
    dead = None if tiny or slow is not None else decayed(c)
    if not tiny and slow is None and dead is None:
        return None
    return med, tiny, slow, dead


def find(c: Context) -> Diagnosis | None:
    run, L, t = c.run, c.loss, c.t
    reading = _reading(c)
    if reading is None:
        return None
    med, tiny, slow, dead = reading
    loss = f"; the loss moved from {L.start:.3g} to {L.end:.3g}" if L.logged else ""
    ur = run.metric("update_norm")
    wn = run.metric("weight_norm")
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        per_layer = np.nanmedian(np.where(wn > 0, ur / wn, np.nan), axis=0)
    order = np.argsort(np.nan_to_num(per_layer, nan=np.inf))
    layers = [run.layer_names[i] for i in order if np.isfinite(per_layer[i])]
    if dead is not None:
        row, peak, low = dead
        return Diagnosis(
            "lr_too_low",
            "Medium",
            layers,
            int(run.steps[row]),
            f"the learning rate fell to {low:.2g} by step {int(run.steps[row])} ({low / peak:.0e} of its peak "
            f"{peak:.3g}) and stayed there for {(run.n_steps - row) / run.n_steps:.0%} of the recorded steps, "
            "while the loss stopped falling" + loss,
            0.7,
        )
    if tiny:
        return Diagnosis(
            "lr_too_low",
            "Medium",
            layers,
            start_step(run),
            f"the typical layer's update is {med:.2g} of its weight norm per step (healthy: "
            f"{t.update_ratio_low:g} to {t.update_ratio_high:g})" + loss,
            float(np.clip(np.log10(t.update_ratio_low / med), 0, 1)) if med > 0 else 1.0,
        )
    return Diagnosis(
        "lr_too_low",
        "Medium",
        layers,
        start_step(run),
        f"the loss falls steadily but slowly, {slow:.1%} of its start per 100 steps "
        f"(from {L.start:.3g} to {L.end:.3g}), with gradients that neither vanish nor die: the steps "
        f"are too small (typical update {med:.2g} of the weight norm)",
        0.5,
    )


def decayed(c: Context) -> tuple[int, float, float] | None:
    """``(row, peak, lr)`` when the logged learning rate fell to ``DEAD_LR`` of its peak for good at
    recorded step ``row`` (``lr`` there), with at least ``DEAD_LR_SHARE`` of the run after it and the
    loss not falling over those steps; None otherwise (no learning rate or loss logged)."""
    run, L = c.run, c.loss
    if not L.logged or not run.n_steps:
        return None
    lr = run.scalar("lr").astype(np.float64)
    if not np.isfinite(lr).all() or not (lr >= 0).all() or not lr.max() > 0:
        return None
    peak = float(lr.max())
    alive = np.flatnonzero(lr > DEAD_LR * peak)
    row = int(alive[-1]) + 1 if alive.size else 0
    n = run.n_steps - row
    if n < SLOW_FALL_MIN_STEPS or n < DEAD_LR_SHARE * run.n_steps:
        return None
    y = run.scalar("loss").astype(np.float64)[row:]
    y = y[np.isfinite(y)]
    k = max(1, y.size // 10)
    if y.size < SLOW_FALL_MIN_STEPS or not np.median(y[-k:]) > DEAD_LR_FALL * np.median(y[:k]):
        return None
    return row, peak, float(lr[row])


def _slow_steady_fall(c: Context) -> float | None:
    """The loss's fall per 100 steps, in units of its start, when its Theil-Sen trend falls for
    certain (the upper end of its confidence interval below zero) but neither the loss
    (``LossEvidence.fell``) nor its fitted line fell by ``SLOW_FALL`` of the start, and it never
    rebounded; None otherwise (also with fewer than ``SLOW_FALL_MIN_STEPS`` values)."""
    L = c.loss
    tr = L.trend
    if not L.logged or L.fell or L.rebound_step is not None or tr is None or tr.n < SLOW_FALL_MIN_STEPS:
        return None
    if not L.start > 0:
        return None
    if not tr.falling or -tr.slope * tr.span >= SLOW_FALL * L.start:
        return None
    return float(-tr.slope * 100 / L.start)


#: weights in these dtypes drop an update below half their spacing (bfloat16: 2**-8 of the weight)
LOW_PRECISION = ("bfloat16", "float16")


def action(d: Diagnosis, c: Context) -> str:
    reading = _reading(c)
    dead = reading[3] if reading is not None else None
    if dead is not None:
        return (
            f"keep the learning rate up while the loss still falls: the schedule took it to {dead[2]:.2g} at step "
            f"{int(c.run.steps[dead[0]])}, long before the run ended. Step the scheduler once per epoch if it "
            "was written for epochs, not once per batch, or give it the run's length in steps "
            "(StepLR(step_size=...), CosineAnnealingLR(T_max=...))"
        )
    text = lr_change(c.run, "raise", 10, 100)
    low = sorted({info.dtype for info in c.run.layers if info.dtype in LOW_PRECISION and info.status == "trainable"})
    if low:
        text += (
            f"; the weights are {' and '.join(low)}, which round away an update much smaller than the weight: "
            "keep float32 weights and train under torch.autocast instead"
        )
    return text


RULE = CauseRule(
    "lr_too_low",
    "learning rate too low",
    find,
    action,
    kind="symptom",
    explains=("plateau",),
    contradicts=("learns_nothing",),
    whole_run=True,
)
