"""The work done off the training thread: the analysis (health table, diagnoses) of a copy of the
run, and the static image kept in saved notebooks. A mixin of GradientPanel, run by its analysis
thread (``schedule.Worker``)."""

from __future__ import annotations

import base64

from ..run import Run
from . import payload as P
from .base import PanelBase
from .noise import noise_values
from .static import heat_png
from .table import analyse, changed_rows, group_rows

#: runs up to this many step x layer cells are analysed at once when shown; bigger ones show the
#: heatmap first and the health table when the analysis thread has it.
SYNC_ANALYSIS_CELLS = 200_000
#: runs up to this many step x layer cells (analysed in a few milliseconds) are analysed before
#: the post-cell hook returns; bigger ones in the background.
POST_CELL_WAIT_CELLS = 5_000
#: seconds after a cell before its final analysis starts (its reply goes out first).
AFTER_CELL_DELAY = 0.3


def import_analysis() -> None:
    from .. import analysis, report  # noqa: F401  (imported on the analysis thread, off the user's cells)


class PanelBackground(PanelBase):
    def _analyse_now_or_later(self) -> None:
        """The health table of a run shown as a whole: at once when it is small, else from the
        analysis thread after the heatmap's first paint."""
        run = self.run
        if run is None or run.n_steps == 0:
            return
        if run.n_layers * run.n_steps <= SYNC_ANALYSIS_CELLS:
            self._analyse_snapshot(run if self._static_run is not None else P.snapshot(run))
        else:
            self._worker.submit((run if self._static_run is not None else P.snapshot(run), True), force=True)

    def _job(self, job: tuple) -> None:
        """The analysis thread's work: a copy of the run to analyse; ``final``: the cell (or the
        burst of steps) is over, so the static image of the final view is made too."""
        snap, final = job
        if snap.version != self._analysed_version:
            self._analyse_snapshot(snap, final)
        if final:
            with self._lock:
                self._refresh_static()

    def _analyse_snapshot(self, snap: Run, final: bool = True) -> None:
        """Analyse a copy of the run (on the analysis thread) and send the table and diagnoses;
        ``final``: also the table's HTML kept with the static image (not needed while training)."""
        report, layer_rows, diagnoses = analyse(snap)
        html = None
        if final and report is not None:
            from ..report import health_table_html

            html = health_table_html(report, suggestions=False)
        with self._lock:
            if snap.version < self._analysed_version:
                return
            run = self.run
            if report is not None and run is not None and run.version == snap.version:
                self._report, self._report_version = report, snap.version
            self._analysed_version = snap.version
            self._layer_rows = layer_rows
            rows = group_rows(layer_rows, self._rows_of(snap), snap)
            changed = changed_rows(self.table, rows)
            values: dict = {"diagnoses": diagnoses}
            if report is not None:
                values.update(noise_values(report))
            if html is not None:
                values["static_html"] = html
            if changed is not None and self.comm is not None:
                if changed:  # only the rows that changed travel; the page splices them in
                    self.send({"kind": "rows", "model_id": self.model_id, "rows": [[i, rows[i]] for i in changed]})
                self._hold({"table": rows})
            else:
                values["table"] = rows
            self._set(values)

    def _regroup_table(self) -> None:
        """The health table on the rows shown now (after a group was expanded or collapsed)."""
        run = self.run
        layer_rows = getattr(self, "_layer_rows", None)
        if run is not None and layer_rows:
            self._set({"table": group_rows(layer_rows, self._rows_of(run), run)})

    def _refresh_static(self) -> None:
        """``static_png``: the heatmap last sent, as an image (milliseconds; see ``static``)."""
        view = self._view
        if view is None or view[0] == self._static_version:
            return
        version, step, heat, flags, scale, col = view
        self.static_png = "data:image/png;base64," + base64.b64encode(heat_png(heat, flags, scale, col)).decode("ascii")
        self._static_version, self.static_step = version, step

    def _after_cell(self) -> None:
        """After a cell ran (IPython ``post_run_cell``): if it recorded steps, send the final view
        now (a millisecond or two); the analysis of the final state and its static image follow
        from the analysis thread."""
        run = self.run
        if run is None or (run.version == self._pushed_version and run.version == self._static_version):
            return
        self._throttle.cancel()
        self._push(force=True)
        # a quick analysis is waited for, so that a notebook executed headless (nbclient,
        # nbconvert --execute) saves the table and image of its final state; a slow one never
        # blocks, and starts once the cell's reply has gone out
        if run.n_steps * run.n_layers <= POST_CELL_WAIT_CELLS:
            self._worker.submit((P.snapshot(run), True), force=True)
            self._worker.wait(timeout=2.0)
        else:
            self._worker.submit((P.snapshot(run), True), force=True, delay=AFTER_CELL_DELAY)
