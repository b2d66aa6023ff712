"""The rules for causes in what the layers do: NaN/Inf values, parameters the optimizer never
moves or that never get a gradient, frozen ones, dead units, exploding and vanishing gradients.
Each reads the ``Context`` and returns a ``Cause`` or None; the bounds they use are in
``vocabulary``."""

from __future__ import annotations

import numpy as np

from ..collect.loss_graph import LossGraph
from .evidence import depth_attenuation, is_embedding, layer_levels, never_updated
from .nonfinite import weight_growth as origin_weight_growth
from .stats import MAX_ROWS, _quiet, dead_flags, sample_rows
from .vocabulary import (
    CHANCE_TOLERANCE,
    EXPLODING_LOSS_FACTOR,
    EXPLODING_LOSS_FACTOR_CE,
    MEAN_LOSS_BIAS_GRAD,
    STARVED_DECADES,
    SUMMED_LOSS_START,
    VANISHING_DECADES,
    VANISHING_DECADES_STUCK,
    VANISHING_PREFIX_SHARE,
    VANISHING_START_STEPS,
    VANISHING_STUCK_SHARE,
    WEIGHT_BLOWUP,
    Cause,
    Context,
    factors_of,
    first_flagged_step,
    names_of,
    output_bias_grad,
    output_classes,
    start_step,
)


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
        if grown >= WEIGHT_BLOWUP:  # the steps had blown the weights up: the module only overflowed first
            parts.append(f"a layer's weight norm had grown {grown:.3g}x by then")
    elif isinstance(off := run.meta.get("nonfinite_tracing"), dict):  # "auto" stopped the tracer before
        at, why = off.get("stopped_at_step", "?"), off.get("reason", "it cost more than it was worth")
        parts.append(f"origin not traced: tracing was turned off at step {at} because {why}")
    return Cause("nonfinite", "Critical", layers, first, "; ".join(parts), 1.0, origin=origin)


def _tensors(run, idx, kind: str = "") -> str:
    """ "3 trainable parameter tensors (1,234 values)": how many of them, and how big."""
    return (
        f"{len(idx)} {kind}parameter tensor{'s' * (len(idx) != 1)} ({sum(run.layers[i].numel for i in idx):,} values)"
    )


def _not_in_optimizer(c: Context) -> Cause | None:
    run = c.run
    ex, t = c.s.exact, run.thresholds
    # a vanishing or dead gradient moves a weight by less than float32 can show: not this cause
    starved = (ex["vanishing_share"] >= t.minor_issue_ratio) | (ex["dead_share"] >= t.minor_issue_ratio)
    m = never_updated(run) & ~starved
    if not m.any():
        return None
    idx = np.flatnonzero(m)
    return Cause(
        "not_in_optimizer",
        "High",
        names_of(run, idx),
        start_step(run),
        f"{_tensors(run, idx, 'trainable ')} received gradients but the optimizer never changed them, "
        "while it updated the others",
        1.0,
    )


def _no_gradient(c: Context) -> Cause | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "unused"]
    if not idx or run.n_steps == 0:
        return None
    return Cause(
        "no_gradient",
        "High",
        names_of(run, idx),
        start_step(run),
        f"{_tensors(run, idx, 'trainable ')} never received a gradient in {run.n_steps} recorded steps: "
        "they are cut off from the loss (a .detach(), a branch not used in the loss, or torch.no_grad() "
        "around part of the forward)",
        1.0,
    )


def _frozen(c: Context) -> Cause | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.status == "frozen"]
    if not idx:
        return None
    return Cause(
        "frozen",
        "Low",
        names_of(run, idx),
        start_step(run),
        f"{_tensors(run, idx)} have requires_grad=False and never train",
        1.0,
    )


def _dead_units(c: Context) -> Cause | None:
    run, ex, t = c.run, c.s.exact, c.run.thresholds
    dead = c.dead_layers
    if not dead.any():
        return None
    mods = [info.module for info in run.layers]
    alive_bias = {
        mods[i]
        for i, info in enumerate(run.layers)
        if info.name.endswith("bias") and not dead[i] and ex["known_steps"][i] > 0
    }
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
    text = (
        f"{len(culprits)} layer{'s' * (len(culprits) != 1)} had at least {t.dead_zero_fraction:.0%} of their "
        f"gradient entries exactly zero on {share:.0%} of steps, starting at {run.layer_names[culprits[0]]} "
        "(the loss side of the dead zone: its units output zero, so nothing flows back through them)"
    )
    if starved_input:
        text += (
            f"; {', '.join(names_of(run, starved_input[:3]))} get{'s' * (len(starved_input) == 1)} zero weight "
            "gradients because their input is all zeros"
        )
    # the starved next-layer weights are named last: affected (their gradient is zero too), not the cause
    return Cause(
        "dead_units",
        pr,
        names_of(run, culprits) + names_of(run, starved_input),
        first_flagged_step(run, flags),
        text,
        float(np.clip(share, 0, 1)),
    )


def _exploding_at_init(c: Context) -> Cause | None:
    """A classifier whose cross entropy starts many times above ln(classes) while its output bias
    gradient stays within a batch mean's bound: its outputs are huge before the first update, so
    the weights were initialised too large (no learning rate is involved yet)."""
    run, L = c.run, c.loss
    C = output_classes(run)
    if C is None or not L.logged or not np.isfinite(L.start):
        return None
    first = run.scalar("loss")[0]
    chance = float(np.log(C))
    ob = output_bias_grad(run)
    graph = LossGraph.of_run(run)
    factor = EXPLODING_LOSS_FACTOR_CE if graph is not None and graph.cross_entropy else EXPLODING_LOSS_FACTOR
    if not (first > factor * chance and (not np.isfinite(ob) or ob <= MEAN_LOSS_BIAS_GRAD)):
        return None
    if not np.isfinite(ob) and first > SUMMED_LOSS_START:  # no bias to tell a sum from huge outputs
        return None
    mods = {
        info.module
        for info in run.layers
        if info.name.endswith("weight") and len(info.shape) >= 2 and not is_embedding(info.module_type)
    }
    ws = [i for i, info in enumerate(run.layers) if info.module in mods and info.backward_index >= 0]
    ws.sort(key=lambda i: -run.layers[i].backward_index)  # input side first: where the product is largest
    return Cause(
        "exploding",
        "High",
        names_of(run, ws),
        start_step(run),
        f"the loss starts at {first:.3g}, {first / chance:.0f}x the ln({C}) = {chance:.2f} of a {C}-class "
        "classifier at initialisation, with the output bias gradient within its bound of 1: the "
        "outputs are huge before any update, so the weights are initialised too large",
        0.8,
        at_init=True,
    )


def _exploding(c: Context) -> Cause | None:
    init = _exploding_at_init(c)
    if init is not None:
        return init
    fs = factors_of(c.factors, "exploding")
    if not fs:
        return None
    run, t = c.run, c.run.thresholds
    idx = [run.layer_index(f.layer) for f in fs]
    with np.errstate(invalid="ignore"):
        flags = run.metric("max_abs")[:, idx] > t.exploding
    return Cause(
        "exploding",
        "High",
        [f.layer for f in fs],
        first_flagged_step(run, flags),
        f"{fs[0].layer}: {fs[0].evidence}" + (f"; {len(fs) - 1} more layers" if len(fs) > 1 else ""),
        max(f.severity for f in fs),
    )


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
    C = output_classes(run)
    stuck = (
        c.loss.logged
        and c.loss.flat
        and not c.loss.fell
        and C is not None  # a classifier stuck at chance
        and abs(c.loss.start - np.log(C)) <= CHANCE_TOLERANCE * np.log(C)
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
    starved = (below >= STARVED_DECADES) & ~emb & c.s.trainable
    mods = {run.layers[i].module for i in np.flatnonzero(starved)}
    starved |= np.array([info.module in mods for info in run.layers]) & ~emb & c.s.trainable  # bias with its weight
    bi = np.array([info.backward_index for info in run.layers])
    idx = [i for i in np.argsort(-bi, kind="stable") if starved[i]]
    if not idx:
        return None
    names = names_of(run, idx)
    recovered = bad.mean() < t.minor_issue_ratio
    first = int(run.steps[bad_rows[0]])
    return Cause(
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


def _vanishing(c: Context) -> Cause | None:
    run, t = c.run, c.run.thresholds
    fs = {f.layer: f for f in c.factors if f.kind in ("vanishing", "weak")}
    member = np.array([n in fs for n in run.layer_names]) & ~c.embedding
    idx = _input_side_prefix(run, member, VANISHING_PREFIX_SHARE)
    fading = _fading_with_depth(c)
    if not idx.size:
        return fading
    names = names_of(run, idx)
    with np.errstate(invalid="ignore"):
        flags = run.metric("mean_abs")[:, idx] < t.vanishing
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
    return Cause(
        "vanishing", "High" if big else "Medium", names, first, text, max(fs[n].severity for n in names if n in fs)
    )


#: the rules of this module, by cause
RULES = {
    "nonfinite": _nonfinite,
    "not_in_optimizer": _not_in_optimizer,
    "no_gradient": _no_gradient,
    "dead_units": _dead_units,
    "exploding": _exploding,
    "vanishing": _vanishing,
    "frozen": _frozen,
}
