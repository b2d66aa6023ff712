"""The background analysis, a part of the panel: the analysis (health table, diagnoses) of a copy
of the run, run on its own thread (``schedule.Worker``) so that training never waits for it.

It owns the thread, the run version last analysed, the Report of the newest state and the
analysis' health rows; what an analysis means for the page is the panel's (the ``analyse`` and
``finished`` callbacks it is made with: the panel's table, verdict and static copy)."""

from __future__ import annotations

from typing import Any, Callable

from ..run import Run
from . import payload as P
from .schedule import Worker
from .table import analyse

#: runs up to this many step x layer cells are analysed at once when shown; bigger ones show the
#: heatmap first and the health table when the analysis thread has it.
SYNC_ANALYSIS_CELLS = 200_000
#: seconds the end of a cell waits, at most, for the analysis of the final state (the static panel
#: is made from it: the same output whatever thread finishes first).
AFTER_CELL_WAIT = 120.0
#: seconds after a cell before its final analysis starts, where a front end draws the panel (the
#: cell's reply goes out first).
AFTER_CELL_DELAY = 0.3


def import_analysis() -> None:
    from .. import analysis, fallback  # noqa: F401  (imported on the analysis thread, off the user's cells)


def analysis_of(snap: Run, final: bool) -> tuple:
    """The analysis of a copy of the run: (the Report, or None where it failed; the health rows,
    one per layer; the top diagnoses; for a ``final`` one, the health table's HTML that goes with
    the static copy, else None)."""
    report, layer_rows, diagnoses = analyse(snap)
    html = None
    if final and report is not None:
        from ..fallback import health_table_html

        html = health_table_html(report, compact=True)
    return report, layer_rows, diagnoses, html


class Analysis:
    def __init__(self, analyse: Callable[[Run, bool], None], finished: Callable[[Run], None]) -> None:
        """``analyse(snap, final)``: analyse a copy of the run and show it (on the analysis thread,
        or at once for a small run); ``finished(snap)``: after the analysis of a ``final`` job (the
        burst of steps is over: the static copy follows)."""
        self._analyse, self._finished = analyse, finished
        self._worker = Worker(self._job, warm=import_analysis)
        #: the run version last analysed (-1: none)
        self.version = -1
        #: the analysis' health rows, one per layer (grouped when sent)
        self.layer_rows: list = []
        self._report: Any = None
        self._report_version = -1

    # ----------------------------------------------------------------- the thread
    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def due(self) -> bool:
        """The analysis may run again now (its share of the wall time allows it)."""
        return self._worker.due()

    def on_thread(self) -> bool:
        return self._worker.on_thread()

    def wait(self, timeout: float = 30.0) -> bool:
        """Wait until the analysis thread is idle (False: ``timeout`` seconds passed first)."""
        return self._worker.wait(timeout=timeout)

    def submit(self, run: Run, final: bool, force: bool = False, delay: float = 0.0) -> None:
        """Analyse a copy of ``run`` on the thread (``final``: the static copy follows)."""
        self._worker.submit((P.snapshot(run), final), force=force, delay=delay)

    def now_or_later(self, run: Run | None, fixed: bool) -> None:
        """The analysis of a run shown as a whole: at once when it is small, else from the thread
        after the heatmap's first paint. ``fixed``: the run never changes (no copy is made)."""
        if run is None or run.n_steps == 0:
            return
        snap = run if fixed else P.snapshot(run)
        if run.n_layers * run.n_steps <= SYNC_ANALYSIS_CELLS:
            self._analyse(snap, True)
        else:
            self._worker.submit((snap, True), force=True)

    def _job(self, job: tuple) -> None:
        snap, final = job
        self._analyse(snap, final)
        if final:
            self._finished(snap)

    def note(self, version: int, layer_rows: list | None = None) -> None:
        """An analysis of run version ``version`` was shown (with its health rows, one per layer)."""
        self.version = version
        if layer_rows is not None:
            self.layer_rows = layer_rows

    # ----------------------------------------------------------------- the Report
    def keep(self, report, version: int) -> None:
        """The Report of run version ``version`` (made by an analysis)."""
        self._report, self._report_version = report, version

    def report(self, run: Run):
        """The analysis of ``run`` (``gradwidget.analyze``), made again when the run has changed."""
        if self._report is None or self._report_version != run.version:
            from ..analysis import analyze

            self.keep(analyze(run), run.version)
        return self._report
