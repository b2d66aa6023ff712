"""Writing a run directory: ``RunWriter`` appends steps while training (a full disk queues them,
loudly, instead of failing ``optimizer.step()``), ``save_run`` writes a whole Run at once."""

from __future__ import annotations

import os
import uuid
import warnings
from collections import deque
from datetime import datetime, timezone

import numpy as np

from .._warnings import GradwidgetWarning
from ..files import append_whole, create_new
from ..run import Run
from ._owner import hold, removed
from ._resume import ResumePoint
from .folders import check_log_dir, is_run_dir
from .layout import RECORD_FILES, hist_dtype, step_dtype
from .meta import meta_dict, write_json_atomic
from .records import hist_records, step_records


#: unwritten record bytes a live writer holds while the disk refuses writes (a full disk) before it
#: stops writing that run directory, explicitly
BACKLOG_MAX_BYTES = 64 << 20


class RunWriteWarning(GradwidgetWarning, RuntimeWarning):
    """Writing a run directory failed, resumed or stopped (shown once per event, never silent)."""


class _Replaced(Exception):
    """The writer's steps.bin is no longer in its folder: someone else's run is there now."""


class RunWriter:
    """Appends steps of a Run to a run directory as they are recorded.

    Records that cannot be written (a full disk, a folder made read-only) stay queued, in order, and
    are retried at every later step; a file never ends in half a record. ``live=True`` (a recorder
    writing from inside training hooks) turns a failure into one loud ``RunWriteWarning`` instead of
    an exception in the middle of ``optimizer.step()``, another when the queue is written after all,
    and stops writing, with a warning, once the queue passes ``BACKLOG_MAX_BYTES``; ``close`` warns
    about anything never written. Without ``live`` the OSError is raised (the queue is kept).
    """

    def __init__(
        self, path, run: Run, overwrite: bool = False, live: bool = False, resume: ResumePoint | None = None
    ) -> None:
        """``resume``: continue the run in ``path`` (``_resume.resume_point``; ``run`` holds its
        steps first): its files are appended to, after their last whole record, and its id kept."""
        # a resumer holds the folder already (``_resume``): its lock is no other writer's
        self.path = check_log_dir(path, overwrite if resume is None else True, handover=resume is not None)
        self.path.mkdir(parents=True, exist_ok=True)
        if resume is None and is_run_dir(self.path):  # our own earlier run (overwrite=True): replaced
            for name in RECORD_FILES:
                (self.path / name).unlink(missing_ok=True)  # a link is removed, never followed
        self.run, self.live = run, live
        #: a fresh id per writer: a reader following this folder sees a rerun as a different run
        self.run_id = uuid.uuid4().hex if resume is None else resume.run_id
        self.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._sdt, self._hdt = step_dtype(run.n_layers), hist_dtype(run.n_layers)
        self._fds: dict[str, int] = {}
        self._sizes = {"steps.bin": 0, "hist.bin": 0}
        self._last_step: int | None = None  # the newest step queued to be written
        self._noise_last: int | None = None  # the step of the last noise row queued (noise.bin)
        if resume is not None:  # its files, open and held since it was read (``_resume``)
            self.created = resume.created or self.created
            self._fds = resume.take_files()
            self._sizes.update({name: resume.sizes[name] for name in self._fds})
            if resume.run.n_steps:
                self._last_step = int(resume.run.steps[-1])
            if resume.run.noise is not None and len(resume.run.noise):
                self._noise_last = int(resume.run.noise.rows["step"][-1])
        self._queue: deque = deque()  # (file name, record bytes) not yet on disk, in order
        self._meta_due = True
        #: the error that is holding records back (None while everything is on disk)
        self.error: OSError | None = None
        self.stopped = False
        self._failed_at: int | None = None
        self._flush()

    @property
    def pending_steps(self) -> int:
        """Step records recorded but not (yet) on disk."""
        return sum(1 for name, _ in self._queue if name == "steps.bin")

    def write_meta(self) -> None:
        self._meta_due = True
        self._flush()

    def append_new(self) -> None:
        """Write the run's complete steps not written yet (and their histograms): the newest one,
        or also one whose ``optimizer.step()`` raised before it was finished (what is in memory is
        on disk)."""
        if self.stopped:
            return
        run = self.run  # on the thread that appends: no snapshot needed, only its complete steps
        n = run.n_steps - run._open
        steps = run.steps[:n]
        a = 0 if self._last_step is None else int(np.searchsorted(steps, self._last_step, side="right"))
        if a < n:
            self._queue.append(("steps.bin", step_records(run, a, n).tobytes()))
            hs = run.hist_steps
            ha = 0 if self._last_step is None else int(np.searchsorted(hs, self._last_step, side="right"))
            hb = int(np.searchsorted(hs, steps[-1], side="right"))
            if ha < hb:
                self._queue.append(("hist.bin", hist_records(run, ha, hb).tobytes()))
            self._last_step = int(steps[-1])
        self._queue_noise()  # its rows follow their step's record (run.noise grows after the step)
        self._flush()

    def _queue_noise(self) -> None:
        """Queue the run's noise rows (``run.noise``) not queued yet; noise.bin exists once one is."""
        ns = self.run.noise
        if ns is None or not len(ns):
            return
        rows = ns.window()
        if self._noise_last is not None:
            rows = rows[rows["step"] > self._noise_last]
        if len(rows):
            self._sizes.setdefault("noise.bin", 0)
            self._queue.append(("noise.bin", rows.tobytes()))
            self._noise_last = int(rows["step"][-1])

    def _write_due(self) -> None:
        """Write meta.json if due, then the queued records in order; raises OSError at the first
        that fails, leaving it and the ones after it queued."""
        if self._fds and removed(self._fds["steps.bin"]):
            raise _Replaced()
        if self._meta_due:
            write_json_atomic(self.path / "meta.json", meta_dict(self.run, self.run_id, self.created))
            self._meta_due = False
        for name in self._sizes:
            if name not in self._fds:
                self._fds[name] = create_new(self.path / name, append=True)
                if name == "steps.bin":
                    hold(self._fds[name])  # one writer per folder (``_owner``)
        while self._queue:
            name, data = self._queue[0]
            self._sizes[name] = append_whole(self._fds[name], data, self._sizes[name])
            self._queue.popleft()

    def _flush(self) -> None:
        if self.stopped:
            return
        try:
            self._write_due()
        except _Replaced:
            n = self.pending_steps
            self._stop()
            warnings.warn(
                f"gradwidget: stopped recording to {self.path}: its steps.bin was removed (another "
                f"writer replaced the run there), so nothing more is written to it ({n} steps were "
                "waiting). The run goes on in memory only (recorder.run); save it with "
                "recorder.run.save(another_folder)",
                RunWriteWarning,
                stacklevel=4,
            )
            return
        except OSError as e:
            self._failed(e)
            return
        if self.error is not None:
            if self.live:
                warnings.warn(
                    f"gradwidget: writing {self.path} works again: the steps from step "
                    f"{self._failed_at} on are now on disk",
                    RunWriteWarning,
                    stacklevel=4,
                )
            self.error = self._failed_at = None

    def _failed(self, e: OSError) -> None:
        if not self.live:
            raise e
        first = self.error is None
        self.error = e
        if first:
            self._failed_at = int(self.run.steps[-1]) if self.run.n_steps else None
            warnings.warn(
                f"gradwidget: cannot write {self.path} ({_oserror_text(e)}): training goes on and "
                "the steps are kept in memory and written once the folder accepts writes again",
                RunWriteWarning,
                stacklevel=5,
            )
        if sum(len(d) for _, d in self._queue) > BACKLOG_MAX_BYTES:
            n = self.pending_steps
            self._stop()
            warnings.warn(
                f"gradwidget: stopped recording to {self.path}: writes have failed from step "
                f"{self._failed_at} on ({_oserror_text(e)}) and {n} steps are waiting. The run goes on in "
                "memory only (recorder.run); save it with recorder.run.save(another_folder)",
                RunWriteWarning,
                stacklevel=5,
            )

    def _stop(self) -> None:
        self.stopped = True
        self._queue.clear()
        self._close_files()

    def _close_files(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

    def close(self) -> None:
        if self.stopped:
            return
        self._flush()
        if self._queue and self.live:
            warnings.warn(
                f"gradwidget: {self.pending_steps} steps, from step {self._failed_at} on, were "
                f"never written to {self.path} ({_oserror_text(self.error)}); the run in memory has "
                "them: save it with recorder.run.save(another_folder)",
                RunWriteWarning,
                stacklevel=3,
            )
        self._close_files()
        self.stopped = True


def _oserror_text(e: OSError | None) -> str:
    return (e.strerror or str(e)) if e is not None else ""


def save_run(run: Run, path, overwrite: bool = False) -> None:
    """Write a whole Run to a run directory. A rolling-window run also writes the steps that fell
    out of its window, as it holds them (decimated, without histograms), to ``history.bin``, so
    ``load_run`` gives back ``run.history`` too instead of silently keeping only the window."""
    run = run.snapshot()  # a consistent view while training appends (Run.snapshot)
    hists = hist_records(run)  # refused before anything is written
    w = RunWriter(path, run, overwrite=overwrite)
    try:
        w._queue.append(("steps.bin", step_records(run).tobytes()))
        w._queue.append(("hist.bin", hists.tobytes()))
        w._queue_noise()
        w._write_due()
        older = [r for r in (run.history, run._pending) if r is not None and r.n_steps]
        if older:
            fd = create_new(w.path / "history.bin", append=True)
            try:
                size = 0
                for r in older:
                    size = append_whole(fd, step_records(r).tobytes(), size)
            finally:
                os.close(fd)
    finally:
        w._close_files()
