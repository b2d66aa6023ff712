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

import pathlib
import threading
import time
import warnings
import weakref

import anywidget
import numpy as np
import traitlets as t

from .._warnings import GradwidgetWarning
from ..run import Run
from . import payload as P
from .options import check_layer_option, check_options, is_module, source_layer_names
from .schedule import Throttle, Worker, own_cell, poll_directory, unwatch_cells, watch_cells
from .background import PanelBackground, import_analysis
from .display import PanelDisplay
from .selection import PanelSelection
from .sync import PanelSync
from .validation import PanelValidation

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


class GradientPanel(PanelSelection, PanelValidation, PanelSync, PanelDisplay, PanelBackground, anywidget.AnyWidget):
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
    verdict = t.Unicode("").tag(sync=True)
    static_png = t.Unicode("").tag(sync=True)
    static_html = t.Unicode("").tag(sync=True)
    live = t.Bool(False).tag(sync=True)
    step = t.Int(0).tag(sync=True)
    layer = t.Int(-1).tag(sync=True)
    metric = t.Unicode("mean_abs").tag(sync=True)
    follow = t.Bool(True).tag(sync=True)
    choice = t.Int(0).tag(sync=True)
    choice_applied = t.Int(0).tag(sync=True)
    columns = t.Int(1024).tag(sync=True)
    expanded = t.List(t.List(t.Int())).tag(sync=True)
    # a comparison of two runs (``GradientPanel.compare``; empty for one run)
    labels = t.List(t.Unicode()).tag(sync=True)
    heat_b = t.Bytes(b"").tag(sync=True)
    flags_b = t.Bytes(b"").tag(sync=True)
    diff = t.Bytes(b"").tag(sync=True)
    mode = t.Unicode("side").tag(sync=True)
    noise = t.Bytes(b"").tag(sync=True)
    noise_text = t.Unicode("").tag(sync=True)

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
        # the recorder is held weakly: the model's hooks keep it alive while the model is (one the
        # user passed is held strongly too, until the panel is closed), so a panel never keeps a
        # model or its optimizer's state alive; the run it recorded stays (``run``)
        self._recorder_ref: weakref.ref | None = None
        self._recorder_hold = None
        self._recorded: Run | None = None
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
        self._static_table: tuple[int, str] = (-1, "")  # (run version, the static panel's health table)
        self._static_key: tuple | None = None  # what static_html was made from
        self._displays: list = []  # [IPython display handle, run version it shows] of this panel's outputs
        self._outputs_version = -1  # the run's version those outputs show
        self._outputs_due = False  # the analysis thread updates them after its next final static panel
        self._views_seen = False  # a front end drew this panel (its page said so)
        self._view: tuple | None = None  # (version, step, heat, flags, scale, cursor column, meta, col_steps) last sent
        self._report = None
        self._report_version = -1
        self._analysed_version = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._throttle = Throttle(max_rate, lambda: self._push(patch=True), self._trailing)
        self._worker = Worker(self._job, warm=import_analysis)
        self._poll_interval = float(poll_interval)
        self._initial_layer = None if isinstance(layer, (int, np.integer)) and layer == -1 else layer
        self._layer_chosen = False  # a user selected a layer (then the analysis does not)
        self._layer_rows: list = []  # the analysis' health rows, one per layer (grouped when sent)
        self.push_count = 0  # updates sent (tests and benchmarks read it)
        #: seconds the panel's work took on the training thread (bench/live.py reads it)
        self.training_thread_s = 0.0
        #: the step the static image (``static_png``, the mime bundle's ``image/png``) shows
        self.static_step: int | None = None
        self._ready = False

        self._attach_source(source, optimizer, recorder_kwargs, live)
        try:
            if known is None and self.run is not None:  # a run directory: its layers are known now
                check_layer_option(layer, self.run.layer_names)
            super().__init__(metric=metric, columns=columns)
            self._own_layout = self.layout
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
        own_cell(self)
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
            raise ValueError(
                "live=True follows a run directory: pass its path (GradientPanel.from_run(path, live=True))"
            )
        if isinstance(source, Run):
            if optimizer is not None or recorder_kwargs:
                raise TypeError(
                    "a Run takes no optimizer or recorder options, got "
                    + ", ".join(["optimizer"] * (optimizer is not None) + sorted(recorder_kwargs))
                )
            self._static_run = source
            return
        if source is not None and hasattr(source, "on_step") and hasattr(source, "run") and hasattr(source, "log"):
            if optimizer is not None or recorder_kwargs:
                raise TypeError("pass optimizer and recorder options to the Recorder itself, not to GradientPanel")
            recorder = self._recorder_hold = source
        elif is_module(source):
            from ..collect.torch import Recorder

            recorder = Recorder(source, optimizer, **recorder_kwargs)
            self._own_recorder = True
        elif source is not None and isinstance(getattr(source, "run", None), Run):  # an analysis Report
            self._static_run = source.run
            return
        else:
            raise TypeError(
                "GradientPanel needs a torch.nn.Module (with its optimizer), a Recorder, a Run or the path "
                f"of a run directory, got {type(source).__name__}"
            )
        self._recorder_ref = weakref.ref(recorder)
        recorder.on_step.append(self._on_step)

    @property
    def recorder(self):
        """The Recorder this panel shows (None for a run, or once its model is gone)."""
        return self._recorder_ref() if self._recorder_ref is not None else None

    @classmethod
    def from_run(cls, path, live: bool = False, **kwargs) -> GradientPanel:
        """A panel on a run directory written by ``Recorder(log_dir=...)``; with ``live=True`` it
        polls the directory and shows new steps as a training script writes them."""
        return cls(str(path), live=live, **kwargs)

    @classmethod
    def compare(
        cls, run_a, run_b, *, labels=None, mode: str = "side", metric: str = "mean_abs", columns: int = 1024, **kwargs
    ) -> GradientPanel:
        """Before and after the fix: ``run_a`` (the reference: a Run or a run directory) and ``run_b``
        (a Run, a run directory, or the current training: a GradientPanel or a Recorder) on one
        colour scale side by side (``mode="side"``) or as a difference map (``mode="diff"``: log10
        of the later run over the first), one cursor for both (steps aligned by step number), and
        the health table with both runs' health and the change (``gradwidget.compare``)."""
        from .compare_widget import ComparisonPanel

        return ComparisonPanel(run_a, run_b, labels=labels, mode=mode, metric=metric, columns=columns, **kwargs)

    @property
    def run(self) -> Run | None:
        """The Run shown (None before a hooked model's first recorded step)."""
        rec = self.recorder
        if rec is not None and rec.run is not None:
            self._recorded = rec.run
        if self._recorder_ref is not None:
            return self._recorded
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
        rec = self.recorder
        if rec is not None:
            if self._on_step in rec.on_step:
                rec.on_step.remove(self._on_step)
            if self._own_recorder:
                rec.detach()

    def _replaced(self) -> None:
        """The cell that made this panel runs again: remove the hooks of the recorder it made, stop
        its threads and close its widget (the page drops its view); its run stays readable."""
        self._release_source()
        self.close()

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
        rec = self.recorder if hasattr(self, "_recorder_ref") else None
        if rec is not None and self._on_step in rec.on_step:
            rec.on_step.remove(self._on_step)
        self._recorder_hold = None  # a closed panel keeps no recorder (nor its model) alive
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

    # ----------------------------------------------------------------- notebook output
    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus the static panel (``display.PanelDisplay._static_bundle``) for places
        where no widget runs."""
        out = super()._repr_mimebundle_(**kwargs)
        data, md = out if isinstance(out, tuple) else (out, {})
        data = dict(data)
        for k, v in self._static_bundle().items():
            if k == "text/plain" or k not in data:
                data[k] = v
        return data, md
