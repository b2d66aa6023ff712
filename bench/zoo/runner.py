"""Running cases, with a cache of their Runs on disk, and the self-check of a case's labels."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np

from .case import Case
from .cases import RECIPES
from .train import train

#: bump whenever a case, a model, a task or the training loop changes: cached runs are then stale
ZOO_VERSION = 6

DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".zoo-cache"

#: a healthy run's loss must end below this fraction of where it started (means of 10 steps)
HEALTHY_LOSS_RATIO = 0.8
#: a vanishing case's fault weights have, over the first VANISH_STEPS steps, a median gradient norm
#: below VANISH_RATIO of the largest weight's (how the labels were measured)
VANISH_STEPS, VANISH_RATIO = 10, 0.01


def run_case(case: Case):
    """Train ``case`` from scratch and return its ``gradwidget.Run`` (case id in ``run.meta``)."""
    if not isinstance(case, Case):
        raise TypeError(f"run_case needs a zoo Case, got {type(case).__name__}")
    try:
        recipe = RECIPES[case.id]
    except KeyError:
        raise KeyError(f"no zoo recipe for case {case.id!r}; cases come from zoo.CASES and zoo.HELDOUT") from None
    t = time.perf_counter()
    run = train(
        case.arch, case.optimizer, case.seed, case.steps, variant=dict(recipe.variant), mistakes=recipe.mistakes
    )
    run.meta.update(
        zoo_case=case.id,
        zoo_version=ZOO_VERSION,
        zoo_steps=case.steps,
        zoo_train_seconds=round(time.perf_counter() - t, 3),
    )
    return run


def cache_path(case: Case, cache_dir=DEFAULT_CACHE) -> Path:
    """Where the case's run is cached: per ZOO_VERSION and per torch and transformers release (their
    models' parameter names and numbers change between releases)."""
    import torch
    import transformers

    tag = f"v{ZOO_VERSION}-torch{torch.__version__}-transformers{transformers.__version__}"
    return Path(cache_dir) / tag / f"{case.id}-{case.steps}"


def load_or_run(case: Case, cache_dir=DEFAULT_CACHE, *, refresh: bool = False):
    """The case's Run from ``cache_dir`` when it was saved by this ZOO_VERSION, else train it and
    save it there. ``refresh`` retrains and overwrites."""
    from gradwidget import load_run
    from gradwidget.storage import RunFormatError

    path = cache_path(case, cache_dir)
    if not refresh and (path / "meta.json").is_file():
        try:
            return load_run(path)
        except RunFormatError as e:  # an entry from an older run format: train again
            warnings.warn(f"zoo cache entry {path} unreadable ({e}); training {case.id} again")
    run = run_case(case)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    run.save(tmp)
    tmp.rename(path)  # whole entries only: a killed run leaves no cache entry that looks complete
    return run


def loss_ratio(run) -> float:
    """Mean loss of the last 10 recorded steps over that of the first 10 (NaN when not finite)."""
    loss = np.asarray(run.scalar("loss"), dtype=np.float64)
    return float(np.mean(loss[-10:]) / np.mean(loss[:10])) if len(loss) >= 20 else float("nan")


def check_case(case: Case, run) -> None:
    """Assert the case's labels hold on its Run: every fault layer exists, every layer that never got
    a gradient is labelled, a healthy loss fell, and the labels that are facts of the recording show
    there (no gradient, frozen, left out of the optimizer, dead, vanishing, non-finite)."""
    names = set(run.layer_names)
    missing = [n for n in case.fault_layers if n not in names]
    assert not missing, f"{case.id}: fault_layers not in run.layer_names: {missing}"
    assert run.n_steps == case.steps, f"{case.id}: {run.n_steps} steps recorded, {case.steps} trained"
    g = run.metric("grad_norm")
    silent = [n for n, total in zip(run.layer_names, np.nansum(np.abs(g), axis=0)) if total == 0]
    unlabelled = [n for n in silent if n not in case.fault_layers]
    assert not unlabelled, f"{case.id}: layers that never got a gradient are not in fault_layers: {unlabelled}"
    if case.healthy:
        r = loss_ratio(run)
        assert r < HEALTHY_LOSS_RATIO, f"{case.id}: healthy loss did not fall (last/first = {r:.2f})"
        assert np.isfinite(run.metric("grad_norm")).all(), f"{case.id}: healthy run has non-finite gradients"
        return
    cols = [run.layer_index(n) for n in case.fault_layers]
    got_grad = [n for n in case.fault_layers if n not in silent]
    if case.cause in ("no_gradient", "frozen"):
        assert not got_grad, f"{case.id}: labelled as getting no gradient but got one: {got_grad}"
    if case.cause == "frozen":
        assert all(run.layers[c].status == "frozen" for c in cols), f"{case.id}: fault layers not frozen"
    if case.cause == "not_in_optimizer":
        assert got_grad == list(case.fault_layers), f"{case.id}: a layer left out got no gradient"
        moved = np.nan_to_num(run.metric("update_norm")[:, cols]).max()
        assert moved == 0, f"{case.id}: a layer left out of the optimizer moved ({moved:.3g})"
    if case.cause == "dead_units":
        zeros = np.nanmean(run.metric("zero_frac")[1:, cols])
        assert zeros > 0.99, f"{case.id}: dead layers' gradients are only {zeros:.0%} zeros"
    if case.cause == "vanishing":
        early = np.nanmedian(g[:VANISH_STEPS], axis=0)
        top = max(early[i] for i, n in enumerate(run.layer_names) if n.endswith("weight"))
        loud = [n for n, c in zip(case.fault_layers, cols) if n.endswith("weight") and early[c] >= VANISH_RATIO * top]
        assert not loud, f"{case.id}: labelled vanishing but not below {VANISH_RATIO} of the largest: {loud}"
    if case.cause == "nonfinite":
        bad = (run.metric("nonfinite").sum(axis=1) > 0) | ~np.isfinite(run.scalar("loss"))
        assert bad.any(), f"{case.id}: no non-finite value was recorded"
