"""The one diagnosis type (``Diagnosis``), the record each cause module fills in (``CauseRule``)
and the ``Context`` every rule reads from, computed once per analysis.

Every cause declares the kind of evidence it reads (``CauseRule.kind``): an *observation* is a fact
about the program the Recorder saw (a parameter the optimizer does not hold, a gradient never reset,
no gradient reaching a layer, a NaN and where it began): it may be High or Critical on its own. A
*symptom* is a statistical pattern (weight growth, small or large gradients, a spike, a rebound, a
plateau, update ratios): the engine (``_engine``) caps it at Low unless the objective shows measured
damage (``analysis.damage``). A diagnosis that an observation's rule reads from statistics instead
(no direct record) says so with ``inferred`` and counts as a symptom."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

from ...origin import NonfiniteOrigin
from ..evidence import Architecture, LossEvidence, is_embedding, update_ratio_series
from ..flow import Region
from ..damage import Damage, damage
from ..dynamics import Dynamics
from ..risk_factor import RiskFactor
from ..noise_scale import NoiseScale, noise_scale
from ..stats import Series
from ..task import Task

#: priorities, most urgent first.
PRIORITY_ORDER = ("Critical", "High", "Medium", "Low")
#: the two kinds of evidence a cause reads (see the module docstring)
Kind = Literal["observation", "symptom"]


@dataclass
class Diagnosis:
    """What is wrong, where, since when, how sure, and the one change to make: a claim the user
    acts on. Rules fill in the evidence; the engine adds ``title``, ``text`` and ``action``."""

    cause: str  #: one of ``causes.CAUSES``
    priority: str  #: Critical / High / Medium / Low
    layers: list[str]  #: at fault, most affected first ([] for a cause of the whole run)
    first_step: int | None  #: when it began (a recorded step number)
    evidence: str  #: the numbers that show it
    confidence: float  #: 0..1: how clearly the evidence separates it from a healthy run
    explains: list[str] = field(default_factory=list)  #: folded symptoms, each "cause: evidence"
    #: the layers of each folded symptom ({"exploding": [...]}): still measured, explained by this cause
    symptom_layers: dict[str, list[str]] = field(default_factory=dict)
    origin: NonfiniteOrigin | None = None  #: the NaN origin, for ``nonfinite``
    at_init: bool = False  #: present before the first update: the root, above any step-size cause
    inferred: bool = False  #: read from statistics, not seen: a symptom even under an observation's rule
    after: str | None = None  #: the cause it followed from: ranked right after it, kept for its own evidence
    ranks: list[int] = field(default_factory=list)  #: the processes at fault (distributed runs), most first
    title: str = ""  #: what the cause is, in a few words
    text: str = ""  #: the title with the layers at fault and since when, one sentence
    action: str = ""  #: the one change to make

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def __repr__(self) -> str:
        """Two lines a notebook prints readably (the fields: ``to_dict()``): the priority, the
        cause's title, the layers (the first two and how many more), since when; then the action."""
        n = len(self.layers)
        where = ", ".join(self.layers[:2]) + (f" +{n - 2} more" if n > 2 else "") if n else "the whole run"
        since = f" since step {self.first_step}" if self.first_step is not None else ""
        head = f"<Diagnosis {self.priority}: {self.title or self.cause} in {where}{since}"
        return head + (f"\n  action: {self.action}>" if self.action else ">")


#: how a found symptom is treated under a cause that explains it: folded into it, kept and ranked
#: right after it (a consequence with evidence of its own), or kept as a finding of its own.
Fold = Literal["fold", "after", "keep"]


def _always(cause: Diagnosis, symptom: Diagnosis) -> bool:
    return True


def _folded(symptom: Diagnosis, cause: Diagnosis) -> Fold:
    return "fold"


@dataclass(frozen=True)
class CauseRule:
    """One cause of the vocabulary, as its module defines it."""

    name: str
    title: str
    find: Callable[["Context"], Diagnosis | None]  #: the rule: a Diagnosis when the evidence holds
    action: Callable[[Diagnosis, "Context"], str]  #: the one change to make, aware of the architecture
    kind: Kind  #: observation (may be High/Critical alone) or symptom (Low unless the loss shows damage)
    explains: tuple[str, ...] = ()  #: symptoms it can produce, folded into it when both are found
    contradicts: tuple[str, ...] = ()  #: findings its evidence rules out: dropped when it is found
    explains_when: Callable[[Diagnosis, Diagnosis], bool] = _always  #: (cause, symptom): does it explain this one?
    folded_as: Callable[[Diagnosis, Diagnosis], Fold] = _folded  #: (as a symptom, the cause): how it is folded
    whole_run: bool = False  #: a cause of the whole run: its text names no layers
    priority_explaining: str | None = None  #: at least this priority once it explains a symptom


@dataclass
class Context:
    """Everything the rules read, computed once."""

    s: Series
    factors: list[RiskFactor]
    regions: list[Region]
    dyn: Dynamics
    loss: LossEvidence
    arch: Architecture
    task: Task

    @functools.cached_property
    def damage(self) -> Damage | None:
        """The damage the loss shows (``analysis.damage``), computed once."""
        return damage(self.run, self.loss, self.task, self.t.chance_tolerance)

    @property
    def run(self):
        return self.s.run

    @property
    def t(self):
        """The run's Thresholds (every bound shared with the plots or between causes)."""
        return self.s.run.thresholds

    @functools.cached_property
    def noise(self) -> NoiseScale | None:
        """The gradient noise scale (``noise_scale.noise_scale``), computed once (the Report keeps it)."""
        return noise_scale(self.run)

    @functools.cached_property
    def update_ratio(self) -> tuple[np.ndarray, np.ndarray]:
        """``evidence.update_ratio_series``, computed once."""
        return update_ratio_series(self.run)

    @functools.cached_property
    def embedding(self) -> np.ndarray:
        """Per layer: an embedding table (its gradient is sparse by design: never dead or vanishing)."""
        return np.array([is_embedding(info.module_type) for info in self.run.layers], bool)

    @functools.cached_property
    def dead_layers(self) -> np.ndarray:
        """Per layer: trainable, not an embedding, and dead (exact zeros) on at least
        ``minor_issue_ratio`` of steps."""
        t = self.run.thresholds
        return self.s.trainable & (self.s.exact["dead_share"] >= t.minor_issue_ratio) & ~self.embedding
