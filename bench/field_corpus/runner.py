"""Running a field case, with its Run cached on disk like the zoo's (``bench/.zoo-cache``)."""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

from .case import FieldCase, Health

#: bump whenever a case's model, data or loop changes: cached runs are then stale
FIELD_VERSION = 1


def run_case(case: FieldCase):
    """Train ``case`` with one torch thread; its Run, with ``field_case``, ``field_health`` (the
    Health's fields) and ``field_cpu_seconds`` in ``run.meta``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t = time.process_time()
    try:
        run, health = case.train()
    finally:
        torch.set_num_threads(threads)
    run.meta.update(
        field_case=case.id,
        field_version=FIELD_VERSION,
        field_health=health.as_meta(),
        field_cpu_seconds=round(time.process_time() - t, 2),
    )
    return run


def health_of(run) -> Health:
    """The Health a field run was recorded with."""
    return Health(**run.meta["field_health"])


def cache_path(case: FieldCase, cache_dir) -> Path:
    import torch

    return Path(cache_dir) / f"field-v{FIELD_VERSION}-torch{torch.__version__}" / case.id


def load_or_run(case: FieldCase, cache_dir):
    """The case's Run from ``cache_dir`` when this FIELD_VERSION saved it, else train and save it."""
    from gradwidget import load_run
    from gradwidget.storage import RunFormatError

    path = cache_path(case, cache_dir)
    if (path / "meta.json").is_file():
        try:
            return load_run(path)
        except RunFormatError as e:
            warnings.warn(f"field cache entry {path} unreadable ({e}); training {case.id} again")
    run = run_case(case)
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    run.save(tmp)
    tmp.rename(path)
    return run
