"""What to do about it: layer groups (by gradient level and by module), per-layer suggestions with
the evidence that triggered them, optimisation priorities, and ranked plain-language
recommendations that name layers (the original crate's hierarchy, priorities and suggestions).

Group characteristics are computed from their members (the original crate hard-coded 2.0 / 0.8 / 0.7 ...);
every suggestion is tied to a risk factor that fired, and its expected impact is that factor's
measured severity.

Fields of the original crate not carried over, and why:
- ``GradientHierarchy.hierarchy_levels`` / ``cross_level_interactions``: the original crate's levels were the
  High / Medium / Low gradient bands (the ``by="level"`` groups here) with constant importance and
  impact, and its cross-level interactions were never filled in.
- ``OptimizationDifficulty.VeryDifficult``: never assigned by the original crate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from ..collect.loss_graph import LossGraph
from .causes import WEIGHT_BLOWUP, Cause
from .evidence import Architecture
from .flow import Region
from .health import Dynamics, RiskFactor
from .nonfinite import weight_growth as origin_weight_growth
from .stats import Series, _quiet, block_mean, nanmedian, standardized
from .health import CORR_ROWS

PRIORITY_ORDER = ("Critical", "High", "Medium", "Low")
#: the original crate's enhanced analysis: the weights of a layer's health in its priority score.
_HEALTH_WEIGHT = {"Critical": 1.0, "Warning": 0.7, "Unknown": 0.5, "Healthy": 0.3}


@dataclass
class GroupCharacteristics:
    mean_gradient_norm: float  #: geometric mean of the members' median gradient norms
    synchronization: float  #: mean pairwise correlation of the members' log-norm series
    lr_sensitivity: float  #: median update/weight ratio of the members (NaN without optimizer)
    internal_coherence: float  #: 1/(1 + std of the members' log10 levels)
    difficulty: str  #: Difficult (a Critical member) / Moderate (a Warning) / Easy


@dataclass
class LayerGroup:
    name: str
    by: str  #: "level" or "module"
    layers: list[str]
    characteristics: GroupCharacteristics
    health_counts: dict


def _module_keys(names: list[str]) -> list[str]:
    """The shallowest module prefix (up to 3 dotted components) that splits the layers in 2+ groups."""
    parts = [n.split(".")[:-1] or [n] for n in names]
    for depth in (1, 2, 3):
        keys = [".".join(p[:depth]) for p in parts]
        if len(set(keys)) > 1:
            return keys
    return [".".join(p[:1]) for p in parts]


def layer_groups(s: Series, health: pd.DataFrame) -> list[LayerGroup]:
    """Groups by gradient level (High / Medium / Low: more than 1/``bottleneck_gain`` times above or
    below the median layer) and by module prefix, each characterised from its members."""
    run, t = s.run, s.run.thresholds
    names = run.layer_names
    known = (health["health"] != "Unknown").to_numpy()
    g = s.stat("grad_norm", "median")
    with np.errstate(divide="ignore", invalid="ignore"), _quiet():
        lg = np.log10(np.where(g > 0, g, np.nan))
        rel = lg - nanmedian(lg[known]) if known.any() else lg * np.nan
    band = -np.log10(t.bottleneck_gain)
    level = np.where(
        ~known | ~np.isfinite(rel),
        "",
        np.where(rel > band, "High gradient", np.where(rel < -band, "Low gradient", "Medium gradient")),
    )
    z, varies = standardized(block_mean(s.coarse, CORR_ROWS)[0])
    ur = health["update_ratio"].to_numpy()
    hv = health["health"].to_numpy()
    out = []
    for by, keys in (("level", level), ("module", np.array(_module_keys(names), dtype=object))):
        for key in pd.unique(keys[known]) if known.any() else []:
            if key == "":
                continue
            idx = np.flatnonzero((keys == key) & known)
            zz = z[:, idx][:, varies[idx]]
            k = zz.shape[1]
            sync = float((np.sum(zz.sum(1) ** 2) - k) / (k * (k - 1))) if k > 1 else float("nan")
            with _quiet():
                ch = GroupCharacteristics(
                    mean_gradient_norm=float(10 ** np.nanmean(lg[idx])) if np.isfinite(lg[idx]).any() else float("nan"),
                    synchronization=sync,
                    lr_sensitivity=float(nanmedian(ur[idx])) if np.isfinite(ur[idx]).any() else float("nan"),
                    internal_coherence=float(1 / (1 + np.nanstd(lg[idx])))
                    if np.isfinite(lg[idx]).any()
                    else float("nan"),
                    difficulty="Difficult"
                    if (hv[idx] == "Critical").any()
                    else "Moderate"
                    if (hv[idx] == "Warning").any()
                    else "Easy",
                )
            counts = {h: int((hv[idx] == h).sum()) for h in ("Healthy", "Warning", "Critical")}
            out.append(LayerGroup(str(key), by, [names[i] for i in idx], ch, counts))
    return out


# --------------------------------------------------------------------------- suggestions
@dataclass
class Suggestion:
    layer: str
    kind: str  #: initialisation, learning_rate, clipping, normalisation, regularisation, residual, activation
    text: str
    evidence: str
    expected_impact: float  #: severity of the risk factor it addresses (0..1)
    complexity: str  #: Simple / Moderate / Complex
    side_effects: list[str] = field(default_factory=list)  #: what the fix can cost (``ACTION_META``)


#: per suggestion kind: (the original crate's ActionType,
#: ImplementationEffort, prerequisites, side effects).
#: What each remedy involves and can cost is a property of the remedy, so it is a table.
ACTION_META = {
    "clipping": (
        "OptimizationTechnique",
        "Minimal",
        ["the typical global gradient norm, to set max_norm"],
        ["a max_norm far below the typical norm shrinks every step and slows learning"],
    ),
    "learning_rate": (
        "LearningRateScheduling",
        "Minimal",
        [],
        ["a lower rate slows convergence; a higher one risks instability"],
    ),
    "initialisation": (
        "ParameterAdjustment",
        "Moderate",
        ["restarting training from the new initialisation"],
        ["the progress made so far is lost (retraining from scratch)"],
    ),
    "normalisation": (
        "ArchitecturalChange",
        "Moderate",
        ["access to the model definition"],
        ["changes the model: existing checkpoints no longer load as-is"],
    ),
    "regularisation": (
        "RegularizationMethod",
        "Low",
        [],
        ["weight decay or less momentum can reduce capacity or slow convergence"],
    ),
    "activation": (
        "ArchitecturalChange",
        "Moderate",
        ["access to the model definition"],
        ["a different activation changes what the layer computes: retraining needed"],
    ),
    "residual": (
        "ArchitecturalChange",
        "High",
        ["access to the model definition", "retraining"],
        ["changes the architecture: checkpoints and tuned hyper-parameters may not carry over"],
    ),
}


_ACTIONS = {
    "nonfinite": [
        (
            "clipping",
            "Simple",
            "clip gradients (torch.nn.utils.clip_grad_norm_) and lower the learning rate; "
            "check the loss for log(0) or division by zero, and use a GradScaler under AMP",
        )
    ],
    "exploding": [
        ("clipping", "Simple", "clip gradients (torch.nn.utils.clip_grad_norm_)"),
        ("learning_rate", "Simple", "lower the learning rate"),
    ],
    "vanishing": [
        (
            "initialisation",
            "Simple",
            "re-initialise with a gain that matches the activation (Kaiming for ReLU, Xavier for tanh/sigmoid)",
        )
    ],
    "weak": [
        ("initialisation", "Simple", "check the initialisation scale; the gradient is far below the other layers'")
    ],
    "dead": [
        (
            "activation",
            "Moderate",
            "the gradient entries are zero: units are dead (e.g. ReLU stuck off); use "
            "LeakyReLU/GELU, re-initialise the biases feeding it, or lower the learning rate",
        )
    ],
    "hot": [
        ("normalisation", "Moderate", "add normalisation (LayerNorm/BatchNorm) before it, or a per-layer learning rate")
    ],
    "unstable": [("normalisation", "Moderate", "add normalisation to steady the gradient scale")],
    "oscillating": [("regularisation", "Simple", "add weight decay, lower the momentum or the learning rate")],
    "lr_high": [
        (
            "learning_rate",
            "Simple",
            "lower the learning rate for these parameters (updates are large relative to the weights)",
        )
    ],
    "lr_low": [
        ("learning_rate", "Simple", "raise the learning rate for these parameters (updates barely move the weights)")
    ],
}


def suggestions(factors: list[RiskFactor], regions: list[Region]) -> list[Suggestion]:
    """One or more suggestions per risk factor, plus residual connections for layers inside a
    vanishing or dead region that spans several layers; strongest first."""
    out = []
    for f in factors:
        for kind, cx, text in _ACTIONS[f.kind]:
            out.append(
                Suggestion(f.layer, kind, f"{f.layer}: {text}", f.evidence, f.severity, cx, list(ACTION_META[kind][3]))
            )
    for r in regions:
        if r.kind in ("vanishing", "dead") and len(r.layers) >= 2:
            for name in r.layers:
                out.append(
                    Suggestion(
                        name,
                        "residual",
                        f"{name}: add residual (skip) connections across {r.start_layer} … {r.end_layer}",
                        f"{r.kind} region of {len(r.layers)} adjacent layers "
                        f"({r.parameters} parameters) for {r.duration_steps} steps",
                        r.share,
                        "Complex",
                        list(ACTION_META["residual"][3]),
                    )
                )
    out.sort(key=lambda x: -x.expected_impact)
    return out


@dataclass
class PrioritizedAction:
    name: str
    action_type: str  #: ParameterAdjustment / ArchitecturalChange / OptimizationTechnique /
    #: RegularizationMethod / LearningRateScheduling (as the original crate)
    expected_impact: float  #: severity of the problem it addresses (0..1)
    implementation_effort: str  #: Minimal / Low / Moderate / High (the original crate's ImplementationEffort)
    prerequisites: list[str]


def prioritized(sugg: list[Suggestion]) -> list[PrioritizedAction]:
    """One action per distinct suggestion text, most impact first, with its type, effort and
    prerequisites from ``ACTION_META``."""
    seen: dict[str, PrioritizedAction] = {}
    for x in sorted(sugg, key=lambda x: -x.expected_impact):
        name = x.text.split(": ", 1)[-1]
        if name not in seen:
            typ, effort, pre, _ = ACTION_META[x.kind]
            seen[name] = PrioritizedAction(name, typ, float(x.expected_impact), effort, list(pre))
    return list(seen.values())


@dataclass
class Priority:
    layer: str  #: the target: a layer, a group ("vanishing region a … b", "module enc") or "network"
    score: float
    urgency: str
    potential: float
    actions: list[str]
    expected_impact: float
    target_type: str = "IndividualLayer"  #: IndividualLayer / LayerGroup / NetworkLevel (as the original crate)
    layers: list[str] = field(default_factory=list)  #: the layers it covers
    recommended_actions: list[PrioritizedAction] = field(default_factory=list)


def _layer_priorities(health: pd.DataFrame, by_layer: dict[str, list[Suggestion]]) -> list[Priority]:
    """The original crate's (enhanced analysis) priority score for each layer that is not Healthy: 0.4 x health weight +
    0.3 x (1 - stability) + 0.2 x optimisation potential + 0.1 x risk; urgency Critical for Critical
    layers, High for Warning layers with stability < 0.3 (as the original crate), else Medium."""
    out = []
    for _, r in health[health["health"].isin(["Critical", "Warning"])].iterrows():
        st = r["stability"] if np.isfinite(r["stability"]) else 0.0
        pot = r["potential"] if np.isfinite(r["potential"]) else 0.0
        risk = r["risk"] if np.isfinite(r["risk"]) else 0.0
        score = min(1.0, 0.4 * _HEALTH_WEIGHT[r["health"]] + 0.3 * (1 - st) + 0.2 * pot + 0.1 * risk)
        urg = "Critical" if r["health"] == "Critical" else "High" if st < 0.3 else "Medium"
        ss = by_layer.get(r["layer"], [])
        out.append(
            Priority(
                r["layer"],
                float(score),
                urg,
                float(pot),
                [x.text for x in ss],
                float(max((x.expected_impact for x in ss), default=0.0)),
                "IndividualLayer",
                [r["layer"]],
                prioritized(ss),
            )
        )
    return out


def _group_priority(name: str, members: list[Priority], sugg: list[Suggestion], impact: float) -> Priority:
    """One LayerGroup priority over member layer priorities: their highest score and most urgent
    urgency, their mean potential, and every action their suggestions ``sugg`` name."""
    acts = prioritized(sugg)
    names = [p.layer for p in members]
    urg = min((p.urgency for p in members), key=PRIORITY_ORDER.index)
    return Priority(
        name,
        max(p.score for p in members),
        urg,
        float(np.mean([p.potential for p in members])),
        [a.name for a in acts],
        float(impact),
        "LayerGroup",
        names,
        acts,
    )


def _network_priorities(
    health: pd.DataFrame, layer_prio: list[Priority], dyn: Dynamics | None, forecast
) -> list[Priority]:
    """NetworkLevel priorities: problems on more than ``BROAD_SHARE`` of the known layers (one fix for
    the whole network, e.g. the learning rate or normalisation throughout), a plateau, and a
    forecast that the global norm will keep growing."""
    out = []
    known = health["health"] != "Unknown"
    bad = health["health"].isin(["Critical", "Warning"]) & known
    share = float(bad.sum()) / max(1, int(known.sum()))
    if share > BROAD_SHARE and layer_prio:
        names = list(health.loc[bad, "layer"])
        acts = [
            PrioritizedAction(
                "review the global learning rate and schedule", "LearningRateScheduling", share, "Minimal", []
            ),
            PrioritizedAction(
                "add normalisation (LayerNorm/BatchNorm) throughout",
                "ArchitecturalChange",
                share,
                "Moderate",
                ["access to the model definition"],
            ),
        ]
        urg = "Critical" if (health.loc[bad, "health"] == "Critical").any() else "High"
        out.append(
            Priority(
                "network",
                share,
                urg,
                float(np.mean([p.potential for p in layer_prio])),
                [a.name for a in acts],
                share,
                "NetworkLevel",
                names,
                acts,
            )
        )
    if dyn is not None and dyn.plateau.is_plateau:
        p = dyn.plateau
        sev = {"Severe": 1.0, "Moderate": 0.6, "Mild": 0.3}.get(p.severity, 0.0)
        acts = [PrioritizedAction(p.suggested_actions[0], "LearningRateScheduling", sev, "Low", [])]
        out.append(
            Priority(
                "training progress",
                sev,
                "High" if p.severity == "Severe" else "Medium",
                sev,
                [a.name for a in acts],
                sev,
                "NetworkLevel",
                [],
                acts,
            )
        )
    if forecast is not None and forecast.outlook == "Deteriorating":
        c = float(forecast.confidence)
        acts = [
            PrioritizedAction(
                "clip the global gradient norm", "OptimizationTechnique", c, "Minimal", list(ACTION_META["clipping"][2])
            ),
            PrioritizedAction("lower the learning rate", "LearningRateScheduling", c, "Minimal", []),
        ]
        out.append(Priority("global gradient norm", c, "High", c, [a.name for a in acts], c, "NetworkLevel", [], acts))
    return out


#: a problem on more than this share of the known layers is a network-level priority (the original
#: crate's enhanced analysis
#: overall health: more than 30% Critical makes the network Critical).
BROAD_SHARE = 0.3


def priorities(
    health: pd.DataFrame,
    sugg: list[Suggestion],
    regions: Sequence[Region] = (),
    groups: Sequence[LayerGroup] = (),
    dyn: Dynamics | None = None,
    forecast=None,
) -> list[Priority]:
    """Optimisation priorities at the original crate's three scopes: each layer that is not Healthy
    (``_layer_priorities``); each vanishing / dead / exploding region of 2+ layers and each module
    group whose problem layers span 2+ modules and make at least half of it, unless a region already
    covers them (LayerGroup: one fix across them, e.g. residual connections); and network-wide problems (``_network_priorities``). Sorted by urgency,
    then score."""
    by_layer: dict[str, list[Suggestion]] = {}
    for sg in sugg:
        by_layer.setdefault(sg.layer, []).append(sg)
    layer_prio = _layer_priorities(health, by_layer)
    lp = {p.layer: p for p in layer_prio}
    out = list(layer_prio)
    covered: list[set[str]] = []
    for r in regions:
        members = [lp[n] for n in r.layers if n in lp]
        if len(r.layers) >= 2 and members:
            ss = [x for n in r.layers for x in by_layer.get(n, [])]
            covered.append(set(r.layers))
            out.append(_group_priority(f"{r.kind} region {r.start_layer} … {r.end_layer}", members, ss, r.share))
    for g in groups:
        members = [lp[n] for n in g.layers if n in lp]
        names = {p.layer for p in members}
        modules = {n.rsplit(".", 1)[0] for n in names}  # a weight and its bias are one module, not a group
        if (
            g.by == "module"
            and len(modules) >= 2
            and 2 * len(members) >= len(g.layers)
            and not any(names <= c for c in covered)
        ):
            covered.append(names)
            ss = [x for n in g.layers for x in by_layer.get(n, [])]
            out.append(
                _group_priority(f"module {g.name}", members, ss, max((x.expected_impact for x in ss), default=0.0))
            )
    out.extend(_network_priorities(health, layer_prio, dyn, forecast))
    out.sort(key=lambda p: (PRIORITY_ORDER.index(p.urgency), -p.score))
    return out


# --------------------------------------------------------------------------- recommendations
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
