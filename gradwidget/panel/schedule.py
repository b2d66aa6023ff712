"""When the panel works: the update throttle, the off-thread analysis, directory polling, and the
hook that runs after each notebook cell. Timing only; what is computed lives in payload/table."""

from __future__ import annotations

import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .._warnings import GradwidgetWarning


#: the most of the training thread's time the panel's updates may take (the product's budget is
#: 1.05x a step; bench/live.py reads GradientPanel.training_thread_s: 3-4% at 4 updates a second)
TRAINING_SHARE = 0.05


class Throttle:
    """At most one update per ``interval()``: at most ``max_rate`` a second, and never more than
    ``TRAINING_SHARE`` of the sender's time spent building updates (long runs cost more per
    update). A burst ends with a trailing update from a timer thread."""

    def __init__(self, max_rate: float, push: Callable[[], object], trailing: Callable[[], object]) -> None:
        self.min_interval = 1.0 / float(max_rate)
        self.last = 0.0
        self.cost = 0.0  # seconds the last update took to build and send
        self._push, self._trailing = push, trailing
        self._timer: threading.Timer | None = None

    def interval(self) -> float:
        return max(self.min_interval, self.cost / TRAINING_SHARE)

    def sent(self, started: float) -> None:
        self.last = time.monotonic()
        self.cost = self.last - started

    def ping(self) -> None:
        now = time.monotonic()
        interval = self.interval()
        if now - self.last >= interval:
            self.cancel()
            self._push()
        elif self._timer is None:
            self._timer = threading.Timer(interval - (now - self.last) + 0.05, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        self._timer = None
        self._trailing()

    def cancel(self) -> None:
        tm, self._timer = self._timer, None
        if tm is not None:
            tm.cancel()


class Worker:
    """Runs ``work(job)`` on one daemon thread, one job at a time, the newest job replacing a
    waiting one; after a job that took ``c`` seconds the next starts no sooner than
    ``max(min_gap, c / share)`` later, so the work takes at most ``share`` of the wall time
    (``due()`` tells the submitter; ``submit(force=True)`` ignores it, starting after ``delay``).
    ``min_gap`` 5 s: each analysis holds the GIL for part of its run, which delays a training step
    (bench/live.py: the panel/Recorder cell ratio went from 1.05 to 1.03-1.04 by median going from 2 s)."""

    def __init__(
        self,
        work: Callable[[Any], None],
        share: float = 0.02,
        min_gap: float = 5.0,
        name: str = "gradwidget-analysis",
        warm: Callable[[], None] | None = None,
    ) -> None:
        self._work, self.share, self.min_gap, self._name, self._warm = work, share, min_gap, name, warm
        self._cv = threading.Condition()
        self._job: Any = None
        self._has_job = False
        self._forced = False  # the waiting job ignores the pacing
        self._forced_at = 0.0  # ... and starts at this time (after the cell's reply has gone out)
        self._busy = False
        self._stopped = False
        self._next = 0.0
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.last_cost = 0.0

    def due(self) -> bool:
        return not self._busy and not self._has_job and time.monotonic() >= self._next

    def submit(self, job: Any, force: bool = False, delay: float = 0.0) -> None:
        with self._cv:
            if self._stopped:
                return
            self._job, self._has_job = job, True
            if force:
                self._forced_at = (
                    time.monotonic() + delay if not self._forced else min(self._forced_at, time.monotonic() + delay)
                )
            self._forced = self._forced or force
            self._start()
            self._cv.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()

    def start(self) -> None:
        """Start the thread now (it runs ``warm()`` first: imports, so that the first job is quick)."""
        with self._cv:
            self._start()

    def _loop(self) -> None:
        if self._warm is not None:
            try:
                self._warm()
            except Exception as e:
                warnings.warn(f"gradwidget: {self._name} could not start: {e!r}", GradwidgetWarning)
        while True:
            with self._cv:
                while not self._stopped and not (self._has_job and time.monotonic() >= self._ready_at()):
                    self._cv.wait(None if not self._has_job else max(0.0, self._ready_at() - time.monotonic()))
                if self._stopped:
                    return
                job, self._job, self._has_job, self._forced, self._busy = self._job, None, False, False, True
            t0 = time.monotonic()
            try:
                self._work(job)
            except Exception as e:  # never let the thread die: the next job may succeed
                warnings.warn(f"gradwidget: {self._name} failed: {e!r}", GradwidgetWarning)
            finally:
                cost = time.monotonic() - t0
                with self._cv:
                    self._busy = False
                    self.runs += 1
                    self.last_cost = cost
                    self._next = time.monotonic() + max(self.min_gap, cost / self.share - cost)
                    self._cv.notify_all()

    def on_thread(self) -> bool:
        """Whether the caller is this worker's thread (which must never wait for its own jobs)."""
        return threading.current_thread() is self._thread

    def _ready_at(self) -> float:
        return self._forced_at if self._forced else self._next

    def wait(self, timeout: float = 30.0) -> bool:
        """Wait until no job is waiting or running (forced jobs only; tests and ``flush``)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._busy or (self._has_job and self._forced):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()


def poll_directory(
    reader, every: float, stop: threading.Event, changed: Callable[[], None], done: Callable[[], None]
) -> threading.Thread:
    """Poll a ``RunReader`` every ``every`` seconds on a daemon thread until ``stop`` is set."""

    def loop():
        while not stop.wait(every):
            try:
                if reader.poll():
                    changed()
            except Exception as e:  # a half-written file: report it and keep following
                warnings.warn(f"gradwidget: reading {reader.path} failed: {e!r}", GradwidgetWarning)
        done()

    th = threading.Thread(target=loop, name="gradwidget-poll", daemon=True)
    th.start()
    return th


# ------------------------------------------------------------------ after each notebook cell
_WATCHED: weakref.WeakSet[Any] = weakref.WeakSet()
_HOOKED: list = []  # the IPython shell whose post_run_cell runs _after_cell_hook


def _after_cell_hook(result=None) -> None:
    for panel in list(_WATCHED):
        try:
            panel._after_cell()
        except Exception as e:  # never break the user's cell
            warnings.warn(f"gradwidget: updating the panel after the cell failed: {e!r}", GradwidgetWarning)


#: the panels each notebook cell made (by the cell's id), weakly: running the cell again replaces them
_BY_CELL: dict[str, weakref.WeakSet[Any]] = {}


def _before_cell_hook(info=None) -> None:
    """A cell is about to run again: the panels its last run made are replaced (``_replaced``: their
    hooks removed, their widgets closed), so a re-run cell keeps no model, optimizer or widget alive."""
    cell = getattr(info, "cell_id", None)
    for panel in list(_BY_CELL.pop(cell, ())) if cell else ():
        try:
            panel._replaced()
        except Exception as e:  # never break the user's cell
            warnings.warn(f"gradwidget: closing the panel the cell made before failed: {e!r}", GradwidgetWarning)


def _shell():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _hook(ip) -> None:
    if ip is None or any(sh is ip for sh in _HOOKED):
        return
    ip.events.register("pre_run_cell", _before_cell_hook)
    ip.events.register("post_run_cell", _after_cell_hook)
    _HOOKED.append(ip)


def own_cell(panel) -> None:
    """Remember the cell running now as the one that made ``panel`` (IPython passes the id the front
    end gives a cell: JupyterLab, Notebook 7, VS Code, nbclient); when it runs again the panel is replaced."""
    ip = _shell()
    _hook(ip)
    info = getattr(getattr(getattr(ip, "displayhook", None), "exec_result", None), "info", None)
    cell = getattr(info, "cell_id", None)
    if cell:
        _BY_CELL.setdefault(cell, weakref.WeakSet()).add(panel)


def watch_cells(panel) -> None:
    """Call ``panel._after_cell()`` after every IPython cell (weakly referenced; one hook for all)."""
    _WATCHED.add(panel)
    _hook(_shell())


def unwatch_cells(panel) -> None:
    _WATCHED.discard(panel)
    for panels in _BY_CELL.values():
        panels.discard(panel)
