"""What to do about it: per-layer suggestions with the evidence that triggered them and optimisation
priorities (the original crate's priorities and suggestions). Layer groups live in ``groups.py``
(re-exported here). The diagnoses and their actions are ``causes/``.

Every suggestion is tied to a risk factor that fired, and its expected impact is that factor's
measured severity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from .causes import PRIORITY_ORDER
from .flow import Region
from .groups import GroupCharacteristics, LayerGroup, layer_groups
from .dynamics import Dynamics
from .risk_factor import RiskFactor

__all__ = [
    "ACTION_META",
    "BROAD_SHARE",
    "PRIORITY_ORDER",
    "GroupCharacteristics",
    "LayerGroup",
    "PrioritizedAction",
    "Priority",
    "Suggestion",
    "layer_groups",
    "prioritized",
    "priorities",
    "suggestions",
]

#: the original crate's enhanced analysis: the weights of a layer's health in its priority score.
_HEALTH_WEIGHT = {"Critical": 1.0, "Warning": 0.7, "Unknown": 0.5, "Healthy": 0.3}


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
