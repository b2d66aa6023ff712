"""``vanishing``: the gradient fading on its way back to the input. Two measures: layers weak
against the median layer (the health risk factors) forming the input side of the network, and the
RMS gradient entry falling ``VANISHING_DECADES`` from the output layer to the input layer
(``evidence.depth_attenuation``). Embedding tables never count (sparse by design). Its action
never asks for residuals in a residual network nor normalisation in a normalised one."""

from __future__ import annotations

import numpy as np

from ...rules import vanishing_flags
from ..evidence import depth_attenuation, layer_levels
from ..stats import MAX_ROWS, _quiet, sample_rows
from ._base import CauseRule, Context, Diagnosis
from ._shared import first_flagged_step, names_of, start_step

#: the vanishing layers must make up at least this share of the input side they span: the gradient
#: fades on its way back to the input. An isolated weak layer between healthy ones (an attention
#: query/key at initialisation) is not that problem.
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


def _fading_with_depth(c: Context) -> Diagnosis | None:
    """The gradient falls by ``VANISHING_DECADES`` or more from the output layer to the input layer
    on at least ``minor_issue_ratio`` of steps (often only the first ones: an adaptive optimizer
    can grow the weights until it recovers): the layers ``STARVED_DECADES`` below the output there."""
    run, t = c.run, c.t
    att, out = depth_attenuation(run, c.arch)
    bad = att >= VANISHING_DECADES
    at_start = run.n_steps >= VANISHING_START_STEPS and bool(bad[:VANISHING_START_STEPS].all())
    chance = c.task.chance
    stuck = (
        c.loss.logged
        and c.loss.flat
        and not c.loss.fell
        and chance is not None  # a classifier stuck at chance
        and abs(c.loss.start - chance) <= c.t.chance_tolerance * chance
    )
    bound = VANISHING_DECADES
    if (
        stuck
        and bad.mean() < t.minor_issue_ratio
        and not at_start
        and np.mean(att >= VANISHING_DECADES_STUCK) >= VANISHING_STUCK_SHARE
    ):
        bound = VANISHING_DECADES_STUCK
        bad = att >= bound
    if not run.n_steps or out is None or (bad.mean() < t.minor_issue_ratio and not at_start):
        return None
    bad_rows = np.flatnonzero(bad)
    lv = layer_levels(run, bad_rows[sample_rows(bad_rows.size, MAX_ROWS)])  # a bounded sample of them
    with _quiet():
        below = -np.nanmedian(lv - lv[:, [out]], axis=0)
    emb = c.embedding
    can = c.s.trainable & ~c.s.cannot_move & ~emb  # a gradient that is rounding noise is never starved
    starved = (below >= STARVED_DECADES) & can
    mods = {run.layers[i].module for i in np.flatnonzero(starved)}
    starved |= np.array([info.module in mods for info in run.layers]) & can  # bias with its weight
    bi = np.array([info.backward_index for info in run.layers])
    idx = [i for i in np.argsort(-bi, kind="stable") if starved[i]]
    if not idx:
        return None
    names = names_of(run, idx)
    recovered = bad.mean() < t.minor_issue_ratio
    first = int(run.steps[bad_rows[0]])
    return Diagnosis(
        "vanishing",
        "Medium" if recovered else "High",
        names,
        first,
        f"the gradient falls {np.nanmax(att):.1f} decades from the output layer to the input layer "
        f"(more than {bound:g} on {bad.mean():.0%} of steps, from step {first}"
        + ("; the loss has not moved from chance, ln(classes)" if bound < VANISHING_DECADES else "")
        + "); "
        f"{len(idx)} layers from {names[0]} sit {STARVED_DECADES:g}+ decades below the output there"
        + (" (the optimizer grew the weights until it recovered, which cost those steps)" if recovered else ""),
        float(np.clip(bad.mean() * 2, 0.3, 1)),
    )


def find(c: Context) -> Diagnosis | None:
    run, t = c.run, c.t
    # a converged loss (``LossEvidence.converged``) has small gradients because it is small: the
    # absolute bound on |g| says nothing of fading there; the measures against other layers still do
    kinds = ("weak",) if c.loss.converged else ("vanishing", "weak")
    fs = {f.layer: f for f in c.factors if f.kind in kinds}
    member = np.array([n in fs for n in run.layer_names]) & ~c.embedding
    # an input side frozen on purpose (fine-tuning) is not a member, as an embedding table there is
    # not: a partly frozen network reads as the same network unfrozen
    idx = np.zeros(0, int) if c.arch.frozen_input else _input_side_prefix(run, member, VANISHING_PREFIX_SHARE)
    fading = _fading_with_depth(c)
    if not idx.size:
        return fading
    names = names_of(run, idx)
    flags = vanishing_flags(run.metric("mean_abs")[:, idx], t)
    first = first_flagged_step(run, flags) if flags.any() else start_step(run)
    big = len(idx) >= 2 or any(fs[n].critical for n in names)
    f0 = fs[names[0]]
    text = (
        f"{names[0]}: {f0.evidence}; the gradient fades towards the input: {len(idx)} layer"
        f"{'s' * (len(idx) != 1)} from {names[0]} to {names[-1]} "
        f"({sum(run.layers[i].numel for i in idx):,} parameters)"
    )
    if fading is not None:  # the layers either measure names, input side first
        both = set(names) | set(fading.layers)  # input side first, as each measure lists them
        names = [n for n in fading.layers if n in both] + [n for n in names if n not in set(fading.layers)]
        names.sort(key=lambda n: -run.layers[run.layer_index(n)].backward_index)
        text += "; " + fading.evidence
        big = True
    return Diagnosis(
        "vanishing", "High" if big else "Medium", names, first, text, max(fs[n].severity for n in names if n in fs)
    )


def action(d: Diagnosis, c: Context) -> str:
    arch = c.arch
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


RULE = CauseRule(
    "vanishing",
    "vanishing gradients",
    find,
    action,
    kind="symptom",
    contradicts=("learns_nothing",),
    explains=("plateau", "lr_too_low", "saturated_output"),
)
