"""GradientPanel: the live, scrubbable gradient-flow panel for notebooks (an anywidget).

    panel = GradientPanel(model, optimizer)   # hooks the model; show it, then train as usual
    panel = GradientPanel(run)                 # a Run (or a Recorder) you already have
    panel = GradientPanel.from_run(path, live=True)   # a run directory, followed as it grows

Trait protocol (what the front end in ``js/src/widget.ts`` reads; arrays travel as binary buffers):

=============  ===========  =====  =============================================================
trait          type         sync   content
=============  ===========  =====  =============================================================
meta           Dict         ->     shape (rows, cols, n_steps, n_layers), layers (name, module_type,
                                   status, numel), metric of the heatmap, metric list, thresholds,
                                   first/last step, steps per column (block), histogram range,
                                   message + level (empty run, non-finite data, metric without data),
                                   scale: [lo, hi] log10 colour range (``plots.color_scale``, the
                                   static figures' scale), hist_all_step: the step of ``hist_all``
heat           Bytes        ->     float32 (layers, cols) row-major, depth order: the heat metric,
                                   ``cols`` <= ``columns`` step columns (block means; max for max |g|)
flags          Bytes        ->     uint8 (layers, cols): 1 vanishing, 2 exploding, 4 non-finite,
                                   8 no gradient (OR over the column's steps)
col_steps      Bytes        ->     float64 (cols,): first user step number of each column
loss           Bytes        ->     float32 (cols,): mean loss per column (NaN where not logged)
detail         Bytes        ->     float32 (len(METRICS), layers): every metric at ``detail_step``
detail_step    Int          ->     the recorded step ``detail`` belongs to (-1: none)
hists          Bytes        ->     uint32 (H, 64) histograms of log10|g| of layer ``hist_layer``
hist_steps     Bytes        ->     float64 (H,) their steps (H <= MAX_HISTS, evenly thinned)
hist_layer     Int          ->     the layer ``hists`` belong to
hist_all       Bytes        ->     uint32 (layers, 64): every layer's histogram at the newest
                                   histogram step (so a layer picked while the kernel is busy shows
                                   its histogram at once); empty beyond MAX_HIST_ALL_LAYERS layers
table          List[Dict]   ->     layer health rows (from ``gradwidget.analyze``); NaN is null,
                                   +-Inf the strings "Infinity"/"-Infinity" (JSON has no infinity)
static_png     Unicode      ->     data URL of ``plots.panel_figure``: shown by the front end when
                                   the notebook's saved widget state has lost the binary buffers
static_html    Unicode      ->     the health table (HTML) that goes with ``static_png``; both are
                                   kept in the saved widget state, which ``--to gradwidget`` exports
live           Bool         ->     updates are flowing (a recorder attached or a directory followed)
step           Int          <->    scrubbed step (user step number; snapped to a recorded step)
layer          Int          <->    selected layer (column of the run, depth order; -1 none)
metric         Unicode      <->    metric of the heatmap, bars and series (one of METRICS)
follow         Bool         <->    the cursor follows the newest step while training
columns        Int          <-     step columns the heatmap can show (its width in device pixels)
=============  ===========  =====  =============================================================

Payload: the heatmap is bounded by ``columns`` (at most 4096) whatever the run's length, so a
100,000-step run costs about ``layers x columns x 5`` bytes per update, sent at most ``max_rate``
times a second. Exact values at one step (``detail``) and a layer's histograms come on demand,
when the step or the layer changes.

Training in the panel's own cell, or in a thread
-------------------------------------------------
Updates from the kernel reach the browser while a cell runs, but messages from the browser
(a scrubbed step, a selected layer, a metric) are handled by the kernel only between cells: while
a training loop runs in the cell, they wait in the kernel's queue. The front end therefore applies
the user's choice to its own view at once (cursor, selected row, series, the histogram at the
newest histogram step) and keeps it until the kernel has caught up; exact values at a scrubbed step
and a layer's histograms over time arrive when the cell has finished. To keep two-way sync live
during training (``panel.step`` / ``panel.layer`` readable in Python, exact values on demand), run
the loop in a background thread and leave the cell::

    import threading
    threading.Thread(target=train, daemon=True).start()   # train() as usual; the cell returns

After each cell the panel sends its final view and re-renders its static image and health table
(``static_png``, ``static_html``) at the step the view shows; they are part of the saved widget
state, from which ``jupyter nbconvert --to gradwidget`` exports the panel's final state.
"""
from __future__ import annotations

import base64
import math
import pathlib
import threading
import time
import warnings
import weakref
from typing import Any

import anywidget
import numpy as np
import traitlets as t

from .run import HIST_HI, HIST_LO, METRICS, N_BINS, Run

_BUNDLE = pathlib.Path(__file__).parent / "static" / "widget.js"
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

#: most histogram steps of one layer sent at once (evenly thinned beyond).
MAX_HISTS = 128
#: most layers for which every layer's newest histogram (``hist_all``) is sent (256 bytes a layer).
MAX_HIST_ALL_LAYERS = 4096
#: columns the kernel will ever send (a very wide, HiDPI screen).
MAX_COLUMNS = 4096
MIN_COLUMNS = 16

FLAG_VANISHING, FLAG_EXPLODING, FLAG_NONFINITE, FLAG_NODATA = 1, 2, 4, 8

_HEALTH_RANK = {"Critical": 3, "Warning": 2, "Unknown": 1, "Healthy": 0}


# --------------------------------------------------------------------------- decimation
def column_block(n_steps: int, columns: int) -> int:
    """Steps per heatmap column so that ``n_steps`` fit in at most ``columns`` columns."""
    return max(1, -(-int(n_steps) // max(1, int(columns))))


def block_reduce(a: np.ndarray, k: int, how: str = "mean") -> np.ndarray:
    """Fold consecutive groups of ``k`` rows of ``a`` (the last may be shorter).

    ``mean`` averages the finite values (NaN when a block has none; +Inf when it has only +Inf),
    ``max`` takes the largest value ignoring NaN, ``or`` ORs integer bit flags.
    """
    n = a.shape[0]
    if n == 0:
        return a[:0].copy()
    starts = np.arange(0, n, max(1, int(k)))
    if how == "or":
        return np.bitwise_or.reduceat(a, starts, axis=0)
    if k <= 1:
        return a.copy()
    if how == "max":
        nan = np.isnan(a)
        out = np.maximum.reduceat(np.where(nan, -np.inf, a), starts, axis=0)
        return np.where(np.logical_and.reduceat(nan, starts, axis=0), np.nan, out).astype(a.dtype)
    finite = np.isfinite(a)
    sums = np.add.reduceat(np.where(finite, a, 0).astype(np.float64), starts, axis=0)
    cnt = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
    posinf = np.logical_or.reduceat(np.isposinf(a), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = sums / cnt
    out = np.where(cnt > 0, out, np.where(posinf, np.inf, np.nan))
    return out.astype(a.dtype)


def cell_flags(run: Run, mean_abs: np.ndarray, max_abs: np.ndarray, nonfinite: np.ndarray) -> np.ndarray:
    """uint8 ``(steps, layers)`` flag bits from the three metrics the thresholds use."""
    th = run.thresholds
    trainable = run.trainable_mask()[None, :]
    with np.errstate(invalid="ignore"):
        f = np.where((mean_abs < th.vanishing) & trainable, FLAG_VANISHING, 0).astype(np.uint8)
        f |= np.where(max_abs > th.exploding, FLAG_EXPLODING, 0).astype(np.uint8)
        nf = nonfinite > 0
    f |= np.where(nf, FLAG_NONFINITE, 0).astype(np.uint8)
    f |= np.where(np.isnan(mean_abs) & ~nf, FLAG_NODATA, 0).astype(np.uint8)
    return f


def _all_steps(run: Run) -> np.ndarray:
    h = run.history
    return run.steps if h is None or h.n_steps == 0 else np.concatenate([h.steps, run.steps])


def _history_rows(run: Run) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Steps, the metrics and the loss of the run including its folded ``history`` (oldest first)."""
    full = run.with_history()
    return full.steps, {m: full.metric(m) for m in METRICS}, full.scalar("loss")


# --------------------------------------------------------------------------- health table
def _jsonable(v: Any) -> Any:
    """A table value as JSON: NaN is missing (None); JSON has no infinities, so +-Inf travel as the
    strings "Infinity"/"-Infinity", which the front end (``js/src/table.ts`` numberOf) reads back
    as numbers and shows as Inf (not as a huge finite number)."""
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return f if math.isfinite(f) else (None if f != f else ("Infinity" if f > 0 else "-Infinity"))
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (str, int, bool)):
        return v
    if hasattr(v, "value"):  # enums
        return _jsonable(v.value)
    try:
        import pandas as pd

        if pd.isna(v):
            return None
    except (TypeError, ValueError, ImportError):
        pass
    return str(v)


def table_from_report(report, run: Run) -> list[dict]:
    """Rows of the health table from an analysis Report's per-layer DataFrame."""
    df = report.layers
    rows = []
    for i, rec in enumerate(df.to_dict("records")):
        name = rec.get("layer")
        try:
            idx = run.layer_index(name) if name is not None else i
        except KeyError:
            idx = i
        row = {k: _jsonable(v) for k, v in rec.items()}
        row["index"] = int(idx)
        row["layer"] = str(name if name is not None else run.layers[idx].name)
        rows.append(row)
    return rows


def table_from_run(run: Run) -> list[dict]:
    """Health rows computed straight from the run, used when the analysis package is unavailable:
    medians/maxima over steps and a health grade from the share of flagged steps."""
    n = run.n_steps
    rows = []
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        gn = np.nanmedian(run.metric("grad_norm"), axis=0) if n else np.full(run.n_layers, np.nan)
        ma = np.nanmedian(run.metric("mean_abs"), axis=0) if n else np.full(run.n_layers, np.nan)
        mx = np.nanmax(run.metric("max_abs"), axis=0) if n else np.full(run.n_layers, np.nan)
        zf = np.nanmean(run.metric("zero_frac"), axis=0) if n else np.full(run.n_layers, np.nan)
        nf = np.nansum(run.metric("nonfinite"), axis=0) if n else np.zeros(run.n_layers)
        van = run.vanishing().mean(axis=0) if n else np.zeros(run.n_layers)
        exp = run.exploding().mean(axis=0) if n else np.zeros(run.n_layers)
    for j, info in enumerate(run.layers):
        flags = []
        if nf[j] > 0:
            flags.append("nonfinite")
        if exp[j] > 0:
            flags.append("exploding")
        if van[j] > 0:
            flags.append("vanishing")
        if info.status != "trainable" or n == 0:
            health, suggestion = "Unknown", ("frozen layer" if info.status == "frozen" else
                                             "never received a gradient" if info.status == "unused" else "")
        elif nf[j] > 0 or exp[j] > 0.3 or van[j] > 0.5:
            health = "Critical"
        elif exp[j] > 0 or van[j] > 0.1:
            health = "Warning"
        else:
            health = "Healthy"
        if health in ("Critical", "Warning"):
            if nf[j] > 0:
                suggestion = "non-finite gradients: lower the learning rate, clip gradients, check the loss"
            elif exp[j] > 0:
                suggestion = "exploding gradients: clip gradients or lower the learning rate"
            else:
                suggestion = "vanishing gradients: try ReLU-family activations, residual connections or normalisation"
        elif health == "Healthy":
            suggestion = ""
        rows.append({"index": j, "layer": info.name, "module_type": info.module_type, "numel": int(info.numel),
                     "status": info.status, "health": health, "grad_norm_median": _jsonable(gn[j]),
                     "mean_abs_median": _jsonable(ma[j]), "max_abs_max": _jsonable(mx[j]),
                     "zero_frac_mean": _jsonable(zf[j]), "nonfinite_total": _jsonable(nf[j]),
                     "flags": flags, "suggestion": suggestion})
    return rows


# --------------------------------------------------------------------------- the widget
class GradientPanel(anywidget.AnyWidget):
    """A live panel of how gradients flow through a network: scrubbable layers x steps heatmap,
    per-layer bars at the scrubbed step, layer health table, the selected layer's histogram and
    metric over time.

    Parameters
    ----------
    source: an ``nn.Module`` (a Recorder is attached to it, with ``optimizer``), a ``Recorder``,
        a ``Run``, or a run directory (``str``/``Path``, same as ``GradientPanel.from_run``).
    optimizer: the model's optimizer (a step is then one ``optimizer.step()``).
    metric: metric shown first (one of ``gradwidget.METRICS``; default mean |g|, on which the
        vanishing threshold is defined).
    layer: layer selected first (name or column index); default: the most flagged layer.
    max_rate: most updates sent to the browser per second while training.
    columns: step columns sent before the browser reports its width.
    live: follow a run directory (``from_run``) as it grows.
    poll_interval: seconds between polls of a followed run directory.
    **recorder_kwargs: passed to ``Recorder`` when ``source`` is a model (every, histogram_every,
        max_steps, thresholds, log_dir, ...).
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
        self._last_push = 0.0
        self._push_cost = 0.0  # seconds the last update took to build and send
        self._pushed_version = -1
        self._timer: threading.Timer | None = None
        self._table_time = 0.0
        self._table_version = -1
        self._static_version = -1
        self._report = None
        self._report_version = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._min_interval = 1.0 / float(max_rate)
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
        except BaseException:
            self._release_source()
            raise
        if self._reader is not None and live:
            self._start_polling()
        if self.recorder is not None or (self._reader is not None and live):
            _watch_cells(self)

    # ----------------------------------------------------------------- sources
    def _attach_source(self, source, optimizer, recorder_kwargs: dict, live: bool) -> None:
        if isinstance(source, (str, pathlib.PurePath)):
            from .storage import RunReader

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
            from .collect.torch import Recorder

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
    def from_run(cls, path, live: bool = False, **kwargs) -> "GradientPanel":
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
            from .analysis import analyze

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
        """Send everything now (data, table, static image), ignoring the rate limit."""
        self._cancel_timer()
        self._push(force=True, table=True)
        self._refresh_static()

    refresh = flush

    def close(self) -> None:
        if hasattr(self, "_stop"):  # construction may have failed before the threads existed
            self._stop.set()
            self._cancel_timer()
        rec = getattr(self, "recorder", None)
        if rec is not None and self._on_step in rec.on_step:
            rec.on_step.remove(self._on_step)
        _WATCHED.discard(self)
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

    def _interval(self) -> float:
        """Seconds between updates: at most ``max_rate`` a second, and never more than a tenth of
        the training thread's time spent building them (long runs cost more per update)."""
        return max(self._min_interval, 10.0 * self._push_cost)

    def _ping(self) -> None:
        now = time.monotonic()
        interval = self._interval()
        if now - self._last_push >= interval:
            self._cancel_timer()
            self._push()
        elif self._timer is None:
            delay = interval - (now - self._last_push) + 0.05
            self._timer = threading.Timer(delay, self._trailing)
            self._timer.daemon = True
            self._timer.start()

    def _trailing(self) -> None:
        """The last update of a burst, sent from a timer thread; when no step has arrived for a
        while (training finished or paused) the table and the static image follow."""
        self._timer = None
        run = self.run
        if run is None or run.version == self._pushed_version:
            return
        if not self._push(check_version=True):
            self._ping()
            return
        self._idle_check(run.version)

    def _idle_check(self, version: int) -> None:
        def idle():
            run = self.run
            if run is not None and run.version == version and not self._stop.is_set():
                self._push(force=True, table=True, check_version=True)
                self._refresh_static(check_version=True)

        tm = threading.Timer(1.0, idle)
        tm.daemon = True
        tm.start()

    def _cancel_timer(self) -> None:
        tm, self._timer = self._timer, None
        if tm is not None:
            tm.cancel()

    def _start_polling(self) -> None:
        self.live = True

        def loop():
            while not self._stop.wait(self._poll_interval):
                try:
                    if self._reader.poll():
                        self._ping()
                except Exception as e:  # a half-written file: report it and keep following
                    warnings.warn(f"gradwidget: reading {self._reader.path} failed: {e!r}")
            self.live = False

        self._thread = threading.Thread(target=loop, name="gradwidget-poll", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- building the payload
    def _snap(self, step: int) -> int:
        run = self.run
        if run is None or run.n_steps == 0:
            return int(step)
        steps = _all_steps(run)
        i = int(np.searchsorted(steps, step))
        if i >= len(steps):
            return int(steps[-1])
        if i > 0 and step - steps[i - 1] <= steps[i] - step:
            return int(steps[i - 1])
        return int(steps[i])

    def _payload(self, run: Run | None) -> dict:
        """Every data trait for the current run, metric and columns."""
        metric = self.metric
        if run is None:
            n_layers = len(getattr(self.recorder, "_names", []) or [])
            meta = {"n_layers": n_layers, "n_steps": 0, "rows": 0, "cols": 0, "layers": [],
                    "metric": metric, "metrics": list(METRICS), "thresholds": _thresholds(None),
                    "first_step": 0, "last_step": 0, "hist_lo": HIST_LO, "hist_hi": HIST_HI,
                    "n_bins": N_BINS, "block": 1, "version": 0, "level": "info",
                    "message": "No step recorded yet: train the model and the panel fills in as it goes."}
            return {"meta": meta, "heat": b"", "flags": b"", "col_steps": b"", "loss": b"", "hist_all": b""}
        steps, mets, loss = _history_rows(run)
        N, L = len(steps), run.n_layers
        k = column_block(N, self.columns)
        how = "max" if metric in ("max_abs", "nonfinite") else "mean"
        values = mets[metric]
        heat = block_reduce(values, k, how).T.astype(np.float32, copy=False)
        fl = cell_flags(run, mets["mean_abs"], mets["max_abs"], mets["nonfinite"])
        fl = block_reduce(fl, k, "or").T
        cols = heat.shape[1]
        col_steps = steps[::k].astype(np.float64)
        loss_cols = block_reduce(loss.astype(np.float32), k, "mean")
        message, level = "", ""
        if N == 0:
            message, level = "This run is empty: no step has been recorded yet.", "info"
        elif L == 0:
            message, level = "This run is empty: it has no layers (no parameter was recorded).", "info"
        else:
            n_nf = int(np.count_nonzero(mets["nonfinite"] > 0))
            if n_nf:
                bad = np.flatnonzero((mets["nonfinite"] > 0).any(axis=0))
                names = ", ".join(run.layers[j].name for j in bad[:3]) + (" ..." if len(bad) > 3 else "")
                message = (f"Non-finite gradients (NaN/Inf) in {n_nf} layer-steps, {len(bad)} layer(s): {names}. "
                           "They are marked magenta; values there are not plotted.")
                level = "error"
            elif not np.isfinite(values).any():
                message = (f"No finite values of {metric} in this run"
                           + (" (update norms need an optimizer)" if metric == "update_norm" else "") + ".")
                level = "warning"
        from .plots import color_scale

        lo, hi = color_scale(run, metric)  # the static figures' scale (history and window)
        hs = run.hist_steps
        hist_all = b""
        if len(hs) and L <= MAX_HIST_ALL_LAYERS:
            hist_all = np.ascontiguousarray(run.hist[-1], dtype=np.uint32).tobytes()
        meta = {
            "n_layers": L, "n_steps": int(N), "rows": L if cols else 0, "cols": int(cols),
            "scale": [float(lo), float(hi)], "hist_all_step": int(hs[-1]) if len(hist_all) else -1,
            "layers": [{"name": li.name, "module_type": li.module_type, "status": li.status,
                        "numel": int(li.numel)} for li in run.layers],
            "metric": metric, "metrics": list(METRICS), "thresholds": _thresholds(run),
            "first_step": int(steps[0]) if N else 0, "last_step": int(steps[-1]) if N else 0,
            "hist_lo": HIST_LO, "hist_hi": HIST_HI, "n_bins": N_BINS, "block": int(k),
            "version": int(run.version), "message": message, "level": level,
            "history_steps": int(run.history.n_steps) if run.history is not None else 0,
        }
        return {"meta": meta, "heat": np.ascontiguousarray(heat).tobytes(),
                "flags": np.ascontiguousarray(fl, dtype=np.uint8).tobytes(),
                "col_steps": col_steps.tobytes(), "loss": loss_cols.astype(np.float32).tobytes(),
                "hist_all": hist_all}

    def _detail_payload(self, run: Run | None, step: int, layer: int) -> dict:
        out: dict = {"detail": b"", "detail_step": -1, "hists": b"", "hist_steps": b"", "hist_layer": -1}
        if run is None or run.n_steps == 0:
            return out
        steps = run.steps
        i = int(np.searchsorted(steps, step))
        if i < len(steps) and steps[i] == step:
            out["detail"] = np.ascontiguousarray(run._M3[i], dtype=np.float32).tobytes()
            out["detail_step"] = int(step)
        if 0 <= layer < run.n_layers:
            out["hist_layer"] = int(layer)
            hs = run.hist_steps
            if len(hs):
                idx = np.unique(np.linspace(0, len(hs) - 1, min(len(hs), MAX_HISTS)).round().astype(int))
                # always include the histogram nearest the scrubbed step
                near = int(np.argmin(np.abs(hs - step)))
                idx = np.unique(np.append(idx, near))
                out["hists"] = np.ascontiguousarray(run.hist[idx, layer, :], dtype=np.uint32).tobytes()
                out["hist_steps"] = hs[idx].astype(np.float64).tobytes()
        return out

    def _table_rows(self, run: Run) -> list[dict]:
        if run.n_layers == 0:
            return []
        try:
            return table_from_report(self.report, run)
        except ImportError:
            return table_from_run(run)
        except Exception as e:  # an analysis bug must not take the panel down
            warnings.warn(f"gradwidget: analysing the run failed ({e!r}); showing basic statistics")
            return table_from_run(run)

    def _push(self, force: bool = False, table: bool = False, check_version: bool = False) -> bool:
        """Compute and send the data traits. Returns False (sending nothing) when ``check_version``
        is set and the run changed while the payload was computed (another thread appended)."""
        with self._lock:
            run = self.run
            version = run.version if run is not None else -1
            if not force and version == self._pushed_version:
                return True
            from . import plots  # noqa: F401  (imported once, outside the timed cost of an update)

            t_start = time.monotonic()
            try:
                payload = self._payload(run)
                if run is not None and run.n_steps:
                    last = int(run.steps[-1])
                    step = last if self.follow else self._snap(self.step)
                    layer = self.layer
                    if layer < 0 or layer >= run.n_layers:
                        layer = self._default_layer(run)
                    payload.update(self._detail_payload(run, step, layer))
                    payload["step"], payload["layer"] = step, layer
                    now = time.monotonic()
                    if table or self._table_version < 0 or now - self._table_time > 2.0:
                        payload["table"] = self._table_rows(run)
                        self._table_time, self._table_version = time.monotonic(), version
                        t_start += self._table_time - now  # the table has its own pace (every 2 s)
            except Exception as e:
                if check_version:
                    return False  # a torn read while training appends; the next step sends again
                raise RuntimeError(f"gradwidget could not build the panel's data: {e!r}") from e
            if check_version and run is not None and run.version != version:
                return False
            self._internal += 1
            try:
                with self.hold_sync():
                    for k, v in payload.items():
                        setattr(self, k, v)
                    self.live = self._is_live()
            finally:
                self._internal -= 1
            self._pushed_version = version
            self._last_push = time.monotonic()
            self._push_cost = self._last_push - t_start
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
        try:
            from .plots import default_layer

            return int(default_layer(run))
        except ImportError:
            return 0 if run.n_layers else -1

    def _view_step(self, run: Run) -> int:
        """The step the view shows: the newest when following, else the scrubbed step."""
        return int(run.steps[-1]) if self.follow else self._snap(self.step)

    def _catch_up(self) -> None:
        """Send an update still held back by the rate limit (so ``step`` is the newest when following)."""
        run = self.run
        if run is not None and run.version != self._pushed_version:
            self._cancel_timer()
            self._push(force=True)

    def _refresh_static(self, check_version: bool = False) -> None:
        """Render ``plots.panel_figure`` of the current view into ``static_png`` (a data URL)."""
        run = self.run
        if run is None or run.n_steps == 0 or run.version == self._static_version:
            return
        version = run.version
        step = self._view_step(run)
        try:
            from . import plots

            fig = plots.panel_figure(run, step=step, layer=self.layer if self.layer >= 0 else None,
                                     metric=self.metric)
            png = plots.figure_to_png(fig, dpi=60)
        except ImportError:
            return
        except Exception as e:
            if check_version:
                return
            warnings.warn(f"gradwidget: drawing the static image failed: {e!r}")
            return
        if check_version and run.version != version:
            return
        self._set_static(png, self._table_html(), version, step)

    def _table_html(self) -> str:
        """The health table of the run as HTML ("" when it cannot be analysed), kept in
        ``static_html`` so an exported notebook shows the table of the panel's final state."""
        if self.run is None or self.run.n_layers == 0:
            return ""
        try:
            from .report import health_table_html

            return health_table_html(self.report, suggestions=False)
        except Exception:  # no analysis package, or an analysis bug: the image alone still helps
            return ""

    def _set_static(self, png: bytes, table_html: str, version: int, step: int | None) -> None:
        """Store the static rendition in the synced traits (and so in the saved widget state)."""
        with self.hold_sync():
            self.static_png = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
            self.static_html = table_html
        self._static_version, self.static_step = version, step

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
        return int(min(MAX_COLUMNS, max(MIN_COLUMNS, int(proposal["value"]))))

    @t.observe("step")
    def _step_changed(self, change):
        if self._internal or not self._ready:
            return
        run = self.run
        if run is not None and run.n_steps:
            last = int(run.steps[-1])
            self._internal += 1
            try:
                self.follow = change["new"] >= last
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
            run = self.run
            try:
                payload = self._detail_payload(run, self.step, self.layer)
            except Exception:  # a torn read while a training thread appends: its next update
                return         # carries the detail of this step and layer
            self._internal += 1
            try:
                with self.hold_sync():
                    for k, v in payload.items():
                        setattr(self, k, v)
            finally:
                self._internal -= 1

    # ----------------------------------------------------------------- notebook output
    def _repr_mimebundle_(self, **kwargs):
        """The widget view plus a static rendition (``image/png``, ``text/html`` with the image and
        the health table, ``text/plain`` ASCII heatmap) for places where no widget runs."""
        out = super()._repr_mimebundle_(**kwargs)
        data, md = out if isinstance(out, tuple) else (out, {})
        data = dict(data)
        self._catch_up()  # training in this cell may have left the last steps unsent
        run = self.run
        step = self._view_step(run) if run is not None and run.n_steps else None
        try:
            static = self._static_bundle(run, step)
        except ImportError:
            static = {}
        except Exception as e:
            warnings.warn(f"gradwidget: the static rendition failed: {e!r}")
            static = {}
        for k, v in static.items():
            if k == "text/plain" or k not in data:
                data[k] = v
        if static.get("image/png") and run is not None:
            self._set_static(base64.b64decode(static["image/png"]), self._table_html(), run.version, step)
        return data, md

    def _static_bundle(self, run: Run | None, step: int | None) -> dict:
        """``report.static_mimebundle`` of the current view (with the panel's analysis, if any)."""
        from .report import static_mimebundle

        try:
            report = self.report if step is not None else None
        except Exception:
            report = None
        return static_mimebundle(run, step=step, layer=self.layer if self.layer >= 0 else None,
                                 metric=self.metric, report=report)

    def _after_cell(self) -> None:
        """After a cell ran (IPython ``post_run_cell``): if it recorded steps, send the final view
        and re-render the static image now, before the notebook is saved or exported."""
        run = self.run
        if run is None or (run.version == self._pushed_version and run.version == self._static_version):
            return
        self._cancel_timer()
        self._push(force=True, table=True)
        self._refresh_static()


_WATCHED: "weakref.WeakSet[GradientPanel]" = weakref.WeakSet()
_HOOKED: list = []  # the IPython shell whose post_run_cell runs _after_cell_hook


def _after_cells() -> None:
    for panel in list(_WATCHED):
        try:
            panel._after_cell()
        except Exception as e:  # never break the user's cell
            warnings.warn(f"gradwidget: updating the panel after the cell failed: {e!r}")


def _after_cell_hook(result=None) -> None:
    _after_cells()


def _watch_cells(panel: GradientPanel) -> None:
    """Flush ``panel`` after every IPython cell (weakly referenced; one hook for all panels)."""
    _WATCHED.add(panel)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None or any(sh is ip for sh in _HOOKED):
        return
    ip.events.register("post_run_cell", _after_cell_hook)
    _HOOKED.append(ip)


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


def _thresholds(run: Run | None) -> dict:
    from .thresholds import Thresholds

    th = run.thresholds if run is not None else Thresholds()
    return {"vanishing": float(th.vanishing), "exploding": float(th.exploding)}
