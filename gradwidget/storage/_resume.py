"""Continuing a run folder after a crash (``Recorder(..., resume=True)``): the run already there,
checked against the model that continues it, and its files, held from then on.

The folder's writer lock (``_owner.claim``) is taken before the run is read, and every record file
(steps, histograms, noise rows) is cut back to the whole records read while the lock is held: a
record a crash left half-written goes, and nothing another writer wrote can be cut by a size noted
earlier, since no one else can write between the read and this resumer's own appends. The open
files pass to the writer (``take_files``); a resumer that never writes gives them back
(``release``, or when it is garbage collected)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..files import open_to_append
from ..run import Run
from ._owner import claim
from .folders import check_log_dir, is_run_dir
from .layout import FORMAT_VERSION, as_path, file_size
from .meta import parse_meta
from .reader import RunReader


@dataclass(eq=False)
class ResumePoint:
    """The run in a folder to continue: its steps (``run``), its id and creation time (kept, so a
    reader following the folder goes on with it), and its record files, open to append after their
    last whole record, the writer lock held on ``steps.bin`` (``sizes``: their bytes)."""

    run: Run
    run_id: str | None
    created: str | None
    sizes: dict[str, int]
    _fds: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def next_step(self) -> int:
        return int(self.run.steps[-1]) + 1 if self.run.n_steps else 0

    def take_files(self) -> dict[str, int]:
        """The open record files (name: descriptor), for the writer that appends to them from now
        on (it closes them, and with ``steps.bin`` releases the folder)."""
        fds, self._fds = self._fds, {}
        return fds

    def release(self) -> None:
        """Give the folder back without writing (a resumer detached before its first step)."""
        for fd in self.take_files().values():
            try:
                os.close(fd)
            except OSError:
                pass

    def __getstate__(self) -> dict:
        """A copy (deepcopy, pickle) holds no files: they are the original's to write and close."""
        return {**self.__dict__, "_fds": {}}

    def __del__(self) -> None:
        self.release()


def check_resume(resume) -> int | None:
    """The ``resume`` argument: False or True (continue after the run's last step: None), or the
    step of the checkpoint training goes on from (its number)."""
    if isinstance(resume, bool):
        return None
    if isinstance(resume, (int, np.integer)) and resume >= 0:
        return int(resume)
    raise TypeError(
        f"resume must be True, False or the step number of the checkpoint training goes on from "
        f"(a whole number >= 0), got {resume!r:.60}"
    )


def resume_point(path, shapes: dict[str, tuple], after: int | None = None) -> ResumePoint | None:
    """The run in ``path`` to continue with a model whose recorded parameters have ``shapes``
    (name: shape), or None for a new or empty folder (a run starts there). ``after``: training
    continues from a checkpoint of that step, so the run's steps after it (trained again) are
    dropped, from its files too. Refused, saying why: a folder of other files, a run a live writer
    (or another resumer) holds, a run of different layers. The folder is held from here on (see
    the module docstring)."""
    path = as_path(path, "log_dir must be a folder path")
    if not is_run_dir(path):
        check_log_dir(path, False, overwrite_hint="pass overwrite=True instead of resume=True")
        return None
    check_log_dir(path, True)  # writable, not being written
    fds = {"steps.bin": claim(path / "steps.bin")}
    try:
        reader = RunReader(path)
        run = reader.run
        _check_format(path, reader.format_version)
        _check_layers(path, run, shapes)
        meta = parse_meta(path / "meta.json")
        sizes = {"steps.bin": reader._soff, "hist.bin": reader._hoff, "noise.bin": reader._noff}
        if after is not None:  # the steps after ``after`` are being trained again: theirs go
            run, sizes = _cut_after(run, after, reader)
        for name, size in sizes.items():
            if name not in fds and (size or file_size(path / name)):
                fds[name] = open_to_append(path / name)
        for name, fd in fds.items():
            os.ftruncate(fd, sizes[name])  # under the lock: only what a crash left half-written
    except BaseException:
        for fd in fds.values():
            os.close(fd)
        raise
    return ResumePoint(run, meta.get("run_id"), meta.get("created"), sizes, fds)


def _cut_after(run: Run, after: int, reader: RunReader) -> tuple[Run, dict[str, int]]:
    """The run's steps up to ``after`` and the bytes of their records in each file."""
    k = int(np.searchsorted(run.steps, after, side="right"))
    kept = run._slice_rows(0, k)
    kept.history, kept.meta = run.history, run.meta
    n_noise = 0 if kept.noise is None else len(kept.noise)
    sizes = {
        "steps.bin": k * reader._sdt.itemsize,
        "hist.bin": int(np.searchsorted(run.hist_steps, after, side="right")) * reader._hdt.itemsize,
        "noise.bin": n_noise * reader._ndt.itemsize,
    }
    return kept, sizes


def _check_format(path, version: int) -> None:
    """A run in an older format is not continued: its files would mix two record layouts."""
    if version == FORMAT_VERSION:
        return
    copy = f"{path}-v{FORMAT_VERSION}"
    raise ValueError(
        f"cannot resume {path}: its records are in run format {version} (an older gradwidget's: float32 NaN/Inf "
        f"counts, 32-bit histogram counts) and this gradwidget appends format {FORMAT_VERSION} records only. "
        f"Copy the run into the current format and resume the copy: gradwidget.load_run({str(path)!r}).save({copy!r}), "
        f"then Recorder(..., log_dir={copy!r}, resume=True); or record into a new log_dir"
    )


def _check_layers(path, run: Run, shapes: dict[str, tuple]) -> None:
    theirs = {info.name: tuple(info.shape) for info in run.layers}
    if theirs == shapes:
        return
    missing = [n for n in theirs if n not in shapes]
    new = [n for n in shapes if n not in theirs]
    changed = [f"{n} {theirs[n]} -> {shapes[n]}" for n in theirs if n in shapes and theirs[n] != shapes[n]]
    parts = [
        f"{what}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''} ({len(names)})"
        for what, names in (("not in this model", missing), ("new in this model", new), ("reshaped", changed))
        if names
    ]
    raise ValueError(
        f"cannot resume {path}: it holds a run of other layers ({'; '.join(parts)}). Resume with the "
        "model that made it, or record into a new log_dir"
    )
