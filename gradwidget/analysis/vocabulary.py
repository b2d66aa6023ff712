"""The diagnosis vocabulary: every cause, what it is called, the symptoms it explains, the
calibrated bounds its rule uses, the ``Cause`` record a rule returns, the ``Context`` rules read
from, and the small lookups several rules share (``rules_setup`` and ``rules_layers`` hold the
rules, ``causes`` runs, folds and ranks them)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..run import NonfiniteOrigin
from .evidence import Architecture, LossEvidence, is_embedding, update_ratio_series
from .flow import Region
from .health import Dynamics, RiskFactor
from .stats import Series, _quiet

#: every cause, in precedence order: a root cause before the symptoms it can produce.
CAUSES = (
    "nonfinite",
    "missing_zero_grad",
    "loss_scale",
    "input_scale",
    "saturated_output",
    "lr_too_high",
    "not_in_optimizer",
    "no_gradient",
    "dead_units",
    "exploding",
    "vanishing",
    "lr_too_low",
    "plateau",
    "batch_too_small",
    "batch_too_large",
    "frozen",
)

#: what each cause is, in a few words (the list above the heatmap and the report use it).
CAUSE_TITLES = {
    "nonfinite": "NaN/Inf values",
    "missing_zero_grad": "gradients never reset (zero_grad missing)",
    "loss_scale": "loss summed instead of averaged",
    "input_scale": "unnormalised inputs",
    "lr_too_high": "learning rate too high",
    "not_in_optimizer": "parameters not in the optimizer",
    "no_gradient": "parameters that never get a gradient",
    "dead_units": "dead units (gradients exactly zero)",
    "exploding": "exploding gradients",
    "vanishing": "vanishing gradients",
    "saturated_output": "saturated output (softmax before the loss?)",
    "lr_too_low": "learning rate too low",
    "plateau": "training has plateaued",
    "batch_too_small": "batch far below the gradient noise scale",
    "batch_too_large": "batch far above the gradient noise scale",
    "frozen": "frozen parameters",
}

#: the symptoms each cause explains: when both are found, the symptom is folded into the cause.
EXPLAINS = {
    "missing_zero_grad": ("lr_too_high", "exploding", "nonfinite", "plateau", "lr_too_low", "dead_units"),
    "loss_scale": ("lr_too_high", "exploding", "nonfinite", "dead_units"),
    "input_scale": ("lr_too_high", "exploding", "nonfinite", "vanishing", "dead_units"),
    "lr_too_high": ("exploding", "plateau", "dead_units", "lr_too_low"),
    "dead_units": ("vanishing", "plateau", "lr_too_low", "saturated_output"),
    "vanishing": ("plateau", "lr_too_low", "saturated_output"),
    "saturated_output": ("vanishing", "plateau", "lr_too_low"),  # vanishing: only when seen in the loss's graph
    "lr_too_low": ("plateau",),
    "no_gradient": (),
    "not_in_optimizer": (),
}

PRIORITY_ORDER = ("Critical", "High", "Medium", "Low")

# ---- calibration (see bench/diagnosis.py: healthy zoo runs sit well inside every bound) ----
#: the global norm grows like (step + 1)^p at the start; p at or above this, rising on this share of
#: the first steps, and at least GROWTH_FACTOR larger by the end of them: gradients accumulate.
ACCUMULATION_EXPONENT = 0.75
ACCUMULATION_RISING = 0.85
#: ... and never growing more than this much in one step (a diverging run grows geometrically).
ACCUMULATION_MAX_STEP_RATIO = 2.5
#: ... with the second step's norm about twice the first's: its gradient was added to the first one
#: (a healthy network whose gradients grow as it learns grows by a steady factor, ~1.3 a step).
ACCUMULATION_FIRST_RATIO = (1.6, 2.5)
#: the running-sum fingerprint over the first 40 steps (``evidence.accumulation_smoothing``): late
#: per-layer change at most this (healthy zoo runs: 0.10 and up), early change this many times the
#: late one, the global norm grown this many times, and rising on this share of layer-steps.
SMOOTH_LATE_CHANGE = 0.07
SMOOTH_EARLY_FACTOR = 2.0
SMOOTH_GROWTH = 10.0
SMOOTH_RISING = 0.7
GROWTH_FACTOR = 3.0
#: a first logged loss this large is a sum over the batch, not a mean (a per-sample cross entropy
#: starts at ln(classes), under 12 even for a 100,000-token vocabulary).
SUMMED_LOSS_START = 40.0
#: a first cross entropy this many times ln(classes), averaged over the batch: outputs exploded at init.
EXPLODING_LOSS_FACTOR = 5.0
#: ... this many times when the loss's graph shows it is a cross entropy of the model's output (not an
#: MSE over several outputs, whose start says nothing of ln(classes)): healthy zoo runs start at
#: 0.86-1.01 x ln(classes), an unnormalised input at 1.45.
EXPLODING_LOSS_FACTOR_CE = 2.0
#: ... confirmed, where the output layer has a bias, by a bias gradient entry above this (a batch
#: mean of (p - y) is at most 1; a sum over B samples reaches B).
MEAN_LOSS_BIAS_GRAD = 1.5
#: the data entering the first layer is unnormalised when its estimated RMS is outside this band.
INPUT_RMS_HIGH = 30.0
INPUT_RMS_LOW = 0.01
#: the typical layer's update / weight ratio on a measured step above which the steps are too large.
UPDATE_RATIO_TOO_HIGH = 0.1
#: ... and below which, with a flat loss, the learning rate is too low.
UPDATE_RATIO_TOO_LOW = 1e-4
#: a loss that jumps back above LOSS_SPIKE x its start on this share of steps is swinging.
LOSS_SPIKE_SHARE = 0.05
#: ... and when the loss still falls cleanly or is not logged (small models learn well at 0.1-0.3).
UPDATE_RATIO_UNLOGGED = 1.0
#: the typical layer's weight norm grew more than this many times: the steps are too large.
WEIGHT_BLOWUP = 10.0
#: a loss whose least-squares fall is this many standard errors below zero is falling, however slowly.
SLOW_FALL_SE = 4.0
#: saturated output: the start within this share of ln(classes), the lowest loss at or above this
#: share of the softmax floor, the last third moving less than this share of the start, and the end
#: within this share above the floor.
CHANCE_TOLERANCE = 0.05
FLOOR_TOLERANCE = 0.98
SATURATED_TAIL_CHANGE = 0.05
SATURATED_NEAR_FLOOR = 0.15
#: a loss that came down to no lower than this share of its start and then stayed flat is stuck.
STUCK_LOSS_LEVEL = 0.6
#: the vanishing layers must make up at least this share of the input side they span: the gradient
#: fades on its way back to the input. An isolated weak layer between healthy ones (an attention
#: query/key at initialisation, a key bias whose gradient is zero by symmetry) is not that problem.
VANISHING_PREFIX_SHARE = 0.8
#: decades the RMS gradient entry may fall from the output layer to the input layer before it is
#: vanishing (healthy zoo runs: under 3 on every step), and how far below the output a layer must
#: sit to be named.
VANISHING_DECADES = 4.0
STARVED_DECADES = 2.0
#: ... also when it held on every one of the first this many recorded steps (the initialisation),
#: even if an adaptive optimizer recovered afterwards.
VANISHING_START_STEPS = 3
#: ... and from this many decades on most steps when a classifier's loss starts at chance, ln(classes),
#: and does not move (healthy zoo runs reach 2.7 on a few steps, always with a falling loss; the
#: flat-loss runs of other mistakes stay under it on 96%+ of steps; a CNN initialised x0.1 sits at
#: 2.8 at chance). Not for other losses: a deep regression MLP with PyTorch's default init (the
#: demo's ReLU run) falls 3.4 decades while its MSE creeps down, which is slow, not stuck.
VANISHING_DECADES_STUCK = 2.5
VANISHING_STUCK_SHARE = 0.5


@dataclass
class Cause:
    cause: str  #: one of ``CAUSES``
    priority: str  #: Critical / High / Medium / Low
    layers: list[str]  #: at fault, most affected first ([] for a cause of the whole run)
    first_step: int | None  #: when it began (a recorded step number)
    evidence: str  #: the numbers that show it
    confidence: float  #: 0..1: how clearly the evidence separates it from a healthy run
    explains: list[str] = field(default_factory=list)  #: folded symptoms, each "cause: evidence"
    origin: NonfiniteOrigin | None = None  #: the NaN origin, for ``nonfinite``
    at_init: bool = False  #: present before the first update: the root, above any step-size cause
    after: str | None = None  #: the cause it followed from: ranked right after it, kept for its own evidence

    @property
    def title(self) -> str:
        return CAUSE_TITLES[self.cause]


@dataclass
class Context:
    """Everything the rules read, computed once."""

    s: Series
    factors: list[RiskFactor]
    regions: list[Region]
    dyn: Dynamics
    loss: LossEvidence
    arch: Architecture
    _ratio: tuple | None = None

    @property
    def run(self):
        return self.s.run

    @property
    def update_ratio(self) -> tuple[np.ndarray, np.ndarray]:
        """``evidence.update_ratio_series``, computed once."""
        if self._ratio is None:
            self._ratio = update_ratio_series(self.run)
        return self._ratio

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


def names_of(run, idx) -> list[str]:
    return [run.layer_names[i] for i in idx]


def first_flagged_step(run, flags: np.ndarray) -> int | None:
    """The first recorded step on which any column of ``flags`` (steps x layers) is set."""
    rows = np.flatnonzero(np.asarray(flags).reshape(run.n_steps, -1).any(axis=1)) if run.n_steps else np.zeros(0, int)
    return int(run.steps[rows[0]]) if len(rows) else None


def start_step(run) -> int | None:
    return int(run.steps[0]) if run.n_steps else None


def factors_of(factors: list[RiskFactor], kind: str) -> list[RiskFactor]:
    return sorted((f for f in factors if f.kind == kind), key=lambda f: -f.severity)


def growing_first(run) -> list[str]:
    """Every layer with a gradient, the one whose norm grew most over the run first: a cause of the
    whole run (every gradient summed or scaled) affects them all."""
    g = run.metric("grad_norm").astype(np.float64)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        g = np.where(np.isfinite(g) & (g > 0), g, np.nan)
        growth = np.nanmax(g, axis=0) / g[0] if run.n_steps else np.zeros(run.n_layers)
    got = np.asarray(np.isfinite(g).any(axis=0)) if run.n_steps else np.zeros(run.n_layers, bool)
    order = np.argsort(-np.nan_to_num(growth, nan=0.0), kind="stable")
    return [run.layer_names[i] for i in order if got[i]]


def output_bias_grad(run) -> float:
    """Largest |g| of the output layer's bias at the first recorded step (NaN without one). For a
    cross entropy averaged over the batch each entry is a mean of (p - y), so at most 1."""
    out = output_layer(run)
    if out is None or run.n_steps == 0:
        return float("nan")
    b = [i for i, info in enumerate(run.layers) if info.module == out.module and info.name.endswith("bias")]
    return float(run.metric("max_abs")[0, b[0]]) if b else float("nan")


def output_layer(run):
    """The output layer's weight: the 2-d weight nearest the loss in the backward order."""
    ws = [
        info
        for info in run.layers
        if info.name.endswith("weight") and len(info.shape) == 2 and info.backward_index >= 0
    ]
    return min(ws, key=lambda info: info.backward_index) if ws else None


def output_classes(run) -> int | None:
    """Classes of the output layer: its weight's number of rows."""
    out = output_layer(run)
    return int(out.shape[0]) if out is not None and out.shape[0] >= 2 else None
