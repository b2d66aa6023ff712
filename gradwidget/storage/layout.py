"""What a run directory is made of: its format marker, the record dtypes, its file names, and
safe access to its files (every failure a RunFormatError, never a hang on a FIFO)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..files import NotPlainFile, open_plain
from ..run import METRICS, N_BINS, SCALARS


FORMAT = "gradwidget-run"
#: the format a writer writes. Format 1 (read, never written) kept every metric, the non-finite
#: count included, as float32 (exact only up to 2**24) and histogram counts as uint32
FORMAT_VERSION = 2
#: the formats a reader reads (a meta.json without "version" is format 1)
READ_VERSIONS = (1, 2)


class RunFormatError(ValueError):
    """A run directory that is missing, unreadable or not a gradwidget run."""


def step_dtype(n_layers: int, version: int = FORMAT_VERSION) -> np.dtype:
    """A step record: the step number, the scalars as float64, each metric as float32 per layer,
    except the non-finite count, float64 from format 2 on (every count exact up to 2**53; NaN:
    the layer had no gradient that step)."""
    exact = "<f8" if version >= 2 else "<f4"
    fields: list[tuple] = [("step", "<i8")] + [(s, "<f8") for s in SCALARS]
    fields += [(m, exact if m == "nonfinite" else "<f4", (n_layers,)) for m in METRICS]
    return np.dtype(fields)


def hist_dtype(n_layers: int, version: int = FORMAT_VERSION) -> np.dtype:
    """A histogram record: the step number and each layer's ``N_BINS`` counts, uint64 from format 2
    on (uint32 in format 1)."""
    return np.dtype([("step", "<i8"), ("counts", "<u8" if version >= 2 else "<u4", (n_layers, N_BINS))])


#: the files a run directory is made of: no export or report is written over one of them, and a
#: writer never starts in a folder that holds one of them without being that folder's run
RUN_FILES = ("meta.json", "meta.json.tmp", "steps.bin", "hist.bin", "history.bin", "noise.bin")
#: the files a writer replaces when it starts a new run (``overwrite=True``) in its own run folder
RECORD_FILES = ("steps.bin", "hist.bin", "history.bin", "noise.bin", "meta.json.tmp")


def as_path(path, what: str = "expected a run directory path") -> Path:
    """``path`` as a Path, or a TypeError naming what was expected (``load_run(None)`` is refused
    here, not deep inside pathlib)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what} (str or pathlib.Path), not {type(path).__name__} {path!r:.60}")
    return Path(path)


def open_regular(p: Path):
    """``files.open_plain`` for a run file, its failures as RunFormatError."""
    try:
        return open_plain(p)
    except NotPlainFile:
        raise RunFormatError(
            f"{p} is not a plain file (a FIFO, device or socket): a run keeps {p.name} in a plain file"
        ) from None
    except OSError as e:
        raise RunFormatError(f"{p} cannot be read: {e.strerror or e}") from None


def file_size(p: Path) -> int:
    """Size of one of the run's binary files (0 while it does not exist yet)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise RunFormatError(f"{p} cannot be read: {e}") from None
    if not p.is_file():
        raise RunFormatError(f"{p} is not a file: a run keeps its records in a plain file {p.name}")
    return st.st_size
