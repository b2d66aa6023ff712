"""A run directory written by another process, as a training script writes it while a notebook reads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable


def has_meta(folder: Path) -> bool:
    return (folder / "meta.json").exists()


def start_writer(
    script: str, folder: Path, *args, ready: Callable[[Path], bool] = has_meta, timeout: float = 60.0
) -> subprocess.Popen:
    """Run ``python -c script folder *args`` (this test's gradwidget importable) and return it once
    ``ready(folder)``; a writer that dies or stalls first fails the test with what it said."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", script, str(folder), *map(str, args)], env=env)
    deadline = time.monotonic() + timeout
    while not ready(folder):
        if proc.poll() is not None and not ready(folder):
            raise AssertionError(f"the writer exited with {proc.returncode} before {folder} was ready")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the writer never made {folder} ready in {timeout:.0f} s")
        time.sleep(0.005)
    return proc
