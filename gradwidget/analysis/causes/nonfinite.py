"""``nonfinite``: NaN/Inf gradients or loss. Reads the per-layer non-finite counts, the loss, the
weight norms and the recorded origin (the module and pass that made the first NaN/Inf). Critical,
except where every step with non-finite gradients was left out of the weights (the next recorded
step's weight norms all finite) and the loss stayed finite: AMP's GradScaler skipping a step whose
scaled gradient overflowed, and lowering its scale, by design. That is Low while it stays rare
(``SKIPPED_ROUTINE``), Medium beyond it (the training stalls while the scale backs off). As a
symptom of another cause it is kept right after it when its origin is known (where it began is
worth its own line), folded into it otherwise."""

from __future__ import annotations

import numpy as np

from ..damage import skipped_rows
from ..nonfinite import weight_growth as origin_weight_growth
from ._base import CauseRule, Context, Diagnosis, Fold
from ._shared import names_of

#: share of the recorded steps whose non-finite gradients were left out of the weights (skipped)
#: up to which it is routine loss scaling: Low; beyond it Medium
SKIPPED_ROUTINE = 0.05


def find(c: Context) -> Diagnosis | None:
    run, ex = c.run, c.s.exact
    nf = run.metric("nonfinite")
    bad = np.flatnonzero(c.s.trainable & (ex["nonfinite_share"] > 0))
    loss_step = c.loss.nonfinite_step
    if not bad.size and loss_step is None:
        return None
    with np.errstate(invalid="ignore"):
        first_rows = np.array([np.argmax(nf[:, i] > 0) for i in bad], int)
    grad_step = int(run.steps[first_rows.min()]) if bad.size else None
    first = min(x for x in (grad_step, loss_step) if x is not None)
    # the layers that went non-finite first, loss side first within a step (where it enters the backward)
    bi = np.array([run.layers[i].backward_index for i in bad])
    order = bad[np.lexsort((bi, first_rows))] if bad.size else bad
    layers = names_of(run, order)
    origin = getattr(run, "nonfinite_origin", None)
    if origin is not None and origin.module:  # "" is the loss (or the input): no module of the model
        mod = origin.module
        own = [info.name for info in run.layers if info.module == mod or info.name.startswith(mod + ".")]
        layers = own + [n for n in layers if n not in own]
    parts = []
    if grad_step is not None:
        parts.append(
            f"first NaN/Inf gradients at step {grad_step} in {len(bad)} layer{'s' * (len(bad) != 1)}"
            f" ({int(ex['nonfinite_total'][bad].sum())} entries in total)"
        )
    if loss_step is not None:
        parts.append(f"the loss is NaN/Inf from step {loss_step}")
    if origin is not None:
        where = origin.module or {"loss": "the loss", "input": "the inputs"}.get(origin.phase, "the model")
        parts.insert(0, f"it began in {where} ({origin.phase}{' pass' if origin.module else ''}) at step {origin.step}")
        grown = origin_weight_growth(run, origin)
        if grown >= c.t.weight_blowup:  # the steps had blown the weights up: the module only overflowed first
            parts.append(f"a layer's weight norm had grown {grown:.3g}x by then")
    elif (skipped := skipped_rows(run, c.loss)) is not None:
        parts.append(
            f"each of these {len(skipped)} of {run.n_steps} recorded steps was left out of the weights: they "
            "stayed finite, as did the loss (AMP's GradScaler skipping a step whose scaled gradient "
            "overflowed, and lowering its scale)"
        )
        routine = len(skipped) <= SKIPPED_ROUTINE * run.n_steps
        return Diagnosis("nonfinite", "Low" if routine else "Medium", layers, first, "; ".join(parts), 0.6)
    elif isinstance(off := run.meta.get("nonfinite_tracing"), dict):  # "auto" stopped the tracer before
        at, why = off.get("stopped_at_step", "?"), off.get("reason", "it cost more than it was worth")
        parts.append(f"origin not traced at step {at}: {why}")
    return Diagnosis("nonfinite", "Critical", layers, first, "; ".join(parts), 1.0, origin=origin)


def action(d: Diagnosis, c: Context) -> str:
    run, o = c.run, d.origin
    grew = o is not None and origin_weight_growth(run, o) >= c.t.weight_blowup
    grown = (
        " — and lower the learning rate: the weights had grown before it" if d.after == "lr_too_high" or grew else ""
    )
    if o is not None and o.phase == "input":
        return (
            "check the data: the batch given to the model already holds NaN/Inf "
            "(assert torch.isfinite(x).all() in the data pipeline)"
        )
    if o is not None and o.phase == "loss":
        return (
            "make the loss safe: pass logits to a log-softmax loss (CrossEntropyLoss) instead of taking "
            "log() of probabilities, or clamp them (p.clamp_min(1e-8)) before the log" + grown
        )
    if o is not None and o.module:
        where = "its backward" if o.phase == "backward" else "its forward"
        return (
            f"fix {o.module}: {where} makes the first NaN/Inf from finite values — add an eps to "
            "divisions, sqrt and log there, or clamp its input; under fp16/bf16 autocast keep that op "
            "in float32" + grown
        )
    skipped = skipped_rows(run, c.loss) if o is None else None  # as ``find`` read it, whatever the rank
    if skipped is not None:
        if len(skipped) <= SKIPPED_ROUTINE * run.n_steps:
            return (
                "nothing to change while it stays rare: GradScaler skips an overflowing step and lowers its "
                "scale; to skip fewer, start from a lower scale (torch.amp.GradScaler(init_scale=2.0**10)) "
                "or train under bfloat16 autocast, which needs no scaler"
            )
        return (
            "find the op that overflows under float16: record with Recorder(model, optimizer, "
            "trace_nonfinite=True) and keep that op in float32 (autocast(enabled=False) around it), or "
            "train under bfloat16 autocast, which needs no scaler"
        )
    checks = (
        "check the loss for log(0) or division by zero, add an eps to divisions and sqrt, and use a "
        "GradScaler under fp16 autocast"
    )
    if isinstance(run.meta.get("nonfinite_tracing"), dict):  # the torch Recorder looked, and could not trace it
        return (
            "record it again with Recorder(model, optimizer, trace_nonfinite=True) to find the module "
            f"where it starts (hooks on every step; the evidence says why this run could not); {checks}"
        )
    return f"find where it starts (gradwidget records the origin with the torch Recorder): {checks}"


def _folded_as(symptom: Diagnosis, cause: Diagnosis) -> Fold:
    return "after" if symptom.origin is not None else "fold"


RULE = CauseRule("nonfinite", "NaN/Inf values", find, action, kind="observation", folded_as=_folded_as)
