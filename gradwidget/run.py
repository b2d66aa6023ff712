"""The Run: a columnar store of per-step, per-layer gradient statistics.

Everything downstream (analysis, widget, plots, reports) reads a Run; collectors append to it.
Per recorded step and layer it holds ``len(METRICS)`` float32 values (32 bytes) and the count of
non-finite entries again as float64 (8 bytes: exact up to 2**53, where float32 stops at 2**24); every
``histogram_every`` steps a histogram of log10|g| (``N_BINS`` uint64 counts, 512 bytes per layer).
With a rolling window (``max_steps``) the steps that fall out are folded into ``history``, a
decimated copy whose length never exceeds ``history_capacity`` rows, so memory stays bounded.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from ._args import check_count
from .layers import LAYER_STATUSES, LayerInfo, as_layers
from .noise_series import NoiseSeries
from .origin import NONFINITE_PHASES, NonfiniteOrigin
from .run_append import GROWTH_DIVISOR, RunAppend
from .schema import _as_step as _as_step  # collect/torch.py imports it from here
from .rules import (
    CANNOT_MOVE_ROWS,
    cannot_move,
    exploding_flags,
    nearest_index,
    nonfinite_mask,
    rounding_ratio,
    vanishing_mask,
)
from .schema import (
    HIST_EDGES,
    HIST_HI,
    HIST_LO,
    HIST_LOG2_LO,
    METRICS,
    N_BINS,
    NONFINITE_ROW,
    SCALARS,
    metric_index,
    scalar_index,
)
from .thresholds import Thresholds, as_thresholds

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "GROWTH_DIVISOR",
    "HIST_EDGES",
    "HIST_HI",
    "HIST_LO",
    "HIST_LOG2_LO",
    "LAYER_STATUSES",
    "METRICS",
    "N_BINS",
    "NONFINITE_PHASES",
    "SCALARS",
    "LayerInfo",
    "NonfiniteOrigin",
    "Run",
    "check_max_steps",
    "step_bytes",
]


def step_bytes(n_layers: int, histogram_every: int = 0) -> float:
    """Bytes a Run holds per recorded step of ``n_layers`` layers with a histogram every
    ``histogram_every`` steps (0: none): the float32 metrics and float64 non-finite counts, the step
    number and scalars, and the uint64 histogram counts (docs/costs.md, Memory)."""
    per_step = (4 * len(METRICS) + 8) * n_layers + 8 * (1 + len(SCALARS))
    return per_step + (8 * N_BINS * n_layers / histogram_every if histogram_every else 0)


def check_max_steps(max_steps) -> None:
    """A rolling window's size: None (keep every step) or a positive int (a bool is no size)."""
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")


def concat_rows(a: "Run", b: "Run") -> "Run":
    """The steps of ``a`` then those of ``b`` (the same layers) as one Run with ``a``'s histograms:
    how pending rows join the folded history, and history joins the window."""
    r = a._slice_rows(0, a.n_steps)
    r._steps = np.concatenate([a.steps, b.steps])
    r._metrics = np.concatenate([a._M3, b._M3])
    r._nonfinite = np.concatenate([a._NF, b._NF])
    r._scalars = np.concatenate([a._S2, b._S2])
    r._n = r._cap = len(r._steps)
    return r


class Run(RunAppend):
    """Per-layer metadata plus ``(steps, layers)`` float32 metric arrays, histograms and scalars.

    Columns are layers in depth order (input side first, loss side last: the reverse of the order in
    which gradients arrive). ``edges`` holds forward data-flow pairs ``(upstream, downstream)`` of
    layer indices, recorded from the real autograd graph by the torch Recorder.
    """

    def __init__(
        self,
        layers: Sequence,
        *,
        thresholds=None,
        max_steps: int | None = None,
        history_capacity: int = 2048,
        edges: Iterable[tuple[int, int]] = (),
        meta: dict | None = None,
    ) -> None:
        self.layers: list[LayerInfo] = as_layers(layers)
        self.thresholds: Thresholds = as_thresholds(thresholds)
        check_max_steps(max_steps)
        self.max_steps = max_steps
        self.history_capacity = int(history_capacity)
        self.edges = np.asarray(list(edges), dtype=np.int32).reshape(-1, 2)
        self.meta: dict = dict(meta or {})
        L = len(self.layers)
        self._n = 0  # rows in the window
        self._s = 0  # physical row where the window starts (advances as old steps fall out)
        self._cap = 0
        self._steps = np.zeros(0, np.int64)
        self._metrics = np.zeros((0, len(METRICS), L), np.float32)
        #: the exact non-finite counts (float64; their row in ``_metrics`` holds them rounded to float32)
        self._nonfinite = np.zeros((0, L), np.float64)
        self._scalars = np.zeros((0, len(SCALARS)), np.float64)
        self._hn = 0
        self._hs = 0  # physical row of the first histogram in the window
        self._hist_steps = np.zeros(0, np.int64)
        self._hist = np.zeros((0, L, N_BINS), np.uint64)
        self.history: Run | None = None  # decimated steps that fell out of the window
        self.history_block = 1
        self._pending: Run | None = None
        self._index = {info.name: i for i, info in enumerate(self.layers)}
        #: the gradient at two batch sizes per step, when the recorder saw it (``noise_series``)
        self.noise: NoiseSeries | None = None
        self.version = 0  # bumps on every change; views use it to know when to refresh
        self._lock = threading.Lock()  # held by every change of the store, and by snapshot()
        self._open = False  # the newest row is still being filled (append(..., complete=False))
        self._frozen = False  # a snapshot: read-only

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock is no state: each copy gets its own
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- a consistent view for readers
    def snapshot(self) -> "Run":
        """The run as it is now, for reading while training appends to it (in another thread):
        its complete steps, histograms, history and meta, unchanged by later appends. O(1): it
        shares the arrays (read-only views bounded by the last complete step; the store never
        writes a row a snapshot can see, ``run_append``). Every reader of a run takes one first
        (``to_frame``, ``to_ascii``, ``summary``, ``analyze``, the panel); a snapshot's is itself."""
        if self._frozen:
            return self
        with self._lock:
            r = copy.copy(self)
            r._frozen, r._open = True, False
            r.meta, r.layers = dict(self.meta), list(self.layers)
            if self._open:
                r._n -= 1
                if r._hn and r._hist_steps[r._hs + r._hn - 1] == self._steps[self._s + self._n - 1]:
                    r._hn -= 1
            for name in ("_steps", "_metrics", "_nonfinite", "_scalars", "_hist_steps", "_hist"):
                view = getattr(self, name).view()
                view.flags.writeable = False
                setattr(r, name, view)
            r.history = self.history.snapshot() if self.history is not None else None
            r._pending = self._pending.snapshot() if self._pending is not None else None
        return r

    # ----------------------------------------------------------------- shape and access
    @property
    def n_steps(self) -> int:
        return self._n

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_names(self) -> list[str]:
        return [info.name for info in self.layers]

    def layer_index(self, layer: int | str) -> int:
        if isinstance(layer, (int, np.integer)):
            if not -self.n_layers <= layer < self.n_layers:
                raise IndexError(f"layer index {layer} out of range for {self.n_layers} layers")
            return int(layer) % self.n_layers
        try:
            return self._index[layer]
        except KeyError:
            raise KeyError(
                f"no layer named {layer!r}; layers are {self.layer_names[:8]}" + ("..." if self.n_layers > 8 else "")
            ) from None

    @property
    def steps(self) -> np.ndarray:
        """The user's step numbers of the recorded steps, shape ``(steps,)``."""
        return self._steps[self._s : self._s + self._n]

    @property
    def _M3(self) -> np.ndarray:
        """``(steps, metrics, layers)`` float32 view of the window (``block``): its non-finite row is
        NaN, never read; ``_NF`` holds those counts."""
        return self._metrics[self._s : self._s + self._n]

    @property
    def _NF(self) -> np.ndarray:
        """``(steps, layers)`` float64 view of the window's exact non-finite counts."""
        return self._nonfinite[self._s : self._s + self._n]

    def step_row(self, i: int) -> np.ndarray:
        """Step row ``i`` of the window as ``append`` takes it: ``(METRICS, layers)`` float64, the
        non-finite counts exact."""
        row = self._M3[i].astype(np.float64)
        row[NONFINITE_ROW] = self._NF[i]
        return row

    @property
    def _S2(self) -> np.ndarray:
        return self._scalars[self._s : self._s + self._n]

    def block(self, rows=slice(None)) -> np.ndarray:
        """``(rows, METRICS, layers)`` float32: every metric of the window's ``rows`` (an index, a
        slice or an array of them) in one gather, a view for an index or a slice. The non-finite
        counts' row there is NaN: they are kept once, exact, in ``metric("nonfinite")`` (float64)."""
        return self._M3[rows]

    def metric(self, name: str) -> np.ndarray:
        """A ``(steps, layers)`` view of one metric: float32, except the non-finite counts (float64,
        exact)."""
        i = metric_index(name)
        return self._NF if i == NONFINITE_ROW else self._M3[:, i, :]

    @property
    def metrics(self) -> dict[str, np.ndarray]:
        return {m: self.metric(m) for m in METRICS}

    def scalar(self, name: str) -> np.ndarray:
        """A ``(steps,)`` float64 view of one per-step scalar (NaN where it was not given)."""
        return self._S2[:, scalar_index(name)]

    @property
    def hist_steps(self) -> np.ndarray:
        return self._hist_steps[self._hs : self._hs + self._hn]

    @property
    def hist(self) -> np.ndarray:
        """``(histogram steps, layers, N_BINS)`` counts of log10|g| (zeros and non-finite excluded)."""
        return self._hist[self._hs : self._hs + self._hn]

    hist_edges = HIST_EDGES

    def step_position(self, step: int) -> int:
        """Row of the recorded step nearest to the user's step number ``step``."""
        if self._n == 0:
            raise ValueError("the run is empty: no step has been recorded yet")
        return nearest_index(self.steps, step)

    def histogram_at(self, layer: int | str, step: int) -> tuple[int, np.ndarray] | None:
        """The histogram of ``layer`` recorded nearest to ``step`` (its step, counts), or None."""
        if self._hn == 0:
            return None
        j = self.layer_index(layer)
        i = nearest_index(self.hist_steps, step)
        return int(self.hist_steps[i]), self.hist[i, j]

    # ----------------------------------------------------------------- flags (the original crate's animator)
    def vanishing(self) -> np.ndarray:
        """Boolean ``(steps, layers)``: mean |g| below ``thresholds.vanishing`` (frozen layers and
        those the loss cannot move, ``cannot_move``, excluded)."""
        return vanishing_mask(self.metric("mean_abs"), self.thresholds, self.trainable_mask() & ~self.cannot_move())

    def cannot_move(self) -> np.ndarray:
        """Boolean ``(layers,)``: parameters the loss cannot move, their gradient zero up to float
        rounding by the model's symmetry (``rules.cannot_move``), judged on ``CANNOT_MOVE_ROWS``
        evenly spaced steps from the first."""
        n = self.n_steps
        if n == 0 or self.n_layers == 0:
            return np.zeros(self.n_layers, bool)
        rows = np.unique(np.linspace(0, n - 1, min(n, CANNOT_MOVE_ROWS)).round().astype(np.intp))
        which = [metric_index(m) for m in ("mean_abs", "zero_frac")]
        ma, zf = np.moveaxis(self._M3[rows[:, None], np.array(which)[None, :]], 1, 0)  # only these two
        nf = self._NF[rows]
        mods = [info.module or info.name.rsplit(".", 1)[0] for info in self.layers]
        ids = {m: k for k, m in enumerate(dict.fromkeys(mods))}
        ratios = {d: rounding_ratio(d) for d in {info.dtype for info in self.layers}}
        return cannot_move(
            ma,
            zf,
            nf,
            np.array([ids[m] for m in mods], np.intp),
            np.array([ratios[info.dtype] for info in self.layers]),
            self.trainable_mask(),
            self.thresholds,
        )

    def exploding(self) -> np.ndarray:
        """Boolean ``(steps, layers)``: max |g| above ``thresholds.exploding`` or non-finite."""
        return exploding_flags(self.metric("max_abs"), self.metric("nonfinite"), self.thresholds)

    def nonfinite(self) -> np.ndarray:
        """Boolean ``(steps, layers)``: the step's gradient had a NaN or Inf."""
        return nonfinite_mask(self.metric("nonfinite"))

    def flow_intensity(self) -> np.ndarray:
        """The original crate's ``flow_intensity``: norm / the step's largest norm, in [0, 1] (0 for empty steps)."""
        g = np.nan_to_num(self.metric("grad_norm"), nan=0.0, posinf=0.0)
        top = g.max(axis=1, keepdims=True) if g.size else np.zeros((g.shape[0], 1), np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = np.where(top > 0, g / np.where(top > 0, top, 1), 0.0)
        return np.clip(out, 0.0, 1.0).astype(np.float32)

    def trainable_mask(self) -> np.ndarray:
        return np.array([info.status != "frozen" for info in self.layers], bool)

    @property
    def nonfinite_origin(self) -> NonfiniteOrigin | None:
        """Where the first NaN/Inf was made (module, step, pass), or None when none was traced.
        Kept in ``meta["nonfinite_origin"]``, so it is saved with the run and every slice has it."""
        d = self.meta.get("nonfinite_origin")
        return None if d is None else NonfiniteOrigin.from_dict(d)

    @nonfinite_origin.setter
    def nonfinite_origin(self, origin: NonfiniteOrigin | None) -> None:
        if origin is not None and not isinstance(origin, NonfiniteOrigin):
            raise TypeError(f"nonfinite_origin must be a NonfiniteOrigin or None, not {type(origin).__name__}")
        if origin is None:
            self.meta.pop("nonfinite_origin", None)
        else:
            self.meta["nonfinite_origin"] = origin.to_dict()
        self.version += 1

    # ----------------------------------------------------------------- continuing a run
    def continue_from(self, old: "Run") -> None:
        """Put the steps of ``old`` (a run this one continues: ``Recorder(..., resume=True)``) in
        front of this run's, with their histograms and noise rows (a rolling window keeps the
        newest), and what ``old.meta`` said of the run that this run's meta does not say anew (its
        NaN origin, the tracing and loss graph it used, the trainer's clipping, the replica check's
        record). How the earlier run was distributed is not this run's."""
        hist_at = {int(s): k for k, s in enumerate(old.hist_steps)}
        for i, step in enumerate(old.steps.tolist()):
            k = hist_at.get(step)
            self.append(step, old.step_row(i), dict(zip(SCALARS, old._S2[i])), old.hist[k] if k is not None else None)
        if old.noise is not None and len(old.noise):
            self.noise = NoiseSeries(self.n_layers, self.max_steps)
            self.noise.extend(old.noise.window().copy())
        carried = {k: v for k, v in old.meta.items() if k != "distributed"}
        self.meta = {**carried, **self.meta}

    # ----------------------------------------------------------------- the rolling window's history
    def _fold_into_history(self, old: "Run") -> None:
        """Fold evicted steps into ``history`` in blocks of ``history_block`` steps; when history
        outgrows ``history_capacity`` rows, merge neighbours and double the block."""
        if self.history is None:
            self.history = Run(self.layers, thresholds=self.thresholds)
            self._pending = None
        pend = old if self._pending is None else concat_rows(self._pending, old)
        k = self.history_block
        full = (pend.n_steps // k) * k
        if full:
            dec = pend._slice_rows(0, full).downsample_by(k)
            h = self.history
            for i in range(dec.n_steps):
                h.append(int(dec.steps[i]), dec.step_row(i), dict(zip(SCALARS, dec._S2[i])))
        self._pending = pend._slice_rows(full, pend.n_steps) if full < pend.n_steps else None
        if self.history.n_steps > self.history_capacity:
            self.history = self.history.downsample_by(2)
            self.history_block *= 2

    # ----------------------------------------------------------------- slicing / downsampling
    def _slice_rows(self, a: int, b: int) -> "Run":
        r = Run(self.layers, thresholds=self.thresholds, edges=self.edges, meta=self.meta)
        n = max(0, b - a)
        r._steps = self.steps[a:b].copy()
        r._metrics = self._M3[a:b].copy()
        r._nonfinite = self._NF[a:b].copy()
        r._scalars = self._S2[a:b].copy()
        r._n = r._cap = n
        if self._hn:
            lo, hi = (self.steps[a], self.steps[b - 1]) if n else (1, 0)
            m = (self.hist_steps >= lo) & (self.hist_steps <= hi)
            r._hist, r._hist_steps = self.hist[m].copy(), self.hist_steps[m].copy()
            r._hn = int(m.sum())
        if self.noise is not None and n:
            r.noise = self.noise.between(int(self.steps[a]), int(self.steps[b - 1]))
        return r

    def slice(self, steps: slice | None = None, layers: Sequence[int | str] | None = None) -> "Run":
        """A copy restricted to a range of step rows (a ``slice`` of rows, e.g. ``slice(-100, None)``)
        and/or a subset of layers (names or indices, kept in depth order)."""
        from .run_views import slice_run

        return slice_run(self, steps, layers)

    def downsample_by(self, k: int) -> "Run":
        """Fold every ``k`` consecutive steps into one (max for max |g| and non-finite, mean otherwise)."""
        from .run_views import downsample_by

        return downsample_by(self, check_count("k", k, 1))

    def merge_layers(self, groups: Sequence[Sequence[int]], names: Sequence[str]) -> "Run":
        """A run with one layer per group of this run's layers, each group measured as if its
        tensors were one (``run_views.merge_layers`` says how each metric combines)."""
        from .run_views import merge_layers

        return merge_layers(self, groups, names)

    def with_history(self) -> "Run":
        """This run with the decimated steps its rolling window folded into ``history`` in front,
        or the run itself when it has none (``run_views.with_history``)."""
        from .run_views import with_history

        return with_history(self)

    def downsample(self, max_steps: int) -> "Run":
        """A copy with at most ``max_steps`` rows."""
        max_steps = check_count("max_steps", max_steps, 1)
        run = self.snapshot()
        k = max(1, -(-run._n // max_steps))
        return run.downsample_by(k)

    # ----------------------------------------------------------------- tables
    def to_frame(self) -> "pd.DataFrame":
        """Long table: one row per (step, layer) with every metric and the original crate's flags."""
        from .run_views import to_frame

        return to_frame(self)

    def layers_frame(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame([info.to_dict() for info in self.layers])

    def nbytes(self) -> int:
        """Bytes held by the arrays (capacity included), history included."""
        b = self._steps.nbytes + self._metrics.nbytes + self._nonfinite.nbytes + self._scalars.nbytes
        b += self._hist.nbytes + self._hist_steps.nbytes
        return b + (self.history.nbytes() if self.history is not None else 0)

    def __repr__(self) -> str:
        r = self.snapshot()
        span = f"steps {int(r.steps[0])}..{int(r.steps[-1])}" if r._n else "empty"
        older = (
            r.history.n_steps + (r._pending.n_steps if r._pending is not None else 0) if r.history is not None else 0
        )
        more = f", {older} older rows in history" if older else ""
        return f"<Run {r.n_layers} layers, {r._n} steps ({span}), {r._hn} histograms{more}>"

    def save(self, path, overwrite: bool = False) -> None:
        """Write the run to a run directory (``load_run`` reads it back, history included)."""
        from .storage import save_run

        save_run(self, path, overwrite=overwrite)
