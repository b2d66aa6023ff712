"""Running cases (and their twins: the same recipe without the mistake), with a cache of their Runs on disk."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

from .cache import DEFAULT_CACHE, ZOO_VERSION, cache_root
from .case import Case
from .cases import RECIPES
from .checks import TWIN_CAUSES, check_case
from .train import train


def run_case(case: Case, cache_dir=DEFAULT_CACHE, *, twin: bool = False):
    """Train ``case`` from scratch and return its ``gradwidget.Run`` (case id in ``run.meta``).
    ``twin``: the same recipe without its mistakes (the counterfactual a label is checked against).
    ``cache_dir`` holds the pretrained states that fine-tuning cases start from."""
    if not isinstance(case, Case):
        raise TypeError(f"run_case needs a zoo Case, got {type(case).__name__}")
    try:
        recipe = RECIPES[case.id]
    except KeyError:
        raise KeyError(f"no zoo recipe for case {case.id!r}; cases come from zoo.CASES and zoo.HELDOUT") from None
    t = time.perf_counter()
    run = train(
        case.arch,
        case.optimizer,
        case.seed,
        case.steps,
        variant=dict(recipe.variant),
        task=recipe.task,
        pretrain=recipe.pretrain,
        styles=recipe.styles,
        mistakes=() if twin else recipe.mistakes,
        cache_dir=cache_dir,
    )
    run.meta.update(
        zoo_case=case.id + ("~twin" if twin else ""),
        zoo_version=ZOO_VERSION,
        zoo_steps=case.steps,
        zoo_train_seconds=round(time.perf_counter() - t, 3),
    )
    return run


def cache_path(case: Case, cache_dir=DEFAULT_CACHE, *, twin: bool = False) -> Path:
    """Where the case's run (or its twin's) is cached (see cache.cache_root)."""
    return cache_root(cache_dir) / ("twins" if twin else "runs") / f"{case.id}-{case.steps}"


def load_or_run(case: Case, cache_dir=DEFAULT_CACHE, *, refresh: bool = False, twin: bool = False):
    """The case's Run (or its ``twin``'s) from ``cache_dir`` when it was saved by this ZOO_VERSION,
    else train it and save it there. ``refresh`` retrains and overwrites."""
    from gradwidget import load_run
    from gradwidget.storage import RunFormatError

    path = cache_path(case, cache_dir, twin=twin)
    if not refresh and (path / "meta.json").is_file():
        try:
            return load_run(path)
        except RunFormatError as e:  # an entry from an older run format: train again
            warnings.warn(f"zoo cache entry {path} unreadable ({e}); training {case.id} again")
    run = run_case(case, cache_dir, twin=twin)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    run.save(tmp)
    tmp.rename(path)  # whole entries only: a killed run leaves no cache entry that looks complete
    return run


def check(case: Case, run, cache_dir=DEFAULT_CACHE) -> None:
    """``checks.check_case`` on the case's run, with its twin (cached like the runs) when its cause
    is checked against one."""
    twin = load_or_run(case, cache_dir, twin=True) if case.cause in TWIN_CAUSES else None
    check_case(case, run, twin)
