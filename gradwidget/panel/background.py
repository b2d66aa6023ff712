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
from .table import analyse, changed_rows, group_rows, verdict_line

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
    from . import rendition  # noqa: F401


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
        """The analysis thread's work: a copy of the run to analyse; ``final``: the burst of steps
        is over (training in a thread went idle), so the static panel of the final view is made too."""
        snap, final = job
        if snap.version != self._analysed_version or (final and self._static_table[0] != snap.version):
            self._analyse_snapshot(snap, final)
        if final:
            with self._lock:
                self._refresh_static()
                run = self.run
                due = self._outputs_due and run is not None and run.version == snap.version
                self._outputs_due = self._outputs_due and not due
            if due:
                self._update_outputs()

    def _analyse_snapshot(self, snap: Run, final: bool = True) -> None:
        """Analyse a copy of the run (on the analysis thread) and send the table and diagnoses;
        ``final``: also the table's HTML kept with the static image (not needed while training)."""
        report, layer_rows, diagnoses = analyse(snap)
        html = None
        if final and report is not None:
            from ..fallback import health_table_html

            html = health_table_html(report, compact=True)
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
            reading = report.task.reading if report is not None and report.loss.logged and report.task else ""
            verdict = verdict_line(diagnoses, snap.n_steps, reading) if report is not None else ""
            values: dict = {"diagnoses": diagnoses, "verdict": verdict}
            # the static panel's table (with the diagnoses: the analysis of this version); a live
            # analysis (not ``final``) makes none, and leaves the last one
            if final or report is None:
                self._static_table = (snap.version, html or "")
            if report is not None:
                values.update(noise_values(report))
            if changed is not None and self.comm is not None:
                if changed:  # only the rows that changed travel; the page splices them in
                    self.send({"kind": "rows", "model_id": self.model_id, "rows": [[i, rows[i]] for i in changed]})
                self._hold({"table": rows})
            else:
                values["table"] = rows
            # nothing chosen yet: the top diagnosis' first layer is what a user looks at first
            top = diagnoses[0]["layer_index"] if diagnoses else -1
            pick = top >= 0 and not self._layer_chosen and self._initial_layer is None and top != self.layer
            if pick:
                values["layer"] = top
            self._set(values)
            if pick:
                self._send_detail()

    def _regroup_table(self) -> None:
        """The health table on the rows shown now (after a group was expanded or collapsed)."""
        run = self.run
        layer_rows = getattr(self, "_layer_rows", None)
        if run is not None and layer_rows:
            self._set({"table": group_rows(layer_rows, self._rows_of(run), run)})

    def _refresh_static(self) -> None:
        """``static_png`` (the heatmap last sent, as an image) and ``static_html`` (the static panel:
        ``rendition.rendition_html``, that image with its names, axis and legend around it, the
        diagnoses and the health table of the same version); milliseconds. Made again only when
        the view or the analysis changed."""
        view = self._view
        if view is None:
            return
        version, step, heat, flags, scale, col, meta, col_steps = view
        # the analysis of this very state where the end of a cell waited for it (``_final_static``);
        # a run that a reader thread keeps extending (``from_run(live=True)``) gets the newest one
        table_version, table = self._static_table
        analysed = table_version >= 0
        key = (version, table_version, self.layer, self.metric)
        if key == getattr(self, "_static_key", None):
            return
        from .rendition import rendition_html

        png = heat_png(heat, flags, scale, col)
        diagnoses = list(self.diagnoses) if analysed else []
        arrays = {"heat": heat, "flags": flags, "col_steps": col_steps}
        html = rendition_html(meta, arrays, col, step, diagnoses, table if analysed else "")
        self._set({"static_png": "data:image/png;base64," + base64.b64encode(png).decode("ascii"), "static_html": html})
        self._static_version, self.static_step, self._static_key = version, step, key

    def _final_static(self, wait: float) -> None:
        """The static panel of the run as it is now, made from its analysis (waited for, at most
        ``wait`` seconds; it runs on the analysis thread): the same output whatever thread finishes first."""
        run = self.run
        if run is None or run.n_steps == 0 or self._worker.on_thread():  # the analysis thread has just made it
            return
        self._throttle.cancel()
        self._push(force=True)
        if self._static_table[0] != run.version:
            self._worker.submit((P.snapshot(run), True), force=True)
            self._worker.wait(timeout=wait)
        with self._lock:
            self._refresh_static()

    def _after_cell(self) -> None:
        """After a cell ran (IPython ``post_run_cell``), if it recorded steps: the outputs this panel
        was displayed in get the static panel of the run as it ended (``display._update_outputs``),
        so that the saved notebook holds it. Where no front end draws the panel (nbclient,
        ``nbconvert --execute``: the page never said ``rendered``), the final view is sent, the
        analysis of the final state waited for and the outputs updated here. Where a front end
        draws it, nothing is waited for: the final view goes out now, and the analysis thread,
        right after the cell's reply, makes the static panel (into the widget state, as the live
        panel's table) and then updates the outputs (once a cell, off the training thread)."""
        run = self.run
        if run is None or run.version == self._outputs_version:
            return
        if not self._views_seen:
            self._final_static(AFTER_CELL_WAIT)
            self._update_outputs()
            return
        self._throttle.cancel()
        self._push(force=True)
        self._outputs_version = run.version
        self._outputs_due = True
        self._worker.submit((P.snapshot(run), True), force=True, delay=AFTER_CELL_DELAY)
