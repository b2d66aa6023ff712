"""From evidence to causes: what is wrong, where, since when, and how sure we are.

One vocabulary (``CAUSES``), one rule per cause. A cause names the layers at fault (most affected
first), the step it began, the numbers that show it, and the symptoms it explains: a learning rate
that is too high explains the exploding gradients and the NaN that follow, so those are folded into
it instead of being listed as problems of their own (``EXPLAINS``). Ranking: priority first, then
``CAUSES`` order, which puts a root cause above the symptoms it can produce.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..collect.loss_graph import LossGraph
from ..run import NonfiniteOrigin
from .evidence import (LOSS_SPIKE, Architecture, LossEvidence, accumulation_smoothing, architecture, depth_attenuation,
                       early_growth, input_rms, is_embedding, layer_levels, loss_evidence, never_updated,
                       update_ratio_series, weight_growth)
from .flow import Region
from .health import Dynamics, RiskFactor
from .nonfinite import weight_growth as origin_weight_growth
from .stats import MAX_ROWS, Series, _quiet, dead_flags, sample_rows
from .stats import fmt_num as _fmt

#: every cause, in precedence order: a root cause before the symptoms it can produce.
CAUSES = ("nonfinite", "missing_zero_grad", "loss_scale", "input_scale", "saturated_output", "lr_too_high",
          "not_in_optimizer", "no_gradient", "dead_units", "exploding", "vanishing", "lr_too_low", "plateau",
          "frozen")

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


@dataclass
class Cause:
    cause: str                      #: one of ``CAUSES``
    priority: str                   #: Critical / High / Medium / Low
    layers: list[str]               #: at fault, most affected first ([] for a cause of the whole run)
    first_step: int | None          #: when it began (a recorded step number)
    evidence: str                   #: the numbers that show it
    confidence: float               #: 0..1: how clearly the evidence separates it from a healthy run
    explains: list[str] = field(default_factory=list)  #: folded symptoms, each "cause: evidence"
    origin: NonfiniteOrigin | None = None  #: the NaN origin, for ``nonfinite``
    at_init: bool = False           #: present before the first update: the root, above any step-size cause
    after: str | None = None        #: the cause it followed from: ranked right after it, kept for its own evidence

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


def _names(run, idx) -> list[str]:
    return [run.layer_names[i] for i in idx]


def _first_step(run, flags: np.ndarray) -> int | None:
    """The first recorded step on which any column of ``flags`` (steps x layers) is set."""
    rows = np.flatnonzero(np.asarray(flags).reshape(run.n_steps, -1).any(axis=1)) if run.n_steps else np.zeros(0, int)
    return int(run.steps[rows[0]]) if len(rows) else None


def _start(run) -> int | None:
    return int(run.steps[0]) if run.n_steps else None


def _by_factor(factors: list[RiskFactor], kind: str) -> list[RiskFactor]:
    return sorted((f for f in factors if f.kind == kind), key=lambda f: -f.severity)


# --------------------------------------------------------------------------- the rules
def _nonfinite(c: Context) -> Cause | None:
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
    layers = _names(run, order)
    origin = getattr(run, "nonfinite_origin", None)
    if origin is not None and origin.module:  # "" is the loss (or the input): no module of the model
        mod = origin.module
        own = [info.name for info in run.layers if info.module == mod or info.name.startswith(mod + ".")]
        layers = own + [n for n in layers if n not in own]
    parts = []
    if grad_step is not None:
        parts.append(f"first NaN/Inf gradients at step {grad_step} in {len(bad)} layer{'s' * (len(bad) != 1)}"
                     f" ({int(ex['nonfinite_total'][bad].sum())} entries in total)")
    if loss_step is not None:
        parts.append(f"the loss is NaN/Inf from step {loss_step}")
    if origin is not None:
        where = origin.module or {"loss": "the loss", "input": "the inputs"}.get(origin.phase, "the model")
        parts.insert(0, f"it began in {where} ({origin.phase}{' pass' if origin.module else ''}) at step {origin.step}")
        grown = origin_weight_growth(run, origin)
        if grown >= WEIGHT_BLOWUP:  # the steps had blown the weights up: the module only overflowed first
            parts.append(f"a layer's weight norm had grown {grown:.3g}x by then")
    return Cause("nonfinite", "Critical", layers, first, "; ".join(parts), 1.0, origin=origin)


def _growing_first(run) -> list[str]:
    """Every layer with a gradient, the one whose norm grew most over the run first: a cause of the
    whole run (every gradient summed or scaled) affects them all."""
    g = run.metric("grad_norm").astype(np.float64)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        g = np.where(np.isfinite(g) & (g > 0), g, np.nan)
        growth = np.nanmax(g, axis=0) / g[0] if run.n_steps else np.zeros(run.n_layers)
    got = np.asarray(np.isfinite(g).any(axis=0)) if run.n_steps else np.zeros(run.n_layers, bool)
    order = np.argsort(-np.nan_to_num(growth, nan=0.0), kind="stable")
    return [run.layer_names[i] for i in order if got[i]]


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
    if gr is not None and (gr.exponent >= ACCUMULATION_EXPONENT and gr.rising >= ACCUMULATION_RISING
                           and gr.max_step_ratio <= ACCUMULATION_MAX_STEP_RATIO and gr.power_law
                           and ACCUMULATION_FIRST_RATIO[0] <= gr.first_ratio <= ACCUMULATION_FIRST_RATIO[1]):
        g = run.scalar("global_norm")[:20]
        g = g[np.isfinite(g)]
        if g.size and g[0] > 0 and g.max() / g[0] >= GROWTH_FACTOR:
            parts.append(f"the global gradient norm grows like the step count from the start (x{gr.first_ratio:.2f} "
                         f"at the second step, ~(step+1)^{gr.exponent:.2f}, rising on {gr.rising:.0%} of the first "
                         f"steps, x{g.max() / g[0]:.1f} within {g.size} steps)")
            conf = float(np.clip((gr.exponent - 0.5) / 0.5, 0, 1))
    if sm is not None and (sm.late <= SMOOTH_LATE_CHANGE and sm.early >= SMOOTH_EARLY_FACTOR * sm.late
                           and sm.growth >= SMOOTH_GROWTH and sm.rising >= SMOOTH_RISING):
        parts.append(f"every layer's gradient norm grows smoothly (x{sm.growth:.3g} over the first steps, rising on "
                     f"{sm.rising:.0%} of them) and its step-to-step change shrinks from {sm.early:.0%} to "
                     f"{sm.late:.1%}, as a running sum's does (batch noise alone keeps it near 10-50%)")
        conf = max(conf, float(np.clip(1 - sm.late / SMOOTH_LATE_CHANGE, 0.5, 1)))
    if not parts:
        return None
    return Cause("missing_zero_grad", "High", _growing_first(run), _start(run),
                 "; ".join(parts) + ": each step's gradient is added to the last", conf)


def _output_bias_grad(run) -> float:
    """Largest |g| of the output layer's bias at the first recorded step (NaN without one). For a
    cross entropy averaged over the batch each entry is a mean of (p - y), so at most 1."""
    out = _output_layer(run)
    if out is None or run.n_steps == 0:
        return float("nan")
    b = [i for i, info in enumerate(run.layers) if info.module == out.module and info.name.endswith("bias")]
    return float(run.metric("max_abs")[0, b[0]]) if b else float("nan")


def _loss_scale(c: Context) -> Cause | None:
    L = c.loss
    if not L.logged or not (L.start > SUMMED_LOSS_START):
        return None
    ob = _output_bias_grad(c.run)
    if np.isfinite(ob) and ob <= MEAN_LOSS_BIAS_GRAD:  # a large loss from huge logits, averaged all the same
        return None
    return Cause("loss_scale", "Low", _growing_first(c.run), _start(c.run),
                 f"the loss starts at {L.start:.3g}, far above a per-sample loss (a cross entropy starts near "
                 f"ln(classes), under 12)" + (f", and the output bias gradient reaches {ob:.3g} where a batch mean "
                                              f"of (p - y) stays within 1" if np.isfinite(ob) else "")
                 + ": it looks summed over the batch, which multiplies every gradient by the batch size", float(np.clip(np.log10(L.start / SUMMED_LOSS_START) + 0.5, 0, 1)))


def _input_scale(c: Context) -> Cause | None:
    rms = input_rms(c.run, c.arch)
    if not np.isfinite(rms) or INPUT_RMS_LOW <= rms <= INPUT_RMS_HIGH:
        return None
    layers = [c.run.layer_names[i] for i in c.arch.input_layers]
    side = "large" if rms > INPUT_RMS_HIGH else "small"
    return Cause("input_scale", "High", layers, _start(c.run),
                 f"the data entering {layers[0]} has an RMS of about {rms:.3g} (normalised data: about 1), "
                 f"read off its weight and bias gradients: the inputs are far too {side}",
                 float(np.clip(abs(np.log10(rms)) / 3, 0, 1)))


def _lr_too_high(c: Context) -> Cause | None:
    run, L = c.run, c.loss
    signals: list[tuple[int | None, str]] = []
    if L.logged and L.rebound_step is not None:
        signals.append((L.rebound_step, f"the loss climbed back to {L.rebound_to:.3g} at step {L.rebound_step} "
                                        f"after reaching {L.rebound_from:.3g} (it started at {L.start:.3g})"))
    if L.logged and L.spike_share >= LOSS_SPIKE_SHARE:
        signals.append((L.spike_step, f"the loss jumped above {L.start * LOSS_SPIKE:.3g} ({LOSS_SPIKE:g}x where it started) on "
                                      f"{L.spike_share:.0%} of steps from step {L.spike_step}"))
    # large updates and growing weights are how a small model learns fast; they are evidence only
    # when the loss did not fall cleanly (or was not logged: then only far beyond the healthy band)
    clean = (L.logged and L.fell and L.rebound_step is None  # a NaN after a clean fall has its own cause
             and L.spike_share < LOSS_SPIKE_SHARE)
    too_high = UPDATE_RATIO_TOO_HIGH if L.logged and not clean else UPDATE_RATIO_UNLOGGED
    steps_u, ratio = c.update_ratio
    hi = np.flatnonzero(ratio > too_high)
    if hi.size:
        signals.append((int(steps_u[hi[0]]), f"the typical layer's update was {_fmt(float(ratio[hi[0]]))} of its "
                                             f"weight norm at step {int(steps_u[hi[0]])} (healthy: 1e-4 to 1e-2)"))
    wg = weight_growth(run)
    with _quiet():
        med_growth = float(np.nanmedian(wg[c.s.trainable])) if np.isfinite(wg[c.s.trainable]).any() else np.nan
    if med_growth > WEIGHT_BLOWUP:
        w = run.metric("weight_norm")
        with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
            rows = np.flatnonzero(np.nanmedian(w / w[0], axis=1) > WEIGHT_BLOWUP) if run.n_steps else np.zeros(0, int)
        signals.append((int(run.steps[rows[0]]) if len(rows) else None,
                        f"the typical layer's weight norm grew {med_growth:.3g}x"))
    dead = _died_during_training(c)
    if dead is not None and not clean:
        signals.append(dead)
    nf_after_rise = (L.nonfinite_step is not None and L.rebound_step is not None
                     and L.rebound_step < L.nonfinite_step)
    if not signals:
        return None
    first = min((s for s, _ in signals if s is not None), default=_start(run))
    # most affected first: largest weight growth
    order = np.argsort(-np.nan_to_num(wg, nan=-1.0))
    layers = [run.layer_names[i] for i in order if c.s.trainable[i] and np.isfinite(wg[i])]
    nonfinite = L.nonfinite_step is not None or (c.s.exact["nonfinite_share"] > 0).any()
    text = "; ".join(t for _, t in signals)
    if nf_after_rise or (nonfinite and first is not None):
        text += "; then the values went NaN/Inf"
    return Cause("lr_too_high", "Critical" if nonfinite else "High", layers, first, text,
                 float(np.clip(0.4 + 0.3 * len(signals), 0, 1)))


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
    first = _first_step(run, z)
    if z[0].any() or first is None:
        return None
    return (first, f"{int(dead.sum())} layers went dead at step {first} (their gradients were alive before)")


def _not_in_optimizer(c: Context) -> Cause | None:
    run = c.run
    ex, t = c.s.exact, run.thresholds
    # a vanishing or dead gradient moves a weight by less than float32 can show: not this cause
    starved = (ex["vanishing_share"] >= t.minor_issue_ratio) | (ex["dead_share"] >= t.minor_issue_ratio)
    m = never_updated(run) & ~starved
    if not m.any():
        return None
    idx = np.flatnonzero(m)
    return Cause("not_in_optimizer", "High", _names(run, idx), _start(run),
                 f"{len(idx)} trainable parameter tensor{'s' * (len(idx) != 1)} "
                 f"({sum(run.layers[i].numel for i in idx):,} values) received gradients but the optimizer "
                 "never changed them, while it updated the others", 1.0)


def _no_gradient(c: Context) -> Cause | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "unused"]
    if not idx or run.n_steps == 0:
        return None
    return Cause("no_gradient", "High", _names(run, idx), _start(run),
                 f"{len(idx)} trainable parameter tensor{'s' * (len(idx) != 1)} "
                 f"({sum(run.layers[i].numel for i in idx):,} values) never received a gradient in "
                 f"{run.n_steps} recorded steps: they are cut off from the loss (a .detach(), a branch not "
                 "used in the loss, or torch.no_grad() around part of the forward)", 1.0)


def _dead_units(c: Context) -> Cause | None:
    run, ex, t = c.run, c.s.exact, c.run.thresholds
    dead = c.dead_layers
    if not dead.any():
        return None
    mods = [info.module for info in run.layers]
    alive_bias = {mods[i] for i, info in enumerate(run.layers) if info.name.endswith("bias") and not dead[i]
                  and ex["known_steps"][i] > 0}
    # a weight whose own bias still gets a gradient is dead because its *input* is zero: the dead
    # units are in the layer feeding it, so it is evidence, not the culprit
    starved_input = [i for i in np.flatnonzero(dead) if run.layers[i].name.endswith("weight") and mods[i] in alive_bias]
    culprits = [i for i in np.flatnonzero(dead) if i not in starved_input]
    if not culprits:
        culprits = list(np.flatnonzero(dead))
    bi = np.array([run.layers[i].backward_index for i in culprits])
    culprits = [culprits[j] for j in np.argsort(np.where(bi >= 0, bi, 1 << 30), kind="stable")]
    ds = ex["dead_share"]
    flags = dead_flags(run.metric("zero_frac")[:, culprits], run.metric("grad_norm")[:, culprits], t)
    reaches_input = any(i in culprits for i in c.arch.input_layers)
    share = float(ds[culprits].mean())
    pr = "Critical" if share >= t.critical_issue_ratio and reaches_input else "High"
    text = (f"{len(culprits)} layer{'s' * (len(culprits) != 1)} had at least {t.dead_zero_fraction:.0%} of their "
            f"gradient entries exactly zero on {share:.0%} of steps, starting at {run.layer_names[culprits[0]]} "
            "(the loss side of the dead zone: its units output zero, so nothing flows back through them)")
    if starved_input:
        text += (f"; {', '.join(_names(run, starved_input[:3]))} get{'s' * (len(starved_input) == 1)} zero weight "
                 "gradients because their input is all zeros")
    # the starved next-layer weights are named last: affected (their gradient is zero too), not the cause
    return Cause("dead_units", pr, _names(run, culprits) + _names(run, starved_input), _first_step(run, flags), text,
                 float(np.clip(share, 0, 1)))


def _exploding_at_init(c: Context) -> Cause | None:
    """A classifier whose cross entropy starts many times above ln(classes) while its output bias
    gradient stays within a batch mean's bound: its outputs are huge before the first update, so
    the weights were initialised too large (no learning rate is involved yet)."""
    run, L = c.run, c.loss
    C = _output_classes(run)
    if C is None or not L.logged or not np.isfinite(L.start):
        return None
    first = run.scalar("loss")[0]
    chance = float(np.log(C))
    ob = _output_bias_grad(run)
    graph = LossGraph.of_run(run)
    factor = EXPLODING_LOSS_FACTOR_CE if graph is not None and graph.cross_entropy else EXPLODING_LOSS_FACTOR
    if not (first > factor * chance and (not np.isfinite(ob) or ob <= MEAN_LOSS_BIAS_GRAD)):
        return None
    if not np.isfinite(ob) and first > SUMMED_LOSS_START:  # no bias to tell a sum from huge outputs
        return None
    mods = {info.module for info in run.layers if info.name.endswith("weight") and len(info.shape) >= 2
            and not is_embedding(info.module_type)}
    ws = [i for i, info in enumerate(run.layers) if info.module in mods and info.backward_index >= 0]
    ws.sort(key=lambda i: -run.layers[i].backward_index)  # input side first: where the product is largest
    return Cause("exploding", "High", _names(run, ws), _start(run),
                 f"the loss starts at {first:.3g}, {first / chance:.0f}x the ln({C}) = {chance:.2f} of a {C}-class "
                 "classifier at initialisation, with the output bias gradient within its bound of 1: the "
                 "outputs are huge before any update, so the weights are initialised too large", 0.8,
                 at_init=True)


def _exploding(c: Context) -> Cause | None:
    init = _exploding_at_init(c)
    if init is not None:
        return init
    fs = _by_factor(c.factors, "exploding")
    if not fs:
        return None
    run, t = c.run, c.run.thresholds
    idx = [run.layer_index(f.layer) for f in fs]
    with np.errstate(invalid="ignore"):
        flags = run.metric("max_abs")[:, idx] > t.exploding
    return Cause("exploding", "High", [f.layer for f in fs], _first_step(run, flags),
                 f"{fs[0].layer}: {fs[0].evidence}" + (f"; {len(fs) - 1} more layers" if len(fs) > 1 else ""),
                 max(f.severity for f in fs))


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
#: ... and from this many decades on most steps when the loss has not moved from its start at all
#: (healthy zoo runs reach 2.7 on a few steps, always with a falling loss; the flat-loss runs of other
#: mistakes stay under it on 96%+ of steps; a CNN initialised x0.1 sits at 2.8 with a flat loss).
VANISHING_DECADES_STUCK = 2.5
VANISHING_STUCK_SHARE = 0.5


def _input_side_prefix(run, member: np.ndarray, share: float) -> np.ndarray:
    """Layer indices of ``member`` within the longest input-side stretch (deepest in the backward
    order first) in which members make up at least ``share`` of the layers, ending at a member."""
    bi = np.array([info.backward_index for info in run.layers])
    if not (bi >= 0).any():  # no backward order recorded (ArrayRecorder): the run's order is depth order
        bi = np.arange(run.n_layers)[::-1]
    order = np.argsort(-np.where(bi >= 0, bi, -1), kind="stable")
    order = order[bi[order] >= 0]
    m = member[order]
    if not m.size or not m[0]:
        return np.zeros(0, int)
    frac = np.cumsum(m) / np.arange(1, m.size + 1)
    ok = np.flatnonzero((frac >= share) & m)
    return order[: ok[-1] + 1][m[: ok[-1] + 1]]


def _fading_with_depth(c: Context) -> Cause | None:
    """The gradient falls by ``VANISHING_DECADES`` or more from the output layer to the input layer
    on at least ``minor_issue_ratio`` of steps (often only the first ones: an adaptive optimizer
    can grow the weights until it recovers): the layers ``STARVED_DECADES`` below the output there."""
    run, t = c.run, c.run.thresholds
    att, out = depth_attenuation(run, c.arch)
    bad = att >= VANISHING_DECADES
    at_start = run.n_steps >= VANISHING_START_STEPS and bool(bad[:VANISHING_START_STEPS].all())
    stuck = c.loss.logged and c.loss.flat and not c.loss.fell
    bound = VANISHING_DECADES
    if stuck and bad.mean() < t.minor_issue_ratio and not at_start and \
            np.mean(att >= VANISHING_DECADES_STUCK) >= VANISHING_STUCK_SHARE:
        bound = VANISHING_DECADES_STUCK
        bad = att >= bound
    if not run.n_steps or out is None or (bad.mean() < t.minor_issue_ratio and not at_start):
        return None
    bad_rows = np.flatnonzero(bad)
    lv = layer_levels(run, bad_rows[sample_rows(bad_rows.size, MAX_ROWS)])  # a bounded sample of them
    with _quiet():
        below = -np.nanmedian(lv - lv[:, [out]], axis=0)
    emb = c.embedding
    starved = (below >= STARVED_DECADES) & ~emb & c.s.trainable
    mods = {run.layers[i].module for i in np.flatnonzero(starved)}
    starved |= np.array([info.module in mods for info in run.layers]) & ~emb & c.s.trainable  # bias with its weight
    bi = np.array([info.backward_index for info in run.layers])
    idx = [i for i in np.argsort(-bi, kind="stable") if starved[i]]
    if not idx:
        return None
    names = _names(run, idx)
    recovered = bad.mean() < t.minor_issue_ratio
    first = int(run.steps[bad_rows[0]])
    return Cause("vanishing", "Medium" if recovered else "High", names, first,
                 f"the gradient falls {np.nanmax(att):.1f} decades from the output layer to the input layer "
                 f"(more than {bound:g} on {bad.mean():.0%} of steps, from step {first}"
                 + ("; the loss has not moved from its start" if bound < VANISHING_DECADES else "") + "); "
                 f"{len(idx)} layers from {names[0]} sit {STARVED_DECADES:g}+ decades below the output there"
                 + (" (the optimizer grew the weights until it recovered, which cost those steps)" if recovered else ""),
                 float(np.clip(bad.mean() * 2, 0.3, 1)))


def _vanishing(c: Context) -> Cause | None:
    run, t = c.run, c.run.thresholds
    fs = {f.layer: f for f in c.factors if f.kind in ("vanishing", "weak")}
    member = np.array([n in fs for n in run.layer_names]) & ~c.embedding
    idx = _input_side_prefix(run, member, VANISHING_PREFIX_SHARE)
    fading = _fading_with_depth(c)
    if not idx.size:
        return fading
    names = _names(run, idx)
    with np.errstate(invalid="ignore"):
        flags = run.metric("mean_abs")[:, idx] < t.vanishing
    first = _first_step(run, flags) if flags.any() else _start(run)
    big = len(idx) >= 2 or any(fs[n].critical for n in names)
    f0 = fs[names[0]]
    text = (f"{names[0]}: {f0.evidence}; the gradient fades towards the input: {len(idx)} layer"
            f"{'s' * (len(idx) != 1)} from {names[0]} to {names[-1]} "
            f"({sum(run.layers[i].numel for i in idx):,} parameters)")
    if fading is not None:  # the layers either measure names, input side first
        both = set(names) | set(fading.layers)  # input side first, as each measure lists them
        names = [n for n in fading.layers if n in both] + [n for n in names if n not in set(fading.layers)]
        names.sort(key=lambda n: -run.layers[run.layer_index(n)].backward_index)
        text += "; " + fading.evidence
        big = True
    return Cause("vanishing", "High" if big else "Medium", names, first, text, max(fs[n].severity for n in names if n in fs))


def _output_layer(run):
    """The output layer's weight: the 2-d weight nearest the loss in the backward order."""
    ws = [info for info in run.layers if info.name.endswith("weight") and len(info.shape) == 2 and info.backward_index >= 0]
    return min(ws, key=lambda info: info.backward_index) if ws else None


def _output_classes(run) -> int | None:
    """Classes of the output layer: its weight's number of rows."""
    out = _output_layer(run)
    return int(out.shape[0]) if out is not None and out.shape[0] >= 2 else None


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
        out = _output_layer(run)
        layers = [info.name for info in run.layers if out is not None and info.module == out.module]
        where = (f" by the model's last module {m.module or 'itself'}" if m.in_model else " in the loss code")
        return Cause("saturated_output", "High", layers, _start(run),
                     f"the loss's autograd graph shows {m.what} ({' <- '.join(m.ops)}, applied{where}): the output "
                     f"saturates and its gradients shrink" + (f"; the output layer is {out.module}" if out else ""),
                     1.0, at_init=True)
    return _saturated_by_loss(c)


def _saturated_by_loss(c: Context) -> Cause | None:
    """Without the loss's graph: a loss that started at ln(C), never went below the softmax floor
    ln(1 + (C - 1)/e), and flattened just above it."""
    run, L = c.run, c.loss
    C = _output_classes(run)
    if C is None or not L.logged or run.n_steps < 20:
        return None
    chance = float(np.log(C))
    floor = float(np.log1p((C - 1) / np.e))
    if not (abs(L.start - chance) <= CHANCE_TOLERANCE * chance and L.lowest >= FLOOR_TOLERANCE * floor):
        return None
    y = run.scalar("loss").astype(np.float64)
    y = y[np.isfinite(y)]
    tail = y[-max(5, y.size // 3):]
    k = max(1, tail.size // 4)
    if abs(np.median(tail[-k:]) - np.median(tail[:k])) > SATURATED_TAIL_CHANGE * L.start:
        return None
    near = L.end <= (1 + SATURATED_NEAR_FLOOR) * floor
    if not near:
        return None
    return Cause("saturated_output", "High", [run.layer_names[i] for i in range(run.n_layers)
                                              if run.layers[i].backward_index in (0, 1)][:2], _start(run),
                 f"the loss started at {L.start:.3g} = ln({C}) like a {C}-class cross entropy but flattened at "
                 f"{L.end:.3g}, never below {floor:.3g} = ln(1 + {C - 1}/e): the lowest a cross entropy of "
                 "softmax outputs (probabilities, not logits) can reach", 0.7)


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
    se = np.sqrt(np.sum(resid ** 2) / (y.size - 2) / np.sum((x - x.mean()) ** 2))
    if not (slope < 0 and -slope > SLOW_FALL_SE * se):
        return None
    return float(-slope * 100 / L.start)


def _lr_too_low(c: Context) -> Cause | None:
    run, L = c.run, c.loss
    steps_u, ratio = c.update_ratio
    if not ratio.size or not np.isfinite(ratio).any():
        return None
    med = float(np.nanmedian(ratio))
    loss = (f"; the loss moved from {L.start:.3g} to {L.end:.3g}" if L.logged else "")
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
        return Cause("lr_too_low", "Medium", layers, _start(run),
                     f"the typical layer's update is {med:.2g} of its weight norm per step (healthy: 1e-4 to 1e-2)"
                     + loss, float(np.clip(np.log10(UPDATE_RATIO_TOO_LOW / med), 0, 1)) if med > 0 else 1.0)
    return Cause("lr_too_low", "Medium", layers, _start(run),
                 f"the loss falls steadily but slowly, {slow:.1%} of its start per 100 steps "
                 f"(from {L.start:.3g} to {L.end:.3g}), with gradients that neither vanish nor die: the steps "
                 f"are too small (typical update {med:.2g} of the weight norm)", 0.5)


def _plateau(c: Context) -> Cause | None:
    p, L = c.dyn.plateau, c.loss
    if not p.is_plateau:
        return None
    stuck = L.logged and np.isfinite(L.plateau_level) and L.plateau_level > STUCK_LOSS_LEVEL
    pr = "Medium" if stuck else "Low"
    what = (f"the loss has stayed near {L.end:.3g} ({L.plateau_level:.0%} of where it started)" if L.logged
            else f"the {c.dyn.series} has flattened")
    return Cause("plateau", pr, [], p.start_step,
                 f"{what} for {p.duration_steps} steps (relative change {p.rel_change_per_step:.2g} per step)",
                 0.5 if stuck else 0.2)


def _frozen(c: Context) -> Cause | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "frozen"]
    if not idx:
        return None
    return Cause("frozen", "Low", _names(run, idx), _start(run),
                 f"{len(idx)} parameter tensor{'s' * (len(idx) != 1)} ({sum(run.layers[i].numel for i in idx):,} "
                 "values) have requires_grad=False and never train", 1.0)


RULES = {"nonfinite": _nonfinite, "missing_zero_grad": _missing_zero_grad, "loss_scale": _loss_scale,
         "input_scale": _input_scale, "saturated_output": _saturated_output, "lr_too_high": _lr_too_high,
         "not_in_optimizer": _not_in_optimizer, "no_gradient": _no_gradient, "dead_units": _dead_units,
         "exploding": _exploding, "vanishing": _vanishing, "lr_too_low": _lr_too_low, "plateau": _plateau,
         "frozen": _frozen}
assert tuple(RULES) == CAUSES


# --------------------------------------------------------------------------- folding and ranking
def _fold(found: dict[str, Cause], loss: LossEvidence, start: int | None) -> None:
    """Fold each symptom into the first found cause (in ``CAUSES`` order) that explains it. The NaN
    is folded into a too-high learning rate only when the loss had already climbed before it (a NaN
    out of a steady run has a cause of its own: its origin)."""
    for name in CAUSES:
        cause = found.get(name)
        if cause is None:
            continue
        for sym in EXPLAINS.get(name, ()):
            if sym not in found or sym == name:
                continue
            if sym == "nonfinite" and (name == "lr_too_high" or found[sym].origin is not None):
                if found[sym].origin is not None and name != "lr_too_high":
                    found[sym].after = name  # a consequence, but where it began is worth its own line
                continue
            if sym == "dead_units" and found[sym].first_step == start:  # dead from the start: the init
                continue
            if name == "saturated_output" and sym == "vanishing" and not cause.at_init:
                continue  # guessed from the loss alone, a softmax explains no vanishing (the reverse is likelier)
            if sym == "saturated_output" and found[sym].at_init:
                continue  # read off the loss's graph: a cause of its own, never another's symptom
            s = found.pop(sym)
            cause.explains.append(f"{sym}: {s.evidence}")
            if s.priority == "Critical" or sym == "nonfinite":
                cause.priority = "Critical"
            elif name == "loss_scale":  # a summed loss that blew the steps up is no longer harmless
                cause.priority = min(cause.priority, "High", key=PRIORITY_ORDER.index)
    nf, hi = found.get("nonfinite"), found.get("lr_too_high")
    if nf is not None and hi is not None and hi.first_step is not None \
            and nf.first_step is not None and hi.first_step < nf.first_step:
        hi.priority = "Critical"
        if nf.origin is None:
            found.pop("nonfinite")
            hi.explains.append(f"nonfinite: {nf.evidence}")
        else:
            nf.after = "lr_too_high"


def find_causes(s: Series, factors: list[RiskFactor], regions: list[Region], dyn: Dynamics,
                arch: Architecture | None = None) -> list[Cause]:
    """Every cause the evidence supports, symptoms folded into their causes, ranked: priority first,
    then ``CAUSES`` order."""
    ctx = Context(s, factors, regions, dyn, loss_evidence(s.run), arch or architecture(s.run))
    found = {}
    for name, rule in RULES.items():
        c = rule(ctx)
        if c is not None:
            found[name] = c
    ex = found.get("exploding")
    if ex is not None and ex.at_init:  # outputs huge before any update: the init, not the step size
        for sym in ("lr_too_high", "nonfinite", "dead_units"):
            if sym == "nonfinite" and sym in found and found[sym].origin is not None:
                found[sym].after, ex.priority = "exploding", "Critical"
                continue
            if sym in found:
                folded = found.pop(sym)
                ex.explains.append(f"{sym}: {folded.evidence}")
                if folded.priority == "Critical":
                    ex.priority = "Critical"
    _fold(found, ctx.loss, _start(s.run))
    out = list(found.values())
    for c in out:  # a consequence ranks with its cause
        if c.after is not None and c.after in found:
            c.priority = found[c.after].priority
    out.sort(key=lambda c: (PRIORITY_ORDER.index(c.priority),
                            CAUSES.index(c.after) + 0.5 if c.after in found else CAUSES.index(c.cause)))
    return out


# --------------------------------------------------------------------------- one verdict
def verdict(causes: list) -> str:
    """The run's health from its causes, used by every output (analyze, run.summary(), the panel, the
    report, the CLI): Critical with a Critical cause, Warning with a High or Medium one, else Healthy
    (Low causes, such as frozen layers or a converged plateau, are information)."""
    prios = {c.priority for c in causes}
    if "Critical" in prios:
        return "Critical"
    if prios & {"High", "Medium"}:
        return "Warning"
    return "Healthy"


def layer_verdicts(run, causes: list) -> np.ndarray:
    """Per layer, the worst health any cause gives it: Critical for a Critical cause naming it,
    Warning for a High or Medium one; Healthy otherwise; Unknown for a layer without any gradient
    that no cause names (frozen layers: their status says why)."""
    L = run.n_layers
    rank = np.zeros(L, int)  # 0 healthy, 1 warning, 2 critical
    idx = {n: i for i, n in enumerate(run.layer_names)}
    for c in causes:
        lvl = 2 if c.priority == "Critical" else 1 if c.priority in ("High", "Medium") else 0
        for n in c.layers:
            i = idx.get(n)
            if i is not None:
                rank[i] = max(rank[i], lvl)
    got = np.isfinite(run.metric("grad_norm")).any(axis=0) if run.n_steps else np.zeros(L, bool)
    out = np.where(rank == 2, "Critical", np.where(rank == 1, "Warning", "Healthy")).astype(object)
    out[(rank == 0) & ~got] = "Unknown"
    return out
