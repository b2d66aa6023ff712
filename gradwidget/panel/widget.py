"""GradientPanel: the live, scrubbable gradient-flow panel for notebooks (an anywidget).

    panel = GradientPanel(model, optimizer)   # hooks the model; show it, then train as usual
    panel = GradientPanel(run)                 # a Run (or a Recorder) you already have
    panel = GradientPanel.from_run(path, live=True)   # a run directory, followed as it grows

The traits are listed in ``protocol.TRAITS`` (the page's side: ``js/src/protocol.ts``).

What runs where
---------------
On the training thread, after a recorded step, at most ``max_rate`` times a second: the heatmap
arrays (``payload.heat_view``, bounded by the page's width) and, when the analysis is due, a copy
of the run (``payload.snapshot``). The analysis for the health table and the diagnoses runs on its
own thread over that copy (``schedule.Worker``), at most 5% of the wall time. After a cell that
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

from ..run import METRICS, Run
from . import payload as P
from .protocol import TRAITS, encode
from .schedule import Throttle, Worker, poll_directory, unwatch_cells, watch_cells
from .static import heat_png
from .table import analyse, changed_rows

_BUNDLE = pathlib.Path(__file__).parent.parent / "static" / "widget.js"
BUNDLE_MISSING = (f"gradwidget's front end is not built ({_BUNDLE} is missing): run `pip install .` "
                  "(or `pip install -e .`) in the gradwidget source tree to build it (needs Node.js/npm).")

_MISSING_ESM = """
function render({ el }) {
  const d = document.createElement("div");
  d.style.cssText = "padding:8px 12px;border-left:4px solid #c62828;font-family:sans-serif";
  d.textContent = %r;
  el.append(d);
}
export default { render };
""" % BUNDLE_MISSING

#: seconds between refreshes of every layer's newest histogram while training.
HIST_ALL_EVERY = 2.0
#: runs up to this many step x layer cells are analysed at once when shown; bigger ones show the
#: heatmap first and the health table when the analysis thread has it.
SYNC_ANALYSIS_CELLS = 200_000


#: seconds between refreshes of every layer's newest histogram while training.
HIST_ALL_EVERY = 2.0
#: runs up to this many step x layer cells (analysed in a few milliseconds) are analysed before
#: the post-cell hook returns; bigger ones in the background.
POST_CELL_WAIT_CELLS = 5_000


def _import_analysis() -> None:
    from .. import analysis, report  # noqa: F401  (imported on the analysis thread, off the user's cells)


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
    layer: layer selected first (name or column index); default: the most flagged layer.
    max_rate: most updates sent to the browser per second while training.
    columns: step columns sent before the browser reports its width.
    live: follow a run directory (``from_run``) as it grows.
    poll_interval: seconds between polls of a followed run directory.
    **recorder_kwargs: passed to ``Recorder`` when ``source`` is a model.
    """

    _esm = _BUNDLE if _BUNDLE.is_file() else _MISSING_ESM

    meta = t.Dict().tag(sync=True)
    heat = t.Bytes(b"").tag(sync=True)
    flags = t.Bytes(b"").tag(sync=True)
    col_steps = t.Bytes(b"").tag(sync=True)
    loss = t.Bytes(b"").tag(sync=True)
    detail = t.Bytes(b"").tag(sync=True)
    detail_step = t.Int(-1).tag(sync=True)
    hists = t.Bytes(b"").tag(sync=True)
    hist_steps = t.Bytes(b"").tag(sync=True)
    hist_layer = t.Int(-1).tag(sync=True)
    hist_all = t.Bytes(b"").tag(sync=True)
    table = t.List(t.Dict()).tag(sync=True)
    diagnoses = t.List(t.Dict()).tag(sync=True)
    static_png = t.Unicode("").tag(sync=True)
    static_html = t.Unicode("").tag(sync=True)
    live = t.Bool(False).tag(sync=True)
    step = t.Int(0).tag(sync=True)
    layer = t.Int(-1).tag(sync=True)
    metric = t.Unicode("mean_abs").tag(sync=True)
    follow = t.Bool(True).tag(sync=True)
    columns = t.Int(1024).tag(sync=True)

    def __init__(self, source=None, optimizer=None, *, metric: str = "mean_abs", layer=None,
                 max_rate: float = 4.0, columns: int = 1024, live: bool = False,
                 poll_interval: float = 0.5, **recorder_kwargs) -> None:
        if not _BUNDLE.is_file():
            warnings.warn(BUNDLE_MISSING, stacklevel=2)
        # every argument is checked before anything is attached: a failed constructor must not
        # leave hooks (and an on_step callback) on the user's model
        _check_options(metric, columns, max_rate, poll_interval, recorder_kwargs)
        known = _source_layer_names(source)
        if known is not None:
            _check_layer_option(layer, known)
        self.recorder = None
        self._reader = None
        self._static_run: Run | None = None
        self._own_recorder = False
        self._lock = threading.RLock()
        self._internal = 0
        self._pushed_version = -1
        self._seq = 0  # numbers the heatmap updates: a patch names the one it extends (meta["seq"])
        self._shape: dict | None = None  # payload.view_shape of the last heatmap sent
        self._patched = False  # the page holds columns sent as patches (custom messages)
        self._hist_all_sent = 0.0  # when a patch last carried hist_all
        self._static_version = -1
        self._view: tuple | None = None  # (version, step, heat, flags, scale, cursor column) last sent
        self._report = None
        self._report_version = -1
        self._analysed_version = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._throttle = Throttle(max_rate, lambda: self._push(patch=True), self._trailing)
        self._worker = Worker(self._job, warm=_import_analysis)
        self._poll_interval = float(poll_interval)
        self._initial_layer = None if isinstance(layer, (int, np.integer)) and layer == -1 else layer
        self.push_count = 0  # updates sent (tests and benchmarks read it)
        #: the step the static image (``static_png``, the mime bundle's ``image/png``) shows
        self.static_step: int | None = None
        self._ready = False

        self._attach_source(source, optimizer, recorder_kwargs, live)
        try:
            if known is None and self.run is not None:  # a run directory: its layers are known now
                _check_layer_option(layer, self.run.layer_names)
            super().__init__(metric=metric, columns=columns)
            self._ready = True
            self._push(force=True)
            self._analyse_now_or_later()
        except BaseException:
            self._release_source()
            raise
        if self._reader is not None and live:
            self._start_polling()
        if self.recorder is not None or (self._reader is not None and live):
            watch_cells(self)
            self._worker.start()
        self.on_msg(self._on_page_message)

    # ----------------------------------------------------------------- sources
    def _attach_source(self, source, optimizer, recorder_kwargs: dict, live: bool) -> None:
        if isinstance(source, (str, pathlib.PurePath)):
            from ..storage import RunReader

            if optimizer is not None or recorder_kwargs:
                raise TypeError("a run directory takes no optimizer or recorder options")
            self._reader = RunReader(source)
            return
        if live:
            raise ValueError("live=True follows a run directory: pass its path (GradientPanel.from_run(path, live=True))")
        if isinstance(source, Run):
            if optimizer is not None or recorder_kwargs:
                raise TypeError("a Run takes no optimizer or recorder options, got "
                                + ", ".join(["optimizer"] * (optimizer is not None) + sorted(recorder_kwargs)))
            self._static_run = source
            return
        if source is not None and hasattr(source, "on_step") and hasattr(source, "run") and hasattr(source, "log"):
            if optimizer is not None or recorder_kwargs:
                raise TypeError("pass optimizer and recorder options to the Recorder itself, not to GradientPanel")
            self.recorder = source
        elif _is_module(source):
            from ..collect.torch import Recorder

            self.recorder = Recorder(source, optimizer, **recorder_kwargs)
            self._own_recorder = True
        elif source is not None and isinstance(getattr(source, "run", None), Run):  # an analysis Report
            self._static_run = source.run
            return
        else:
            raise TypeError(
                "GradientPanel needs a torch.nn.Module (with its optimizer), a Recorder, a Run or the path "
                f"of a run directory, got {type(source).__name__}")
        self.recorder.on_step.append(self._on_step)

    @classmethod
    def from_run(cls, path, live: bool = False, **kwargs) -> GradientPanel:
        """A panel on a run directory written by ``Recorder(log_dir=...)``; with ``live=True`` it
        polls the directory and shows new steps as a training script writes them."""
        return cls(str(path), live=live, **kwargs)

    @property
    def run(self) -> Run | None:
        """The Run shown (None before a hooked model's first recorded step)."""
        if self.recorder is not None:
            return self.recorder.run
        if self._reader is not None:
            return self._reader.run
        return self._static_run

    @property
    def report(self):
        """The analysis of the run (``gradwidget.analyze``), recomputed when the run has changed."""
        run = self.run
        if run is None:
            raise ValueError("no step has been recorded yet: train the model first")
        if self._report is None or self._report_version != run.version:
            from ..analysis import analyze

            self._report = analyze(run)
            self._report_version = run.version
        return self._report

    def log(self, loss=None, lr=None, step: int | None = None) -> None:
        """Attach the loss (and learning rate, or your own step number) to the next recorded step."""
        if self.recorder is None:
            raise TypeError("log() needs a panel that records a model: GradientPanel(model, optimizer)")
        self.recorder.log(loss=loss, lr=lr, step=step)

    def _release_source(self) -> None:
        """Remove this panel's callback from its recorder, and the hooks of a recorder it created."""
        if self.recorder is not None:
            if self._on_step in self.recorder.on_step:
                self.recorder.on_step.remove(self._on_step)
            if self._own_recorder:
                self.recorder.detach()

    def detach(self) -> None:
        """Stop recording (remove the hooks of the recorder this panel created) and send the final view."""
        self._release_source()
        self.stop()

    def stop(self) -> None:
        """Stop following a run directory; send the final view and its static image."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        self.flush()

    def flush(self) -> None:
        """Send everything now (data, static image, and the analysis, waited for), ignoring the rate limit."""
        self._throttle.cancel()
        self._push(force=True)
        self._refresh_static()
        run = self.run
        if run is not None and run.version != self._analysed_version:
            self._worker.submit((P.snapshot(run), False), force=True)
            self._worker.wait()

    refresh = flush

    def close(self) -> None:
        if hasattr(self, "_stop"):  # construction may have failed before the threads existed
            self._stop.set()
            self._throttle.cancel()
            self._worker.stop()
        rec = getattr(self, "recorder", None)
        if rec is not None and self._on_step in rec.on_step:
            rec.on_step.remove(self._on_step)
        unwatch_cells(self)
        super().close()

    def select(self, layer) -> None:
        """Select a layer by name or column index."""
        run = self.run
        if run is None:
            raise ValueError("no step has been recorded yet: layers are known after the first step")
        self.layer = run.layer_index(layer)

    @property
    def layer_name(self) -> str | None:
        run = self.run
        if run is None or self.layer < 0 or self.layer >= run.n_layers:
            return None
        return run.layers[self.layer].name

    def __repr__(self) -> str:
        run = self.run
        if run is None:
            return "GradientPanel(no step recorded yet)"
        return f"GradientPanel({run.n_layers} layers, {run.n_steps} steps)"

    # ----------------------------------------------------------------- live updates
    def _on_step(self, run: Run) -> None:
        """Called by the recorder after each recorded step (in the training thread)."""
        self._ping()

    def _ping(self) -> None:
        """A step arrived (on the thread that appends): send on the throttle; hand a copy of the
        run to the analysis thread when it is due."""
        self._throttle.ping()
        run = self.run
        if run is not None and self._worker.due() and run.version != self._analysed_version:
            self._worker.submit((P.snapshot(run), False))

    def _trailing(self) -> None:
        """The last update of a burst (timer thread); when no step comes for a second (training
        finished or paused), the static image and the final analysis follow."""
        run = self.run
        if run is None or run.version == self._pushed_version:
            return
        if not self._push(check_version=True, patch=True):
            self._throttle.ping()
            return
        version = run.version

        def idle():
            if self.run is not None and self.run.version == version and not self._stop.is_set():
                self._worker.submit((P.snapshot(self.run), True), force=True)

        tm = threading.Timer(1.0, idle)
        tm.daemon = True
        tm.start()

    def _start_polling(self) -> None:
        self.live = True

        def done():
            self.live = False

        self._thread = poll_directory(self._reader, self._poll_interval, self._stop, self._ping, done)

    # ----------------------------------------------------------------- sending
    def _snap(self, step: int) -> int:
        return P.nearest_step(self.run, step)

    def _set(self, values: dict) -> None:
        """Set traits from the kernel (binary ones encoded by the protocol), in one message."""
        self._internal += 1
        try:
            with self.hold_sync():
                for k, v in values.items():
                    setattr(self, k, encode(k, v) if TRAITS[k].kind == "bytes" else v)
        finally:
            self._internal -= 1

    def _hold(self, values: dict) -> None:
        """Keep ``values`` as the traits' values without sending them (the page has them from a
        patch); set straight into traitlets' storage, so no observer runs and nothing is sent."""
        for k, v in values.items():
            self._trait_values[k] = encode(k, v) if TRAITS[k].kind == "bytes" and not isinstance(v, bytes) else v

    def _send_patch(self, values: dict, start: int, base: int) -> None:
        """Send only the heatmap's columns from ``start`` on, and the other traits that changed,
        as one custom message (js/src/sync.ts applyPatch); hold the full values here."""
        # a layer's histograms over time wait for the next full update (the page shows the newest
        # histogram of every layer from hist_all meanwhile), and hist_all (256 bytes a layer)
        # refreshes every HIST_ALL_EVERY seconds
        held = {"hists": self.hists, "hist_steps": self.hist_steps}
        now = time.monotonic()
        if now - self._hist_all_sent < HIST_ALL_EVERY:
            held["hist_all"] = self.hist_all
            values["meta"] = {**values["meta"], "hist_all_step": self.meta.get("hist_all_step", -1)}
        else:
            self._hist_all_sent = now
        values = {**values, **held}
        tails = {"heat": values["heat"][:, start:], "flags": values["flags"][:, start:],
                 "col_steps": values["col_steps"][start:], "loss": values["loss"][start:]}
        small = {k: v for k, v in values.items() if TRAITS[k].kind != "bytes"}
        if small["meta"].get("layers") == self.meta.get("layers"):  # the page keeps the layers it has
            small["meta"] = {k: v for k, v in small["meta"].items() if k != "layers"}
        other = {k: encode(k, v) for k, v in values.items()
                 if TRAITS[k].kind == "bytes" and k not in tails and k not in held}
        other = {k: b for k, b in other.items() if b != getattr(self, k)}
        names = list(tails) + list(other)
        buffers = [encode(k, v) for k, v in tails.items()] + list(other.values())
        self.send({"kind": "patch", "model_id": self.model_id, "base": base, "start": int(start), "values": small,
                   "buffers": names}, buffers)
        self._hold(values)
        self._patched = True

    def _on_page_message(self, widget, content, buffers) -> None:
        """The page could not apply a patch (it missed the update it extends): send everything."""
        if isinstance(content, dict) and content.get("kind") == "resend":
            self._shape = None
            self._patched = True  # what the page holds is unknown: every trait travels
            self._push(force=True)
            self.send_state(["table"])

    def _push(self, force: bool = False, check_version: bool = False, patch: bool = False) -> bool:
        """Compute and send the data traits. Returns False (sending nothing) when ``check_version``
        is set and the run changed while the payload was computed (another thread appended).
        ``patch``: new steps alone travel when only steps were appended (the live path)."""
        with self._lock:
            run = self.run
            version = run.version if run is not None else -1
            if not force and version == self._pushed_version:
                return True
            from .. import plots  # noqa: F401  (colour scale, default layer: imported outside an update's timed cost)

            t_start = time.monotonic()
            empty = {k: b"" for k in ("heat", "flags", "col_steps", "loss", "hist_all", "detail", "hists",
                                      "hist_steps")}
            try:
                if run is None:
                    meta, arrays = P.empty_view(self.metric, len(getattr(self.recorder, "_names", []) or []))
                    values: dict = {**empty, "meta": meta}
                else:
                    meta, arrays = P.heat_view(run, self.metric, self.columns)
                    values = {**empty, "meta": meta, **arrays}
                    if run.n_steps:
                        step = int(run.steps[-1]) if self.follow else self._snap(self.step)
                        layer = self.layer if 0 <= self.layer < run.n_layers else self._default_layer(run)
                        scalars, detail = P.detail_view(run, step, layer)
                        values.update(scalars, **detail, step=step, layer=layer)
                        col = int(np.searchsorted(arrays["col_steps"], step, side="right")) - 1
                        self._view = (version, step, arrays["heat"], arrays["flags"], meta["scale"], col)
            except Exception as e:
                if check_version:
                    return False  # a torn read while training appends; the next step sends again
                raise RuntimeError(f"gradwidget could not build the panel's data: {e!r}") from e
            if check_version and run is not None and run.version != version:
                return False
            values["live"] = self._is_live()
            base, self._seq = self._seq, self._seq + 1
            values["meta"] = {**values["meta"], "seq": self._seq}
            shape = P.view_shape(run, values["meta"]) if run is not None else None
            start = P.patch_start(self._shape, shape) if patch and shape is not None else None
            if start is not None:
                self._send_patch(values, start, base)
            elif self._patched:  # the traits here already hold the patched values: send them all
                self._hold(values)
                self.send_state(list(values))
                self._patched = False
            else:
                self._set(values)
            self._shape = shape
            self._pushed_version = version
            self._throttle.sent(t_start)
            self.push_count += 1
            return True

    def _is_live(self) -> bool:
        if self._reader is not None:
            return self._thread is not None and not self._stop.is_set()
        rec = self.recorder
        return bool(rec is not None and getattr(rec, "attached", False) and self._on_step in rec.on_step)

    def _default_layer(self, run: Run) -> int:
        if self._initial_layer is not None:
            try:
                return run.layer_index(self._initial_layer)
            except (KeyError, IndexError):
                pass
        from ..plots import default_layer

        return int(default_layer(run))

    def _catch_up(self) -> None:
        """Send an update still held back by the rate limit (so ``step`` is the newest when following)."""
        run = self.run
        if run is not None and run.version != self._pushed_version:
            self._throttle.cancel()
            self._push(force=True)

    # ----------------------------------------------------------------- analysis and static rendition
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
        report, rows, diagnoses = analyse(snap)
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
            changed = changed_rows(self.table, rows)
            values: dict = {"diagnoses": diagnoses}
            if html is not None:
                values["static_html"] = html
            if changed is not None and self.comm is not None:
                if changed:  # only the rows that changed travel; the page splices them in
                    self.send({"kind": "rows", "model_id": self.model_id, "rows": [[i, rows[i]] for i in changed]})
                self._hold({"table": rows})
            else:
                values["table"] = rows
            self._set(values)

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
        self._worker.submit((P.snapshot(run), True), force=True)
        # a quick analysis is waited for, so that a notebook executed headless (nbclient,
        # nbconvert --execute) saves the table and image of its final state; a slow one never blocks
        if run.n_steps * run.n_layers <= POST_CELL_WAIT_CELLS:
            self._worker.wait(timeout=2.0)

    # ----------------------------------------------------------------- validation and two-way sync
    @t.validate("metric")
    def _check_metric(self, proposal):
        m = proposal["value"]
        if m not in METRICS:
            raise t.TraitError(f"unknown metric {m!r}; choose one of {list(METRICS)}")
        return m

    @t.validate("layer")
    def _check_layer(self, proposal):
        v = int(proposal["value"])
        run = self.run
        n = run.n_layers if run is not None else None
        if v < -1 or (n is not None and v >= n):
            raise t.TraitError(f"layer must be -1 (none) or a column index below {n}, got {v}; "
                               "use panel.select(name) to select by name")
        return v

    @t.validate("step")
    def _check_step(self, proposal):
        return self._snap(int(proposal["value"]))

    @t.validate("columns")
    def _check_columns(self, proposal):
        return int(min(P.MAX_COLUMNS, max(P.MIN_COLUMNS, int(proposal["value"]))))

    @t.observe("step")
    def _step_changed(self, change):
        if self._internal or not self._ready:
            return
        run = self.run
        if run is not None and run.n_steps:
            self._internal += 1
            try:
                self.follow = change["new"] >= int(run.steps[-1])
            finally:
                self._internal -= 1
        self._send_detail()

    @t.observe("layer")
    def _layer_changed(self, change):
        if not self._internal and self._ready:
            self._send_detail()

    @t.observe("metric", "columns")
    def _view_changed(self, change):
        if not self._internal and self._ready:
            self._push(force=True)

    def _send_detail(self) -> None:
        with self._lock:
            try:
                scalars, arrays = P.detail_view(self.run, self.step, self.layer)
            except Exception:  # a torn read while a training thread appends: its next update
                return         # carries the detail of this step and layer
            self._set({"detail": b"", "hists": b"", "hist_steps": b"", **scalars, **arrays})

    # ----------------------------------------------------------------- notebook output
    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus a static rendition (``image/png``, ``text/html`` with the image and
        the health table, ``text/plain`` ASCII heatmap) for places where no widget runs."""
        out = super()._repr_mimebundle_(**kwargs)
        data, md = out if isinstance(out, tuple) else (out, {})
        data = dict(data)
        self._catch_up()  # training in this cell may have left the last steps unsent
        run = self.run
        if run is None or run.n_steps == 0 or self._view is None:
            from ..report import static_mimebundle

            static = static_mimebundle(run)
        else:
            from ..report import static_fallback_html

            self._refresh_static()
            png = base64.b64decode(self.static_png.split(",", 1)[1])
            static = {"image/png": self.static_png.split(",", 1)[1],
                      "text/html": static_fallback_html(png, self.static_html),
                      "text/plain": run.to_ascii(width=60)}
        for k, v in static.items():
            if k == "text/plain" or k not in data:
                data[k] = v
        return data, md


def _check_options(metric, columns, max_rate, poll_interval, recorder_kwargs: dict) -> None:
    """Clear errors for the constructor's options (raised before anything is attached)."""
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
    if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or columns < 1:
        raise ValueError(f"columns must be a positive int (step columns of the heatmap), got {columns!r}")
    if isinstance(max_rate, bool) or not (isinstance(max_rate, (int, float)) and max_rate > 0):
        raise ValueError(f"max_rate must be a positive number of updates per second, got {max_rate!r}")
    if isinstance(poll_interval, bool) or not (isinstance(poll_interval, (int, float)) and poll_interval > 0):
        raise ValueError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
    if "step" in recorder_kwargs:
        raise TypeError("GradientPanel takes no step argument: set panel.step (a recorded step) once "
                        "the panel exists, which also stops it following the newest step")


def _source_layer_names(source) -> list[str] | None:
    """The layer names a source will show, known before attaching to it (None: a run directory,
    read when attached, or a source of unknown kind, rejected when attached)."""
    run = getattr(source, "run", None) if not isinstance(source, Run) else source
    if isinstance(run, Run):
        return run.layer_names
    names = getattr(source, "_names", None)  # a Recorder before its first step
    if isinstance(names, list):
        return names
    if _is_module(source):
        model = getattr(source, "module", source) if type(source).__name__ == "DistributedDataParallel" else source
        return [n for n, _ in model.named_parameters()]
    return None


def _check_layer_option(layer, names: list[str]) -> None:
    """``layer`` must be None, one of ``names`` or a column index of them (a clear error otherwise)."""
    if layer is None:
        return
    shown = ", ".join(repr(n) for n in names[:8]) + (f", ... ({len(names)} layers)" if len(names) > 8 else "")
    if isinstance(layer, str):
        if layer not in names:
            raise ValueError(f"no layer named {layer!r}; layers are {shown or 'none'}")
        return
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(f"layer must be a layer name (str) or a column index (int), "
                        f"got {type(layer).__name__} {layer!r}")
    if not -1 <= int(layer) < len(names):
        raise ValueError(f"layer {int(layer)} is out of range: -1 (none) or a column index below "
                         f"{len(names)}; layers are {shown or 'none'}")


def _is_module(obj) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module)
