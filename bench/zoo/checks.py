"""Each label checked on its own run, in plain numbers from the recording: the loss really diverges,
the units really are dead, the new head really is not in the optimizer. Where a label is a claim
about damage (too high a rate, a forgotten zero_grad, unscaled inputs, a summed loss), the case's
*twin* is the yardstick: the same recipe trained without the mistake (runner.load_or_run(twin=True)).

``check_case`` raises AssertionError with the case id and the failing fact; ``TWIN_CAUSES`` says
which causes need the twin.
"""

from __future__ import annotations

import numpy as np

from .case import Case

#: a healthy run's loss must fall beyond its batch noise: Welch's t between the first and the last 10
#: steps' losses at least this (a noisy 40-step run and a fine-tuning run that starts low both count)
HEALTHY_FALL_T = 3.0
#: what "the loss falls" means for a twin (lr_too_low): below this fraction of where it started
HEALTHY_LOSS_RATIO = 0.8
#: a vanishing case's fault weights have, over the first VANISH_STEPS steps, a median gradient norm
#: below VANISH_RATIO of the largest weight's (how the labels were measured)
VANISH_STEPS, VANISH_RATIO = 10, 0.01
#: an exploding case's fault weights' early gradients are at least this many times the twin's
EXPLODE_FACTOR = 100.0
#: too high a rate: the loss ends (last 10 steps) at least this many times above the twin's, or
#: becomes non-finite, or ends at chance (within CHANCE_MARGIN nats of the entropy of the targets'
#: marginal distribution: nothing learnt beyond class or token frequencies) while the twin's goes
#: further below chance than that
WORSE_FACTOR = 1.5
CHANCE_MARGIN = 0.1
#: too low a rate: the loss ends above this fraction of where it started while the twin's falls
LOW_LR_LOSS_RATIO = 0.9
#: a forgotten zero_grad: the global gradient norm of the last 10 finite steps at least this many times
#: the twin's, or the accumulated sum overflowing to Inf/NaN while the twin stays finite
ACCUMULATE_FACTOR = 3.0
#: unscaled inputs: a fault layer's gradient norm at least this many times the twin's, or at most its
#: inverse (out of scale either way), over the first 10 steps; a summed loss: the global gradient norm
#: at least this many times the twin's
SCALE_FACTOR = 10.0
#: a saturated output: its layer's median gradient norm over the first 10 steps at most this fraction
#: of the twin's (later the twin fits its data and its own gradients fade, so early is the fair match)
SATURATED_FRACTION = 0.5

TWIN_CAUSES = frozenset(
    {"lr_too_high", "lr_too_low", "missing_zero_grad", "exploding", "input_scale", "loss_scale", "saturated_output"}
)


def loss_ratio(run) -> float:
    """Mean loss of the last 10 recorded steps over that of the first 10 (NaN when not finite)."""
    loss = np.asarray(run.scalar("loss"), dtype=np.float64)
    return float(np.mean(loss[-10:]) / np.mean(loss[:10])) if len(loss) >= 20 else float("nan")


def fall_t(run) -> float:
    """Welch's t of (first 10 steps' losses - last 10 steps' losses): how far the loss fell, in units
    of its batch noise (NaN when not finite)."""
    loss = np.asarray(run.scalar("loss"), dtype=np.float64)
    a, b = loss[:10], loss[-10:]
    se = np.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return float((a.mean() - b.mean()) / se) if se > 0 else float("inf") * np.sign(a.mean() - b.mean())


def _ends(run) -> tuple[float, float]:
    loss = np.asarray(run.scalar("loss"), dtype=np.float64)
    return float(np.mean(loss[:10])), float(np.mean(loss[-10:]))


def _early(run, names, steps: int = 10) -> np.ndarray:
    """Median gradient norm of ``names`` over the first ``steps`` steps."""
    g = run.metric("grad_norm")[:steps, [run.layer_index(n) for n in names]]
    return np.nanmedian(g, axis=0)


def check_case(case: Case, run, twin=None) -> None:
    """Assert the case's labels hold on its Run (and, for TWIN_CAUSES, against its twin's Run):
    every fault layer exists, every layer that never got a gradient is labelled or frozen on
    purpose, a healthy loss fell, and the fact each cause claims shows in the numbers."""
    names = set(run.layer_names)
    missing = [n for n in case.fault_layers if n not in names]
    assert not missing, f"{case.id}: fault_layers not in run.layer_names: {missing}"
    assert run.n_steps == case.steps, f"{case.id}: {run.n_steps} steps recorded, {case.steps} trained"
    g = run.metric("grad_norm")
    silent = [n for n, total in zip(run.layer_names, np.nansum(np.abs(g), axis=0)) if total == 0]
    unlabelled = [n for n in silent if n not in case.fault_layers and n not in case.intended_frozen]
    # gradients cleared before every step: no layer's gradient is ever seen at the step (its own check)
    assert case.cause == "cleared_before_step" or not unlabelled, (
        f"{case.id}: layers that never got a gradient are not labelled: {unlabelled}"
    )
    if case.healthy:
        t = fall_t(run)
        assert t >= HEALTHY_FALL_T, (
            f"{case.id}: healthy loss did not fall (t = {t:.1f}, last/first {loss_ratio(run):.2f})"
        )
        trained = [i for i, n in enumerate(run.layer_names) if n not in case.intended_frozen]
        assert np.isfinite(g[:, trained]).all(), f"{case.id}: healthy run has non-finite gradients"
        return
    if case.cause in TWIN_CAUSES:
        assert twin is not None, f"{case.id}: a {case.cause} label is checked against the twin run"
        _CHECKS[case.cause](case, run, twin)
    else:
        _CHECKS[case.cause](case, run, silent)


def _cols(case, run) -> list[int]:
    return [run.layer_index(n) for n in case.fault_layers]


def _silent(case, run, silent) -> None:
    got = [n for n in case.fault_layers if n not in silent]
    assert not got, f"{case.id}: labelled as getting no gradient but got one: {got}"


def _frozen(case, run, silent) -> None:
    _silent(case, run, silent)
    assert all(run.layers[c].status == "frozen" for c in _cols(case, run)), f"{case.id}: fault layers not frozen"


def _not_in_optimizer(case, run, silent) -> None:
    got = [n for n in case.fault_layers if n not in silent]
    assert got == list(case.fault_layers), f"{case.id}: a layer left out got no gradient"
    moved = np.nan_to_num(run.metric("update_norm")[:, _cols(case, run)]).max()
    assert moved == 0, f"{case.id}: a layer left out of the optimizer moved ({moved:.3g})"


def _dead(case, run, silent) -> None:
    zeros = np.nanmean(run.metric("zero_frac")[1:, _cols(case, run)])
    assert zeros > 0.99, f"{case.id}: dead layers' gradients are only {zeros:.0%} zeros"


def _vanishing(case, run, silent) -> None:
    g = run.metric("grad_norm")
    early = np.nanmedian(g[:VANISH_STEPS], axis=0)
    top = max(early[i] for i, n in enumerate(run.layer_names) if n.endswith("weight"))
    loud = [
        n
        for n, c in zip(case.fault_layers, _cols(case, run))
        if n.endswith("weight") and early[c] >= VANISH_RATIO * top
    ]
    assert not loud, f"{case.id}: labelled vanishing but not below {VANISH_RATIO} of the largest: {loud}"


def _nonfinite(case, run, silent) -> None:
    bad = (run.metric("nonfinite").sum(axis=1) > 0) | ~np.isfinite(run.scalar("loss"))
    assert bad.any(), f"{case.id}: no non-finite value was recorded"


def _exploding(case, run, twin) -> None:
    w = [n for n in case.fault_layers if n.endswith("weight")]
    ratio = _early(run, w) / _early(twin, w)
    quiet = [n for n, r in zip(w, ratio) if not r >= EXPLODE_FACTOR]
    assert not quiet, f"{case.id}: labelled exploding but under {EXPLODE_FACTOR:g}x the twin: {quiet}"


def chance_loss(case: Case) -> float:
    """The loss of a model that learnt only the targets' frequencies: the entropy of their marginal
    distribution (classes, next tokens) over the case's data set, in nats; for regression, the
    targets' variance (mean squared error of predicting their mean)."""
    from .cases import RECIPES
    from .models import ARCHS, TASKS

    task = TASKS[RECIPES[case.id].task or ARCHS[case.arch].task](case.seed)
    if task.regression:
        return float(task.y.var())
    p = np.bincount(task.y.reshape(-1).numpy()).astype(np.float64)
    p = p[p > 0] / p.sum()
    return float(-(p * np.log(p)).sum())


def _lr_too_high(case, run, twin) -> None:
    first, last = _ends(run)
    _, twin_last = _ends(twin)
    diverged = not np.isfinite(last) or not np.isfinite(run.scalar("loss")).all()
    chance = chance_loss(case)
    at_chance = last >= chance - CHANCE_MARGIN and twin_last < chance - CHANCE_MARGIN
    assert diverged or at_chance or last >= WORSE_FACTOR * twin_last, (
        f"{case.id}: loss ends at {last:.3g}: not {WORSE_FACTOR:g}x above the twin's {twin_last:.3g}, "
        f"nor at chance ({chance:.3g})"
    )


def _lr_too_low(case, run, twin) -> None:
    r, rt = loss_ratio(run), loss_ratio(twin)
    assert r > LOW_LR_LOSS_RATIO and rt < HEALTHY_LOSS_RATIO, (
        f"{case.id}: loss last/first {r:.2f} (twin {rt:.2f}): not stalled while the twin trains"
    )


def _missing_zero_grad(case, run, twin) -> None:
    g, gt = run.scalar("global_norm"), twin.scalar("global_norm")
    overflow = not np.isfinite(g).all() and np.isfinite(gt).all()
    a, b = np.median(g[np.isfinite(g)][-10:]), np.median(gt[-10:])
    assert overflow or a >= ACCUMULATE_FACTOR * b, (
        f"{case.id}: late gradient norm {a:.3g} not {ACCUMULATE_FACTOR:g}x the twin's {b:.3g}"
    )


def _input_scale(case, run, twin) -> None:
    ratio = _early(run, case.fault_layers) / _early(twin, case.fault_layers)
    off = (ratio >= SCALE_FACTOR) | (ratio <= 1 / SCALE_FACTOR)
    assert off.any(), f"{case.id}: input layer's gradients within {SCALE_FACTOR:g}x of the twin's: {ratio}"


def _loss_scale(case, run, twin) -> None:
    a, b = np.nanmedian(run.scalar("global_norm")[:10]), np.nanmedian(twin.scalar("global_norm")[:10])
    assert a >= SCALE_FACTOR * b, f"{case.id}: gradient norm {a:.3g} only {a / b:.3g}x the twin's"


def _saturated(case, run, twin) -> None:
    cols = _cols(case, run)
    a = np.nanmedian(run.metric("grad_norm")[:10, cols])
    b = np.nanmedian(twin.metric("grad_norm")[:10, cols])
    assert a <= SATURATED_FRACTION * b, (
        f"{case.id}: output gradient {a:.3g} is {a / b:.2f} of the twin's, not saturated"
    )


def _cleared(case, run, silent) -> None:
    seen = run.meta.get("grad_reset") or {}
    assert seen.get("cleared", 0) >= 0.5 * seen.get("steps", 1), f"{case.id}: the gradient was not cleared: {seen}"
    assert np.isnan(run.metric("update_norm")).all() or not np.nanmax(run.metric("update_norm")), (
        f"{case.id}: a weight moved"
    )


def _half(case, run, silent) -> None:
    dtypes = {info.dtype for info in run.layers if info.status == "trainable"}
    assert dtypes == {"float16"}, f"{case.id}: trainable weights are {dtypes}, not float16"


def _at_chance(case, run, silent) -> None:
    end = float(np.median(run.scalar("loss")[-10:]))
    assert end >= 0.95 * chance_loss(case), f"{case.id}: the loss left chance level ({end:.3g})"


def _eval_mode(case, run, silent) -> None:
    seen = run.meta.get("train_mode") or {}
    steps, on = seen.get("steps", 0), seen.get("model_eval", 0)
    assert steps and on >= 0.25 * steps, f"{case.id}: the model was not in eval mode while training: {seen}"
    for kind in ("norm", "dropout"):  # every such module off with it
        assert seen.get(f"{kind}_eval", 0) == (on if seen.get(kind) else 0), f"{case.id}: {kind} modules: {seen}"
    assert seen.get("most_norm_eval", 0) == seen.get("norm", 0), f"{case.id}: a normalisation module trained: {seen}"


_CHECKS = {
    "eval_mode": _eval_mode,
    "learns_nothing": _at_chance,
    "cleared_before_step": _cleared,
    "half_weights": _half,
    "no_gradient": _silent,
    "frozen": _frozen,
    "not_in_optimizer": _not_in_optimizer,
    "dead_units": _dead,
    "vanishing": _vanishing,
    "nonfinite": _nonfinite,
    "exploding": _exploding,
    "lr_too_high": _lr_too_high,
    "lr_too_low": _lr_too_low,
    "missing_zero_grad": _missing_zero_grad,
    "input_scale": _input_scale,
    "loss_scale": _loss_scale,
    "saturated_output": _saturated,
}
