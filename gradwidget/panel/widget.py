"""GradientPanel: the live, scrubbable gradient-flow panel for notebooks (an anywidget).

    panel = GradientPanel(model, optimizer)   # hooks the model; show it, then train as usual
    panel = GradientPanel(run)                 # a Run (or a Recorder) you already have
    panel = GradientPanel.from_run(path, live=True)   # a run directory, followed as it grows

Each trait is declared once, in ``protocol.TRAITS`` (the page's side: ``js/src/protocol.ts``), and
made here by ``_traits.Synced``. The panel is composed of parts that own their state: the source
(``source.Source``: the recorder, held weakly, the Run or the run directory), the live sync
(``sync.LiveSync``: throttled full updates and patches), the selection (``selection.Selection``: the
order of the page's choices, the layer shown first), the static rendition
(``rendition.StaticRendition``: the static copy for exports and saved notebooks), the background
analysis (``background.Analysis``: its thread and the Report) and the notebook outputs
(``display.Outputs``); a comparison (``ComparisonPanel``) adds the comparison
(``compare_widget.Comparing``). The panel sets the traits and hands each part what it asks for.

What runs where
---------------
On the training thread, after a recorded step, at most ``max_rate`` times a second: the heatmap
arrays (``payload.heat_view``, bounded by the page's width) and, when the analysis is due, a copy
of the run (``payload.snapshot``). The analysis for the health table and the diagnoses runs on its
own thread over that copy (``schedule.Worker``), at most 2% of the wall time and no more often than
every 5 s while training (its GIL time stalled a training step once per 2 s before). After a cell that
trained, the final view and a static image made from the heatmap arrays (``static.heat_png``,
milliseconds) are sent, and the analysis of the final state is started in the background: nothing
heavy runs after the cell.

Training in the panel's own cell, or in a thread
-------------------------------------------------
Updates from the kernel reach the browser while a cell runs, but messages from the browser
(a scrubbed step, a selected layer, a metric) are handled by the kernel only between cells: while
a training loop runs in the cell, they wait in the kernel's queue. The front end therefore applies
the user's choice to its own view at once and keeps it until the kernel has caught up. To keep
two-way sync live during training, run the loop in a background thread and leave the cell::

    import threading
    threading.Thread(target=train, daemon=True).start()   # train() as usual; the cell returns
"""

from __future__ import annotations

import base64
import pathlib
import threading
import time
import warnings

import anywidget
import numpy as np
import traitlets as t

from .._warnings import GradwidgetWarning
from ..outputs import to_ascii
from ..run import Run
from . import payload as P
from ._traits import Synced
from .background import AFTER_CELL_DELAY, AFTER_CELL_WAIT, Analysis, analysis_of
from .compare_widget import Comparing
from .display import Outputs
from .noise import noise_values
from .options import check_layer_option, check_options, source_layer_names
from .protocol import TRAITS
from .rendition import StaticRendition, rendition_html
from .rows import Rows, row_layout
from .schedule import own_cell, unwatch_cells, watch_cells
from .selection import Selection, collapsed, expanded_with, need_run
from .source import Source
from .sync import LiveSync
from .table import changed_rows, group_rows, verdict_line

_BUNDLE = pathlib.Path(__file__).parent.parent / "static" / "widget.js"
BUNDLE_MISSING = (
    f"gradwidget's front end is not built ({_BUNDLE} is missing): run `pip install .` "
    "(or `pip install -e .`) in the gradwidget source tree to build it (needs Node.js/npm)."
)

_MISSING_ESM = (
    """
function render({ el }) {
  const d = document.createElement("div");
  d.style.cssText = "padding:8px 12px;border-left:4px solid #c62828;font-family:sans-serif";
  d.textContent = %r;
  el.append(d);
}
export default { render };
"""
    % BUNDLE_MISSING
)


class GradientPanel(anywidget.AnyWidget):
    """A live panel of how gradients flow through a network: the top diagnoses, a scrubbable
    layers x steps heatmap, per-layer bars at the scrubbed step, the layer health table, the
    selected layer's histogram and metric over time.

    Parameters
    ----------
    source: an ``nn.Module`` (a Recorder is attached to it, with ``optimizer``), a ``Recorder``,
        a ``Run``, or a run directory (``str``/``Path``, same as ``GradientPanel.from_run``).
    optimizer: the model's optimizer (a step is then one ``optimizer.step()``).
    metric: metric shown first (one of ``gradwidget.METRICS``; default mean |g|).
    layer: layer selected first (name or column index); default: the top diagnosis' first layer
        once the analysis has one, the most flagged layer before.
    max_rate: most updates sent to the browser per second while training.
    columns: step columns sent before the browser reports its width.
    live: follow a run directory (``from_run``) as it grows.
    poll_interval: seconds between polls of a followed run directory.
    **recorder_kwargs: passed to ``Recorder`` when ``source`` is a model: among them ``objective``
        (what the loss is: ``"auto"``, ``"loss"``, ``"adversarial"``, ``"policy_gradient"``,
        ``"other"``), kept in the run's meta and used by every analysis the panel shows.
    """

    _esm = _BUNDLE if _BUNDLE.is_file() else _MISSING_ESM

    # the traits (each declared in protocol.TRAITS, with its kind, default and validation)
    meta = Synced()
    heat = Synced()
    flags = Synced()
    col_steps = Synced()
    loss = Synced()
    detail = Synced()
    detail_step = Synced()
    hists = Synced()
    hist_steps = Synced()
    hist_layer = Synced()
    hist_all = Synced()
    table = Synced()
    diagnoses = Synced()
    verdict = Synced()
    static_png = Synced()
    static_html = Synced()
    live = Synced()
    step = Synced()
    layer = Synced()
    metric = Synced()
    follow = Synced()
    choice = Synced()
    choice_applied = Synced()
    columns = Synced()
    expanded = Synced()
    noise = Synced()
    noise_text = Synced()

    #: new heatmap columns may travel alone while training (a comparison sends whole updates)
    _patches = True

    def __init__(
        self,
        source=None,
        optimizer=None,
        *,
        metric: str = "mean_abs",
        layer=None,
        max_rate: float = 4.0,
        columns: int = 1024,
        live: bool = False,
        poll_interval: float = 0.5,
        **recorder_kwargs,
    ) -> None:
        if not _BUNDLE.is_file():
            warnings.warn(BUNDLE_MISSING, GradwidgetWarning, stacklevel=2)
        # every argument is checked before anything is attached: a failed constructor must not
        # leave hooks (and an on_step callback) on the user's model
        check_options(metric, columns, max_rate, poll_interval, recorder_kwargs)
        known = source_layer_names(source)
        if known is not None:
            check_layer_option(layer, known)
        self._lock = threading.RLock()  # one update at a time: a training thread's, a page message's
        self._internal = 0  # traits being set by the panel itself (observers leave them alone)
        self._rows_cache: tuple | None = None
        # the parts
        self._selection = Selection(None if isinstance(layer, (int, np.integer)) and layer == -1 else layer)
        self._sync = LiveSync(self, max_rate, self._trailing, patches=self._patches)
        self._static = StaticRendition()
        self._analysis = Analysis(self._analyse, self._finished)
        self._outputs = Outputs()
        #: seconds the panel's work took on the training thread (bench/live.py reads it)
        self.training_thread_s = 0.0
        self._ready = False
        self._source = Source(source, optimizer, recorder_kwargs, live, self._on_step)
        try:
            if known is None and self.run is not None:  # a run directory: its layers are known now
                check_layer_option(layer, self.run.layer_names)
            super().__init__(metric=metric, columns=columns)
            self._own_layout = self.layout
            self._ready = True
            self._sync.push(force=True)
            self._analysis.now_or_later(self.run, fixed=self._source.fixed is not None)
        except BaseException:
            self._source.release()
            raise
        if self._source.directory and live:
            self._follow(float(poll_interval))
        if self.recorder is not None or (self._source.directory and live):
            watch_cells(self)
            self._analysis.start()
        own_cell(self)
        self.on_msg(self._on_page_message)

    # ----------------------------------------------------------------- the source
    @property
    def recorder(self):
        """The Recorder this panel shows (None for a run, or once its model is gone)."""
        return self._source.recorder

    @classmethod
    def from_run(cls, path, live: bool = False, **kwargs) -> GradientPanel:
        """A panel on a run directory written by ``Recorder(log_dir=...)``; with ``live=True`` it
        polls the directory and shows new steps as a training script writes them."""
        return cls(str(path), live=live, **kwargs)

    @classmethod
    def compare(
        cls, run_a, run_b, *, labels=None, mode: str = "side", metric: str = "mean_abs", columns: int = 1024, **kwargs
    ) -> ComparisonPanel:
        """Before and after the fix: ``run_a`` (the reference: a Run or a run directory) and ``run_b``
        (a Run, a run directory, or the current training: a GradientPanel or a Recorder) on one
        colour scale side by side (``mode="side"``) or as a difference map (``mode="diff"``: log10
        of the later run over the first), one cursor for both (steps aligned by step number), and
        the health table with both runs' health and the change (``gradwidget.compare``)."""
        return ComparisonPanel(run_a, run_b, labels=labels, mode=mode, metric=metric, columns=columns, **kwargs)

    @property
    def run(self) -> Run | None:
        """The Run shown (None before a hooked model's first recorded step)."""
        return self._source.run

    @property
    def report(self):
        """The analysis of the run (``gradwidget.analyze``), recomputed when the run has changed."""
        run = self.run
        if run is None:
            raise ValueError("no step has been recorded yet: train the model first")
        return self._analysis.report(run)

    @property
    def push_count(self) -> int:
        """Updates sent to the page (tests and benchmarks read it)."""
        return self._sync.count

    @property
    def static_step(self) -> int | None:
        """The step the static image (``static_png``, the mime bundle's ``image/png``) shows."""
        return self._static.step

    def log(self, loss=None, lr=None, step: int | None = None) -> None:
        """Attach the loss (and learning rate, or your own step number) to the next recorded step."""
        if self.recorder is None:
            raise TypeError("log() needs a panel that records a model: GradientPanel(model, optimizer)")
        self.recorder.log(loss=loss, lr=lr, step=step)

    def _replaced(self) -> None:
        """The cell that made this panel runs again: remove the hooks of the recorder it made, stop
        its threads and close its widget (the page drops its view); its run stays readable."""
        self._source.release()
        self.close()

    def detach(self) -> None:
        """Stop recording (remove the hooks of the recorder this panel created) and send the final view."""
        self._source.release()
        self.stop()

    def stop(self) -> None:
        """Stop following a run directory; send the final view and its static image."""
        self._source.stop()
        self.flush()

    def flush(self) -> None:
        """Send everything now (data, static image, and the analysis, waited for), ignoring the rate limit."""
        self._sync.cancel()
        self._sync.push(force=True)
        self._refresh_static()
        run = self.run
        if run is not None and run.version != self._analysis.version:
            self._analysis.submit(run, False, force=True)
            self._analysis.wait()

    refresh = flush

    def close(self) -> None:
        if hasattr(self, "_analysis"):  # construction may have failed before the parts existed
            self._sync.cancel()
            self._analysis.stop()
        if hasattr(self, "_source"):  # a closed panel keeps no recorder (nor its model) alive
            self._source.close()
        unwatch_cells(self)
        layout = getattr(self, "_own_layout", None)
        super().close()
        if layout is not None and layout is self.layout:  # the Layout made with the widget
            layout.close()

    def __repr__(self) -> str:
        run = self.run
        if run is None:
            return "GradientPanel(no step recorded yet)"
        return f"GradientPanel({run.n_layers} layers, {run.n_steps} steps)"

    # ----------------------------------------------------------------- selection (public)
    def select(self, layer) -> None:
        """Select a layer by name or column index (after an update a training thread is sending,
        which would write its own selection back over it)."""
        with self._lock:
            self.layer = need_run(self.run).layer_index(layer)

    def expand(self, layer) -> None:
        """Show ``layer`` (a name or column index) in its own row: every group holding it (past
        ``plots.MAX_DRAWN_ROWS`` layers the panel groups them) shows its members."""
        self.expanded = expanded_with(need_run(self.run), self.expanded, layer)

    def collapse(self, layer=None) -> None:
        """Fold back every group holding ``layer`` (a name or column index); all groups when None."""
        self.expanded = [] if layer is None else collapsed(need_run(self.run), self.expanded, layer)

    @property
    def layer_name(self) -> str | None:
        run = self.run
        if run is None or self.layer < 0 or self.layer >= run.n_layers:
            return None
        return run.layers[self.layer].name

    # ----------------------------------------------------------------- traits: checks and changes
    @t.validate("layer")
    def _check_layer(self, proposal):
        v = int(proposal["value"])
        run = self.run
        n = run.n_layers if run is not None else None
        if v < -1 or (n is not None and v >= n):
            raise t.TraitError(
                f"layer must be -1 (none) or a column index below {n}, got {v}; "
                "use panel.select(name) to select by name"
            )
        return v

    @t.validate("step")
    def _check_step(self, proposal):
        return self._snap(int(proposal["value"]))

    @t.observe("step")
    def _step_changed(self, change):
        if self._internal or not self._ready:
            return
        run = self.run
        if run is not None and run.n_steps:
            last = int(run.steps[-1])
            # the page says "follow" (End, or the newest column) with the newest step *it* had: a
            # training cell has recorded more since, and the kernel reads the message only when the
            # cell ends. Following is the user's last action: keep it, at the newest step now.
            following = getattr(self, "_property_lock", {}).get("follow") is True
            self._internal += 1
            try:
                self.follow = following or change["new"] >= last
                if following and change["new"] != last:
                    self.step = last
            finally:
                self._internal -= 1
        self._send_detail()

    @t.observe("layer")
    def _layer_changed(self, change):
        if not self._internal and self._ready:
            self._selection.chose()  # by the user (page or Python): the analysis never moves it
            self._send_detail()

    @t.observe("metric", "columns")
    def _view_changed(self, change):
        if not self._internal and self._ready:
            self._sync.push(force=True)

    @t.observe("expanded")
    def _rows_changed(self, change):
        """Expanding or collapsing a group changes the rows: the heatmap and the table are sent again."""
        if not self._internal and self._ready:
            with self._lock:
                self._sync.push(force=True)
                self._regroup_table()

    # ----------------------------------------------------------------- traits: setting and messages
    def set_state(self, sync_data) -> None:
        """A message from the page (ipywidgets calls this on the kernel's thread): a choice of step,
        follow or layer older than the newest applied is dropped (``selection.Selection``), and
        ``choice_applied`` goes back in the same update. The message waits for an update a
        training thread is sending (an update reads the selection and writes it back)."""
        with self._lock:
            sync_data, fresh = self._selection.page_choice(sync_data, self.choice_applied)
            with self.hold_sync():
                if sync_data:
                    super().set_state(sync_data)
                if fresh is not None:
                    self._set({"choice_applied": fresh})

    def _set(self, values: dict) -> None:
        """Set traits from the kernel (an array on a binary trait is encoded by it), in one message."""
        self._internal += 1
        try:
            with self.hold_sync():
                for k, v in values.items():
                    setattr(self, k, v)
        finally:
            self._internal -= 1

    def _hold(self, values: dict) -> None:
        """Keep ``values`` as the traits' values without sending them (the page has them from a
        patch); set straight into traitlets' storage, so no observer runs and nothing is sent."""
        for k, v in values.items():
            self._trait_values[k] = TRAITS[k].validate(v)

    def _on_page_message(self, widget, content, buffers) -> None:
        """The page could not apply a patch (it missed the update it extends): send everything.
        Or the page drew the panel: a front end shows it live (``_after_cell``)."""
        if isinstance(content, dict) and content.get("kind") == "rendered":
            self._outputs.seen = True
        if isinstance(content, dict) and content.get("kind") == "resend":
            self._sync.resend()
            self.send_state(["table"])

    # ----------------------------------------------------------------- live updates
    def _on_step(self, run: Run) -> None:
        """Called by the recorder after each recorded step (in the training thread); the time it
        takes there (sends, encoding, the run's copy for the analysis) adds up in ``training_thread_s``."""
        t0 = time.perf_counter()
        self._ping()
        self.training_thread_s += time.perf_counter() - t0

    def _ping(self) -> None:
        """A step arrived (on the thread that appends): send on the throttle; hand a copy of the
        run to the analysis thread when it is due."""
        self._sync.ping()
        run = self.run
        if run is not None and self._analysis.due() and run.version != self._analysis.version:
            self._analysis.submit(run, False)

    def _trailing(self) -> None:
        """The last update of a burst (timer thread); when no step comes for a second (training
        finished or paused), the static image and the final analysis follow."""
        run = self.run
        if run is None or run.version == self._sync.version:
            return
        if not self._sync.push(check_version=True, patch=True):
            self._sync.ping()
            return
        version = run.version

        def idle():
            run = self.run
            if run is not None and run.version == version and not self._source.stopped:
                self._analysis.submit(run, True, force=True)

        tm = threading.Timer(1.0, idle)
        tm.daemon = True
        tm.start()

    def _follow(self, interval: float) -> None:
        """Follow the run directory as it grows (``from_run(path, live=True)``)."""
        self.live = True

        def done():
            self.live = False

        self._source.follow(interval, self._ping, done)

    def _is_live(self) -> bool:
        return self._source.is_live()

    # ----------------------------------------------------------------- what a full update carries
    def _rows_of(self, run: Run | None) -> Rows | None:
        """The panel's rows (``rows.row_layout``) for ``run``'s layers and the ``expanded`` groups,
        kept while neither changes (a few ms for 10,000 tensors)."""
        if run is None:
            return None
        key = (run.layer_names, tuple(map(tuple, self.expanded)))
        cached = self._rows_cache
        if cached is None or cached[0] != key:
            cached = self._rows_cache = (key, row_layout(run, self.expanded))
        return cached[1]

    def _payload(self, run: Run | None, version: int) -> dict:
        """The traits of a full update of ``run`` (its view goes to the static rendition too)."""
        empty = {k: b"" for k in ("heat", "flags", "col_steps", "loss", "hist_all", "detail", "hists", "hist_steps")}
        if run is None:
            meta, arrays = P.empty_view(self.metric, len(getattr(self.recorder, "layer_names", None) or []))
            return {**empty, "meta": meta}
        rows = self._rows_of(run)
        meta, arrays = P.heat_view(run, self.metric, self.columns, rows)
        values: dict = {**empty, "meta": meta, **arrays}
        if run.n_steps:
            step = int(run.steps[-1]) if self.follow else self._snap(self.step)
            layer = self.layer if 0 <= self.layer < run.n_layers else self._selection.default_layer(run)
            scalars, detail = P.detail_view(run, step, layer, rows)
            values.update(scalars, **detail, step=step, layer=layer)
            col = int(np.searchsorted(arrays["col_steps"], step, side="right")) - 1
            self._static.note_view(version, step, arrays, meta, col)
        return values

    def _snap(self, step: int) -> int:
        return P.nearest_step(self.run, step)

    def _send_detail(self) -> None:
        with self._lock:
            try:
                scalars, arrays = P.detail_view(self.run, self.step, self.layer, self._rows_of(self.run))
            except Exception:  # a torn read while a training thread appends: its next update
                return  # carries the detail of this step and layer
            self._set({"detail": b"", "hists": b"", "hist_steps": b"", **scalars, **arrays})

    # ----------------------------------------------------------------- the analysis and the static copy
    def _analyse(self, snap: Run, final: bool) -> None:
        """Analyse a copy of the run (on the analysis thread) and send the table and diagnoses;
        ``final``: also the table's HTML kept with the static copy (not needed while training)."""
        if snap.version == self._analysis.version and not (final and self._static.table_version != snap.version):
            return
        report, layer_rows, diagnoses, html = analysis_of(snap, final)
        with self._lock:
            if snap.version < self._analysis.version:
                return
            run = self.run
            if report is not None and run is not None and run.version == snap.version:
                self._analysis.keep(report, snap.version)
            self._analysis.note(snap.version, layer_rows)
            rows = group_rows(layer_rows, self._rows_of(snap), snap)
            changed = changed_rows(self.table, rows)
            reading = report.task.reading if report is not None and report.loss.logged and report.task else ""
            verdict = verdict_line(diagnoses, snap.n_steps, reading) if report is not None else ""
            values: dict = {"diagnoses": diagnoses, "verdict": verdict}
            # the static copy's table (with the diagnoses: the analysis of this version); a live
            # analysis (not ``final``) makes none, and leaves the last one
            if final or report is None:
                self._static.note_table(snap.version, html or "")
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
            pick = top >= 0 and self._selection.analysis_may_pick() and top != self.layer
            if pick:
                values["layer"] = top
            self._set(values)
            if pick:
                self._send_detail()

    def _finished(self, snap: Run) -> None:
        """After a final analysis (the burst of steps is over): the static copy, and the outputs
        that wait for it."""
        with self._lock:
            self._refresh_static()
            run = self.run
            due = self._outputs.take_due(run is not None and run.version == snap.version)
        if due:
            self._update_outputs()

    def _regroup_table(self) -> None:
        """The health table on the rows shown now (after a group was expanded or collapsed)."""
        run = self.run
        layer_rows = self._analysis.layer_rows
        if run is not None and layer_rows:
            self._set({"table": group_rows(layer_rows, self._rows_of(run), run)})

    def _refresh_static(self) -> None:
        """``static_png`` and ``static_html`` made again when the view or the analysis changed
        (``rendition.StaticRendition``); milliseconds."""
        values = self._static.make(self.layer, self.metric, self.diagnoses)
        if values is not None:
            self._set(values)

    def _final_static(self, wait: float) -> None:
        """The static copy of the run as it is now, made from its analysis (waited for, at most
        ``wait`` seconds; it runs on the analysis thread): the same output whatever thread finishes first."""
        run = self.run
        if run is None or run.n_steps == 0 or self._analysis.on_thread():  # the analysis thread has just made it
            return
        self._sync.cancel()
        self._sync.push(force=True)
        if self._static.table_version != run.version:
            self._analysis.submit(run, True, force=True)
            self._analysis.wait(timeout=wait)
        with self._lock:
            self._refresh_static()

    # ----------------------------------------------------------------- notebook outputs
    def _after_cell(self) -> None:
        """After a cell ran (IPython ``post_run_cell``), if it recorded steps: the outputs this panel
        was displayed in get the static panel of the run as it ended (``_update_outputs``), so that
        the saved notebook holds it. Where no front end draws the panel (nbclient, ``nbconvert
        --execute``: the page never said ``rendered``), the final view is sent, the analysis of the
        final state waited for and the outputs updated here. Where a front end draws it, nothing is
        waited for: the final view goes out now, and the analysis thread, right after the cell's
        reply, makes the static panel (into the widget state, as the live panel's table) and then
        updates the outputs (once a cell, off the training thread)."""
        run = self.run
        if run is None or run.version == self._outputs.version:
            return
        if not self._outputs.seen:
            self._final_static(AFTER_CELL_WAIT)
            self._update_outputs()
            return
        self._sync.cancel()
        self._sync.push(force=True)
        self._outputs.due_after_analysis(run.version)
        self._analysis.submit(run, True, force=True, delay=AFTER_CELL_DELAY)

    def _ipython_display_(self, **kwargs) -> None:
        """Shown as a notebook output (the last expression of a cell, or ``display(panel)``): the
        mime bundle published with a display id that later updates reuse."""
        bundle = self._repr_mimebundle_()
        run = self.run
        self._outputs.show(bundle, run.version if run is not None and run.n_steps else -1)

    def _update_outputs(self) -> None:
        """Every output this panel was displayed in that shows an older state, again."""
        run = self.run
        self._outputs.update(self._repr_mimebundle_, run.version if run is not None else -1)

    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus the static panel (``_static_bundle``) for places where no widget runs."""
        out = super()._repr_mimebundle_(**kwargs)
        data, md = out if isinstance(out, tuple) else (out, {})
        data = dict(data)
        for k, v in self._static_bundle().items():
            if k == "text/plain" or k not in data:
                data[k] = v
        return data, md

    def _static_bundle(self) -> dict:
        """``image/png`` (the heatmap), ``text/html`` (the static panel) and ``text/plain`` (an ASCII
        heatmap) of the run as it is now (the analysis of this state is waited for)."""
        from ..fallback import FALLBACK_CLASS, static_fallback_html

        run = self.run
        if run is not None and run.n_steps:
            self._final_static(AFTER_CELL_WAIT)
        if run is None or run.n_steps == 0 or not self.static_png:
            meta = {**self.meta, "message": self.meta.get("message") or "no step recorded yet"}
            note = f"GradientPanel: {meta['message']}"
            return {"text/html": rendition_html(meta, {}, None, None, [], ""), "text/plain": note}
        png64 = self.static_png.split(",", 1)[1]
        html = self.static_html
        if FALLBACK_CLASS not in html:  # a comparison: its figures' image and its table
            html = static_fallback_html(base64.b64decode(png64), html)
        return {"image/png": png64, "text/html": html, "text/plain": to_ascii(run, width=60)}


class ComparisonPanel(GradientPanel):
    """Two runs in one panel (``GradientPanel.compare``): the first (reference) and the later one,
    on one colour scale side by side (``mode="side"``) or as a difference map (``mode="diff"``),
    one cursor for both. The later run is the panel's own source; the comparison
    (``compare_widget.Comparing``) owns the first, the labels and the shared rows."""

    # the comparison's own traits (protocol.TRAITS rows of owner "comparison")
    labels = Synced()
    heat_b = Synced()
    flags_b = Synced()
    diff = Synced()
    mode = Synced()

    _patches = False

    def __init__(self, run_a, run_b, *, labels=None, mode: str = "side", **kwargs) -> None:
        self._comparing = Comparing(run_a, run_b, labels, mode)
        super().__init__(self._comparing.source, **kwargs)
        self._set({"labels": list(self._comparing.labels), "mode": mode})

    @property
    def base(self) -> Run:
        """The first (reference) run."""
        return self._comparing.base

    @property
    def comparison(self):
        """``gradwidget.compare(first, later)`` of the current state (None before the later run's
        first step), recomputed when the later run has changed."""
        return self._comparing.comparison(self.run)

    def select(self, layer) -> None:
        """Select a row by layer name (the first run's name) or row index."""
        self.layer = self._comparing.row(layer)

    @t.validate("layer")
    def _check_layer(self, proposal):
        try:
            return self._comparing.check_row(int(proposal["value"]))
        except ValueError as e:
            raise t.TraitError(str(e)) from None

    def _payload(self, run: Run | None, version: int) -> dict:
        """Both runs on shared rows and columns; no per-step detail."""
        return self._comparing.payload(
            run, self.metric, self.columns, self.follow, self.step, self.layer, self._selection.default_layer
        )

    def _snap(self, step: int) -> int:
        return self._comparing.snap(self.run, step)

    def _send_detail(self) -> None:
        """Exact per-step values and histograms belong to one run: the comparison shows the heatmaps'
        columns instead (nothing to send)."""

    def _analyse(self, snap: Run, final: bool) -> None:
        """The comparison of the reference with a copy of the later run: the health table (both
        runs' health and the change), the later run's diagnoses, and the verdict as HTML."""
        if snap.version == self._analysis.version and not (final and self._static.table_version != snap.version):
            return
        cmp, rows, diagnoses, html = self._comparing.analyse(snap)
        with self._lock:
            if snap.version < self._analysis.version:
                return
            self._comparing.keep(cmp, snap.version)
            self._analysis.note(snap.version)
            self._static.note_table(snap.version, html)
            values: dict = {"table": rows, "diagnoses": diagnoses, "static_html": html}
            if self.meta.get("version") == snap.version:  # the verdict goes with the heatmaps it is about
                values["meta"] = {**self.meta, **self._comparing.verdict_of(snap.version)}
            self._set(values)

    def _refresh_static(self) -> None:
        """``static_png``: the comparison's figures (both heatmaps on one scale, the difference map)."""
        run = self.run
        if run is None or run.n_steps == 0 or run.version == self._static.version:
            return
        self._set({"static_png": self._comparing.static_png(run, self.metric)})
        self._static.made(run.version, int(run.steps[-1]))

    def _repr_mimebundle_(self, **kwargs):
        data, md = super()._repr_mimebundle_(**kwargs)
        cmp = self.comparison
        if cmp is not None:
            data["text/plain"] = cmp.summary_text()
        return data, md

    def __repr__(self) -> str:
        return f"GradientPanel.compare({' vs '.join(self._comparing.labels)})"
