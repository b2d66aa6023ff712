"""The rules for causes in how training is set up (the step size and the scale of what goes in
and comes out): gradients never reset, a summed loss, unnormalised inputs, a learning rate too high
or too low, a squashed output, a plateau. Each reads the ``Context`` and returns a ``Cause`` or
None; the bounds they use are in ``vocabulary``."""

from __future__ import annotations

import numpy as np

from ..collect.loss_graph import LossGraph
from .evidence import LOSS_SPIKE, LossEvidence, accumulation_smoothing, early_growth, input_rms, weight_growth
from .stats import _quiet, dead_flags
from .stats import fmt_num as _fmt
from .vocabulary import (
    ACCUMULATION_EXPONENT,
    ACCUMULATION_FIRST_RATIO,
    ACCUMULATION_MAX_STEP_RATIO,
    ACCUMULATION_RISING,
    CHANCE_TOLERANCE,
    FLOOR_TOLERANCE,
    GROWTH_FACTOR,
    INPUT_RMS_HIGH,
    INPUT_RMS_LOW,
    LOSS_SPIKE_SHARE,
    MEAN_LOSS_BIAS_GRAD,
    SATURATED_NEAR_FLOOR,
    SATURATED_TAIL_CHANGE,
    SLOW_FALL_SE,
    SMOOTH_EARLY_FACTOR,
    SMOOTH_GROWTH,
    SMOOTH_LATE_CHANGE,
    SMOOTH_RISING,
    STUCK_LOSS_LEVEL,
    SUMMED_LOSS_START,
    UPDATE_RATIO_TOO_HIGH,
    UPDATE_RATIO_TOO_LOW,
    UPDATE_RATIO_UNLOGGED,
    WEIGHT_BLOWUP,
    Cause,
    Context,
    first_flagged_step,
    growing_first,
    output_bias_grad,
    output_classes,
    output_layer,
    start_step,
)


def _missing_zero_grad(c: Context) -> Cause | None:
    """Two fingerprints of gradients summed over steps: at the very start the norm doubles at the
    second step and grows like the step count (consecutive gradients still point the same way);
    over the first 40 steps every layer's norm grows smoothly, its step-to-step change shrinking
    like 1/step, while batch noise keeps a healthy layer changing by 10-50% a step."""
    run = c.run
    gr = early_growth(run)
    sm = accumulation_smoothing(run)
    parts = []
    conf = 0.0
    if gr is not None and (
        gr.exponent >= ACCUMULATION_EXPONENT
        and gr.rising >= ACCUMULATION_RISING
        and gr.max_step_ratio <= ACCUMULATION_MAX_STEP_RATIO
        and gr.power_law
        and ACCUMULATION_FIRST_RATIO[0] <= gr.first_ratio <= ACCUMULATION_FIRST_RATIO[1]
    ):
        g = run.scalar("global_norm")[:20]
        g = g[np.isfinite(g)]
        if g.size and g[0] > 0 and g.max() / g[0] >= GROWTH_FACTOR:
            parts.append(
                f"the global gradient norm grows like the step count from the start (x{gr.first_ratio:.2f} "
                f"at the second step, ~(step+1)^{gr.exponent:.2f}, rising on {gr.rising:.0%} of the first "
                f"steps, x{g.max() / g[0]:.1f} within {g.size} steps)"
            )
            conf = float(np.clip((gr.exponent - 0.5) / 0.5, 0, 1))
    if sm is not None and (
        sm.late <= SMOOTH_LATE_CHANGE
        and sm.early >= SMOOTH_EARLY_FACTOR * sm.late
        and sm.growth >= SMOOTH_GROWTH
        and sm.rising >= SMOOTH_RISING
    ):
        parts.append(
            f"every layer's gradient norm grows smoothly (x{sm.growth:.3g} over the first steps, rising on "
            f"{sm.rising:.0%} of them) and its step-to-step change shrinks from {sm.early:.0%} to "
            f"{sm.late:.1%}, as a running sum's does (batch noise alone keeps it near 10-50%)"
        )
        conf = max(conf, float(np.clip(1 - sm.late / SMOOTH_LATE_CHANGE, 0.5, 1)))
    if not parts:
        return None
    return Cause(
        "missing_zero_grad",
        "High",
        growing_first(run),
        start_step(run),
        "; ".join(parts) + ": each step's gradient is added to the last",
        conf,
    )


def _loss_scale(c: Context) -> Cause | None:
    """A loss summed over the batch: it starts far above a per-sample loss and the output bias
    gradient exceeds a batch mean's bound; the loss's graph, when recorded, settles it (a
    ``reduction="mean"`` loss is never this, whatever its size)."""
    L = c.loss
    if not L.logged or not (L.start > SUMMED_LOSS_START):
        return None
    graph = LossGraph.of_run(c.run)
    summed = None if graph is None else graph.summed
    if summed is False:  # a mean over the batch: the large loss is large outputs or targets
        return None
    ob = output_bias_grad(c.run)
    if np.isfinite(ob) and ob <= MEAN_LOSS_BIAS_GRAD:  # a large loss from huge logits, averaged all the same
        return None
    return Cause(
        "loss_scale",
        "Low",
        growing_first(c.run),
        start_step(c.run),
        f"the loss starts at {L.start:.3g}, far above a per-sample loss (a cross entropy starts near "
        f"ln(classes), under 12)"
        + (
            f", and the output bias gradient reaches {ob:.3g} where a batch mean of (p - y) stays within 1"
            if np.isfinite(ob)
            else ""
        )
        + (f"; the loss's graph shows {graph.reducer}(reduction='sum')" if summed and graph else "")
        + ": it looks summed over the batch, which multiplies every gradient by the batch size",
        1.0 if summed else float(np.clip(np.log10(L.start / SUMMED_LOSS_START) + 0.5, 0, 1)),
    )


def _input_scale(c: Context) -> Cause | None:
    rms = input_rms(c.run, c.arch)
    if not np.isfinite(rms) or INPUT_RMS_LOW <= rms <= INPUT_RMS_HIGH:
        return None
    layers = [c.run.layer_names[i] for i in c.arch.input_layers]
    side = "large" if rms > INPUT_RMS_HIGH else "small"
    return Cause(
        "input_scale",
        "High",
        layers,
        start_step(c.run),
        f"the data entering {layers[0]} has an RMS of about {rms:.3g} (normalised data: about 1), "
        f"read off its weight and bias gradients: the inputs are far too {side}",
        float(np.clip(abs(np.log10(rms)) / 3, 0, 1)),
    )


def _lr_too_high(c: Context) -> Cause | None:
    run, L = c.run, c.loss
    signals: list[tuple[int | None, str]] = []
    if L.logged and L.rebound_step is not None:
        signals.append(
            (
                L.rebound_step,
                f"the loss climbed back to {L.rebound_to:.3g} at step {L.rebound_step} "
                f"after reaching {L.rebound_from:.3g} (it started at {L.start:.3g})",
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
    clean = (
        L.logged
        and L.fell
        and L.rebound_step is None  # a NaN after a clean fall has its own cause
        and L.spike_share < LOSS_SPIKE_SHARE
    )
    too_high = UPDATE_RATIO_TOO_HIGH if L.logged and not clean else UPDATE_RATIO_UNLOGGED
    steps_u, ratio = c.update_ratio
    hi = np.flatnonzero(ratio > too_high)
    if hi.size:
        signals.append(
            (
                int(steps_u[hi[0]]),
                f"the typical layer's update was {_fmt(float(ratio[hi[0]]))} of its "
                f"weight norm at step {int(steps_u[hi[0]])} (healthy: 1e-4 to 1e-2)",
            )
        )
    wg = weight_growth(run)
    with _quiet():
        med_growth = float(np.nanmedian(wg[c.s.trainable])) if np.isfinite(wg[c.s.trainable]).any() else np.nan
    if med_growth > WEIGHT_BLOWUP:
        w = run.metric("weight_norm")
        with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
            rows = np.flatnonzero(np.nanmedian(w / w[0], axis=1) > WEIGHT_BLOWUP) if run.n_steps else np.zeros(0, int)
        signals.append(
            (int(run.steps[rows[0]]) if len(rows) else None, f"the typical layer's weight norm grew {med_growth:.3g}x")
        )
    dead = _died_during_training(c)
    if dead is not None and not clean:
        signals.append(dead)
    nf_after_rise = L.nonfinite_step is not None and L.rebound_step is not None and L.rebound_step < L.nonfinite_step
    if not signals:
        return None
    first = min((s for s, _ in signals if s is not None), default=start_step(run))
    # most affected first: largest weight growth
    order = np.argsort(-np.nan_to_num(wg, nan=-1.0))
    layers = [run.layer_names[i] for i in order if c.s.trainable[i] and np.isfinite(wg[i])]
    nonfinite = L.nonfinite_step is not None or (c.s.exact["nonfinite_share"] > 0).any()
    text = "; ".join(t for _, t in signals)
    if nf_after_rise or (nonfinite and first is not None):
        text += "; then the values went NaN/Inf"
    return Cause(
        "lr_too_high",
        "Critical" if nonfinite else "High",
        layers,
        first,
        text,
        float(np.clip(0.4 + 0.3 * len(signals), 0, 1)),
    )


def _died_during_training(c: Context) -> tuple[int, str] | None:
    """(step, text) when units that had a gradient went dead during training (too large steps knock
    ReLUs off for good); None when none did, or they were dead from the start (an init problem)."""
    run, t = c.run, c.run.thresholds
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


def _saturated_output(c: Context) -> Cause | None:
    """A squashing op fed to a loss that applies it itself (softmax before ``cross_entropy``, sigmoid
    before ``binary_cross_entropy_with_logits``), read off the loss's autograd graph when the loss was
    logged as a tensor: certain, whatever the numbers look like. Without that graph, the loss
    trajectory: a cross entropy of probabilities starts at ln(classes) like any classifier but can
    never fall below ln(1 + (classes - 1)/e), the value at a one-hot softmax output."""
    run = c.run
    graph = LossGraph.of_run(run)
    if graph is not None:
        if not graph.mistakes:
            return None  # the graph shows logits going into the loss: nothing to guess from the numbers
        m = graph.mistakes[0]
        out = output_layer(run)
        layers = [info.name for info in run.layers if out is not None and info.module == out.module]
        where = f" by the model's last module {m.module or 'itself'}" if m.in_model else " in the loss code"
        return Cause(
            "saturated_output",
            "High",
            layers,
            start_step(run),
            f"the loss's autograd graph shows {m.what} ({' <- '.join(m.ops)}, applied{where}): the output "
            f"saturates and its gradients shrink" + (f"; the output layer is {out.module}" if out else ""),
            1.0,
            at_init=True,
        )
    return _saturated_by_loss(c)


def _saturated_by_loss(c: Context) -> Cause | None:
    """Without the loss's graph: a loss that started at ln(C), never went below the softmax floor
    ln(1 + (C - 1)/e), and flattened just above it."""
    run, L = c.run, c.loss
    C = output_classes(run)
    if C is None or not L.logged or run.n_steps < 20:
        return None
    chance = float(np.log(C))
    floor = float(np.log1p((C - 1) / np.e))
    if not (abs(L.start - chance) <= CHANCE_TOLERANCE * chance and L.lowest >= FLOOR_TOLERANCE * floor):
        return None
    y = run.scalar("loss").astype(np.float64)
    y = y[np.isfinite(y)]
    tail = y[-max(5, y.size // 3) :]
    k = max(1, tail.size // 4)
    if abs(np.median(tail[-k:]) - np.median(tail[:k])) > SATURATED_TAIL_CHANGE * L.start:
        return None
    near = L.end <= (1 + SATURATED_NEAR_FLOOR) * floor
    if not near:
        return None
    return Cause(
        "saturated_output",
        "High",
        [run.layer_names[i] for i in range(run.n_layers) if run.layers[i].backward_index in (0, 1)][:2],
        start_step(run),
        f"the loss started at {L.start:.3g} = ln({C}) like a {C}-class cross entropy but flattened at "
        f"{L.end:.3g}, never below {floor:.3g} = ln(1 + {C - 1}/e): the lowest a cross entropy of "
        "softmax outputs (probabilities, not logits) can reach",
        0.7,
    )


def _slow_steady_fall(run, L: LossEvidence) -> float | None:
    """The loss's fall per 100 steps, in units of its start, when it fell all along but by little
    (a flat start that still descends steadily: steps too small); None otherwise."""
    if not L.logged or L.fell or L.rebound_step is not None or run.n_steps < 20:
        return None
    y = run.scalar("loss").astype(np.float64)
    ok = np.isfinite(y)
    x = run.steps[ok].astype(np.float64)
    y = y[ok]
    if y.size < 20 or not L.start > 0:
        return None
    slope, icpt = np.polyfit(x, y, 1)
    resid = y - (slope * x + icpt)
    se = np.sqrt(np.sum(resid**2) / (y.size - 2) / np.sum((x - x.mean()) ** 2))
    if not (slope < 0 and -slope > SLOW_FALL_SE * se):
        return None
    return float(-slope * 100 / L.start)


def _lr_too_low(c: Context) -> Cause | None:
    run, L = c.run, c.loss
    steps_u, ratio = c.update_ratio
    if not ratio.size or not np.isfinite(ratio).any():
        return None
    med = float(np.nanmedian(ratio))
    loss = f"; the loss moved from {L.start:.3g} to {L.end:.3g}" if L.logged else ""
    tiny = med < UPDATE_RATIO_TOO_LOW and not (L.logged and not L.flat and L.fell)
    slow = None if tiny else _slow_steady_fall(run, L)
    if not tiny and slow is None:
        return None
    ur = c.s.run.metric("update_norm")
    wn = c.s.run.metric("weight_norm")
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        per_layer = np.nanmedian(np.where(wn > 0, ur / wn, np.nan), axis=0)
    order = np.argsort(np.nan_to_num(per_layer, nan=np.inf))
    layers = [run.layer_names[i] for i in order if np.isfinite(per_layer[i])]
    if tiny:
        return Cause(
            "lr_too_low",
            "Medium",
            layers,
            start_step(run),
            f"the typical layer's update is {med:.2g} of its weight norm per step (healthy: 1e-4 to 1e-2)" + loss,
            float(np.clip(np.log10(UPDATE_RATIO_TOO_LOW / med), 0, 1)) if med > 0 else 1.0,
        )
    return Cause(
        "lr_too_low",
        "Medium",
        layers,
        start_step(run),
        f"the loss falls steadily but slowly, {slow:.1%} of its start per 100 steps "
        f"(from {L.start:.3g} to {L.end:.3g}), with gradients that neither vanish nor die: the steps "
        f"are too small (typical update {med:.2g} of the weight norm)",
        0.5,
    )


def _plateau(c: Context) -> Cause | None:
    p, L = c.dyn.plateau, c.loss
    if not p.is_plateau:
        return None
    stuck = L.logged and np.isfinite(L.plateau_level) and L.plateau_level > STUCK_LOSS_LEVEL
    pr = "Medium" if stuck else "Low"
    what = (
        f"the loss has stayed near {L.end:.3g} ({L.plateau_level:.0%} of where it started)"
        if L.logged
        else f"the {c.dyn.series} has flattened"
    )
    return Cause(
        "plateau",
        pr,
        [],
        p.start_step,
        f"{what} for {p.duration_steps} steps (relative change {p.rel_change_per_step:.2g} per step)",
        0.5 if stuck else 0.2,
    )


#: the rules of this module, by cause
RULES = {
    "missing_zero_grad": _missing_zero_grad,
    "loss_scale": _loss_scale,
    "input_scale": _input_scale,
    "saturated_output": _saturated_output,
    "lr_too_high": _lr_too_high,
    "lr_too_low": _lr_too_low,
    "plateau": _plateau,
}
