"""Causes -> recommendations: one plain-language recommendation per diagnosed cause, naming the layers
at fault, with the one change to make, aware of the architecture (a network with normalisation is never
told to add it, a residual one never told to add skips)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..collect.loss_graph import LossGraph
from .causes import WEIGHT_BLOWUP, Cause
from .evidence import Architecture
from .nonfinite import weight_growth as origin_weight_growth


@dataclass
class Recommendation:
    """One diagnosis a user can act on: the cause, the layers at fault, when it began, the numbers
    that show it, and the one change to make."""

    priority: str  #: Critical / High / Medium / Low
    text: str  #: what is wrong, in plain language
    action: str  #: the one change to make
    layers: list[str]  #: layers at fault, most affected first ([] for the whole run)
    kind: str  #: the cause (kept under its old name for existing code)
    evidence: str = ""  #: the numbers behind it
    score: float = 0.0  #: confidence, 0..1
    cause: str = ""  #: one of ``causes.CAUSES``
    first_step: int | None = None  #: the recorded step it began
    explains: list[str] = field(default_factory=list)  #: symptoms folded into this cause

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _lr_text(run) -> str:
    """The learning rate in use, when the run logged one."""
    lr = run.scalar("lr") if run.n_steps else np.zeros(0)
    lr = lr[np.isfinite(lr)]
    return f" (now {lr[-1]:.3g})" if lr.size else ""


def _typical_norm(run) -> str:
    g = run.scalar("global_norm") if run.n_steps else np.zeros(0)
    g = g[np.isfinite(g) & (g > 0)]
    return f"{np.median(g[: max(1, g.size // 4)]):.3g}" if g.size else "the typical global norm"


def _clip_text(run) -> str:
    """Clipping advice, unless the trainer already clips (``run.meta["clipped_at"]``, written by the
    trainer callbacks): then its threshold is what to revisit."""
    at = run.meta.get("clipped_at") if isinstance(run.meta, dict) else None
    if at is not None:
        return f"the trainer already clips at {at:g}: that hides the explosion, it does not fix it"
    return (
        f"clip the global gradient norm (torch.nn.utils.clip_grad_norm_(model.parameters(), "
        f"max_norm≈{_typical_norm(run)}))"
    )


def _saturated_action(graph: LossGraph | None) -> str:
    """Pass the logits: which squashing op to remove, and where, from the loss's graph when known."""
    m = graph.mistakes[0] if graph is not None and graph.mistakes else None
    where = f" (the model's last module, {m.module or 'the model itself'})" if m is not None and m.in_model else ""
    if m is not None and m.kind == "softmax_nll":
        return (
            f"pass log-probabilities to nll_loss: use log_softmax instead of the softmax{where}, or pass the "
            "logits to cross_entropy"
        )
    if m is not None and m.kind == "sigmoid_bce_with_logits":
        return (
            f"pass the logits: remove the sigmoid{where}; binary_cross_entropy_with_logits applies it itself, "
            "more stably"
        )
    return (
        f"pass the logits to the loss: remove the softmax{where}; CrossEntropyLoss applies log-softmax itself, "
        "so a softmax before it squashes the gradient (apply softmax only to read probabilities)"
    )


def action_for(c: Cause, run, arch: Architecture) -> str:
    """The one change to make for a cause, aware of what the model already has (a network with
    normalisation is never told to add it, a residual one never told to add skips)."""
    k = c.cause
    if k == "nonfinite":
        o = c.origin
        grew = o is not None and origin_weight_growth(run, o) >= WEIGHT_BLOWUP
        grown = (
            " — and lower the learning rate: the weights had grown before it"
            if c.after == "lr_too_high" or grew
            else ""
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
        return (
            "find where it starts (gradwidget records the origin with the torch Recorder): check the loss "
            "for log(0) or division by zero, add an eps to divisions and sqrt, and use a GradScaler under "
            "fp16 autocast"
        )
    if k == "missing_zero_grad":
        return (
            "call optimizer.zero_grad() once per optimizer step, before loss.backward() (to accumulate on "
            "purpose, zero every N micro-batches and divide the loss by N)"
        )
    if k == "loss_scale":
        return (
            "average the loss over the batch (reduction='mean', the default) or divide the summed loss by "
            "the batch size, so the step size does not depend on the batch size"
        )
    if k == "input_scale":
        return (
            "normalise the inputs: subtract the training data's mean and divide by its std per feature or "
            "channel (e.g. torchvision's Normalize, or x = (x - mean) / std)"
        )
    if k == "lr_too_high":
        warm = " with a warmup of a few hundred steps" if arch.has_attention else ""
        return f"lower the learning rate about 10x{_lr_text(run)}{warm}; {_clip_text(run)}"
    if k == "not_in_optimizer":
        return (
            "add these parameters to the optimizer: create it from model.parameters() after every module "
            "exists (or add them with optimizer.add_param_group)"
        )
    if k == "no_gradient":
        return (
            "find where they are cut off from the loss (a .detach(), .item()/.numpy() round trip, a "
            "torch.no_grad() block or an output that is not used); if that is on purpose, freeze them "
            "with requires_grad_(False) so the optimizer and DDP skip them"
        )
    if k == "dead_units":
        first = c.layers[0] if c.layers else "the first dead layer"
        started = c.first_step is not None and run.n_steps and c.first_step == int(run.steps[0])
        if started:
            return (
                f"re-initialise {first}: its units are off from the first step (a large negative bias or "
                "a bad init); reset its bias to 0, or use LeakyReLU/GELU so units cannot die"
            )
        return (
            f"lower the learning rate: the units of {first} died during training (large updates pushed them "
            "off); LeakyReLU/GELU keeps a gradient flowing"
        )
    if k == "exploding":
        if arch.has_recurrent:
            return (
                "clip the gradient norm (clip_grad_norm_) and initialise the recurrent weights smaller "
                "(orthogonal, the default init)"
            )
        if not arch.has_norm:
            return (
                "re-initialise with the default (Kaiming/Xavier) scale, and add normalisation "
                "(BatchNorm/LayerNorm) between the layers; clip the gradient norm meanwhile"
            )
        return f"check the initialisation scale of these layers; {_clip_text(run)}"
    if k == "vanishing":
        if not arch.has_residual:
            return (
                "add residual (skip) connections across the starved layers, and use ReLU/GELU with Kaiming "
                "initialisation instead of saturating activations (sigmoid/tanh)"
            )
        if not arch.has_norm:
            return "add normalisation (LayerNorm/BatchNorm) inside the blocks and check the initialisation scale"
        return (
            "check the initialisation scale of these layers (a gain matched to the activation) and that "
            "no saturating activation sits in front of them"
        )
    if k == "saturated_output":
        return _saturated_action(LossGraph.of_run(run))
    if k == "lr_too_low":
        return f"raise the learning rate 10-100x{_lr_text(run)}"
    if k == "plateau":
        return (
            "lower the learning rate on the plateau (a scheduler such as ReduceLROnPlateau) or, if the loss "
            "is still high, raise it or check the data and labels"
        )
    if k in ("batch_too_small", "batch_too_large"):
        from .rules_noise import action

        return action(c, run)
    if k == "frozen":
        return "if they should train, call requires_grad_(True) on them and add them to the optimizer"
    raise ValueError(f"no action for cause {k!r}")


#: causes of the whole run: they affect every layer, so the text does not list them.
WHOLE_RUN = ("lr_too_high", "lr_too_low", "missing_zero_grad", "loss_scale")


def _text(c: Cause, max_layers: int) -> str:
    title = c.title[:1].upper() + c.title[1:]
    since = f" since step {c.first_step}" if c.first_step is not None else ""
    if not c.layers or c.cause in WHOLE_RUN:
        return f"{title}{since}."
    n = len(c.layers)
    shown = ", ".join(c.layers[:max_layers]) + (f" and {n - max_layers} more" if n > max_layers else "")
    return f"{title} in {n} layer{'s' * (n > 1)}{since}: {shown}."


def recommendations(causes: list[Cause], run, arch: Architecture, max_layers: int = 6) -> list[Recommendation]:
    """One recommendation per cause, in the causes' rank order, each with its one action."""
    return [
        Recommendation(
            c.priority,
            _text(c, max_layers),
            action_for(c, run, arch),
            list(c.layers),
            c.cause,
            c.evidence,
            float(c.confidence),
            c.cause,
            c.first_step,
            list(c.explains),
        )
        for c in causes
    ]
