"""Appending to a Run's store: one step's row (and histogram) at a time into arrays that grow in place
(amortised O(1) per step), and the rolling window that drops its oldest steps into ``history``.
A mixin of ``Run``; what it reads of the Run is declared below for the type checker only.

Readers on other threads (a panel, ``analyze(rec.run)`` while training runs in a thread) read
``Run.snapshot()``: views of these arrays bounded by the last complete step, taken under the lock
every change holds. So rows a snapshot can see are never written again: new rows go after them,
and making room (growing, or sliding a rolling window back to row 0) fills new arrays, never the
old ones in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .schema import METRICS, N_BINS, NONFINITE_ROW, SCALARS, _as_step, scalar_row

if TYPE_CHECKING:
    import threading

    from .run import Run

#: the store grows by 1/GROWTH_DIVISOR of what it holds when full: at most that much allocated and
#: unused, and while it grows the old and new arrays coexist (2.25x the data for a moment; doubling
#: held 1.6x at rest and 3x while copying). Still amortised O(1) per step.
GROWTH_DIVISOR = 4


class RunAppend:
    if TYPE_CHECKING:
        max_steps: int | None
        version: int
        _lock: threading.Lock
        _open: bool
        _frozen: bool
        _n: int
        _s: int
        _cap: int
        _steps: np.ndarray
        _metrics: np.ndarray
        _nonfinite: np.ndarray
        _scalars: np.ndarray
        _hn: int
        _hs: int
        _hist_steps: np.ndarray
        _hist: np.ndarray

        @property
        def n_layers(self) -> int: ...
        @property
        def steps(self) -> np.ndarray: ...
        @property
        def _M3(self) -> np.ndarray: ...
        @property
        def _NF(self) -> np.ndarray: ...
        @property
        def _S2(self) -> np.ndarray: ...
        @property
        def hist_steps(self) -> np.ndarray: ...
        @property
        def hist(self) -> np.ndarray: ...
        def _slice_rows(self, a: int, b: int) -> Run: ...
        def _fold_into_history(self, old: Run) -> None: ...

    def _grow(self, need: int) -> None:
        """Make room for ``need`` rows after the window start: slide the window back to row 0 of new
        arrays of the same size when it reaches the end (amortised O(1) per step), grow when that is
        not enough. Never in place: a snapshot may be reading the old rows (module docstring)."""
        if self._s + need <= self._cap:
            return
        if self._s and need <= self._cap:
            cap = self._cap
        else:
            cap = max(16, need + need // GROWTH_DIVISOR, need)
            if self.max_steps is not None:
                cap = min(cap, 2 * self.max_steps)
                cap = max(cap, need)
        L = self.n_layers
        # rows past the window are never read (every reader slices ``[s, s + n)``, and ``append``
        # writes a whole row before counting it): no fill of the new capacity (what an append costs:
        # docs/costs.md)
        steps = np.empty(cap, np.int64)
        mets = np.empty((cap, len(METRICS), L), np.float32)
        nf = np.empty((cap, L), np.float64)
        sc = np.empty((cap, len(SCALARS)), np.float64)
        steps[: self._n] = self.steps
        mets[: self._n] = self._M3
        nf[: self._n] = self._NF
        sc[: self._n] = self._S2
        self._steps, self._metrics, self._nonfinite, self._scalars = steps, mets, nf, sc
        self._cap, self._s = cap, 0

    def append(
        self,
        step: int,
        values: np.ndarray,
        scalars: dict | None = None,
        hist: np.ndarray | None = None,
        complete: bool = True,
    ) -> None:
        """Add one step. ``values`` is ``(len(METRICS), layers)`` (float64 keeps the non-finite counts
        exact; the other metrics are stored as float32); ``hist`` is ``(layers, N_BINS)`` counts.
        ``complete=False``: the row is still being filled (the update norms ``optimizer.step()``
        makes); snapshots leave it out until ``complete_last()`` or the next append."""
        if self._frozen:
            raise ValueError("a snapshot of a run is read-only: append to the run it was taken from")
        values = np.asarray(values, np.float64)
        if values.shape != (len(METRICS), self.n_layers):
            raise ValueError(f"values must have shape {(len(METRICS), self.n_layers)}, got {values.shape}")
        step = _as_step(step)
        if self._n and step <= self.steps[-1]:
            raise ValueError(f"steps must increase: got step {step} after step {int(self.steps[-1])}")
        row = scalar_row(scalars)  # checked before anything changes: a rejected step leaves no trace
        if hist is not None:
            hist = self._checked_hist(hist)
        with self._lock:
            if self.max_steps is not None and self._n >= self.max_steps:
                self._evict(self._n - self.max_steps + 1)
            self._grow(self._n + 1)
            i = self._s + self._n
            self._steps[i] = step
            with np.errstate(over="ignore"):  # beyond float32's range: inf, as a float32 statistic is
                self._metrics[i] = values
            self._nonfinite[i] = values[NONFINITE_ROW]  # kept once, exact: its float32 slot is NaN
            self._metrics[i, NONFINITE_ROW] = np.nan
            self._scalars[i] = row
            self._n += 1
            self._open = not complete
            if hist is not None:
                self._put_hist(step, hist)
            self.version += 1

    def set_last(self, metric: int, cols: np.ndarray, values: np.ndarray) -> None:
        """Fill metric row ``metric`` (its index in METRICS) of the newest step at layer columns
        ``cols``: only while that step is still open (``append(..., complete=False)``)."""
        if not self._open:
            raise ValueError("only a step appended with complete=False can still be filled in")
        i = self._s + self._n - 1
        if metric == NONFINITE_ROW:
            self._nonfinite[i, cols] = values
            return
        with np.errstate(over="ignore"):
            self._metrics[i, metric, cols] = values

    def complete_last(self) -> None:
        """The newest step is complete: snapshots taken from now on include it."""
        with self._lock:
            self._open = False
            self.version += 1

    def append_hist(self, step: int, hist: np.ndarray) -> None:
        if self._frozen:
            raise ValueError("a snapshot of a run is read-only: append to the run it was taken from")
        hist = self._checked_hist(hist)
        with self._lock:
            self._put_hist(step, hist)

    def _checked_hist(self, hist: np.ndarray) -> np.ndarray:
        hist = np.asarray(hist)
        if hist.shape != (self.n_layers, N_BINS):
            raise ValueError(f"hist must have shape {(self.n_layers, N_BINS)}, got {hist.shape}")
        if hist.dtype.kind != "u" and hist.size and not (hist >= 0).all():
            raise ValueError("hist must hold counts (numbers >= 0): a negative or NaN count is no count")
        return hist

    def _put_hist(self, step: int, hist: np.ndarray) -> None:
        if self._hs + self._hn == self._hist.shape[0]:
            # slide back to row 0 of new arrays of the same size if at least half the buffer is
            # free, else grow (amortised O(1)); never in place (a snapshot may read the old rows)
            if self._hs >= self._hist.shape[0] // 2 and self._hs:
                cap = self._hist.shape[0]
            else:
                cap = max(8, self._hn + 1 + self._hn // GROWTH_DIVISOR)
            h = np.zeros((cap, self.n_layers, N_BINS), np.uint64)
            hs = np.zeros(cap, np.int64)
            h[: self._hn], hs[: self._hn] = self.hist, self.hist_steps
            self._hist, self._hist_steps, self._hs = h, hs, 0
        self._hist[self._hs + self._hn] = hist
        self._hist_steps[self._hs + self._hn] = int(step)
        self._hn += 1
        self.version += 1

    def _evict(self, k: int) -> None:
        """Drop the ``k`` oldest steps, folding them into ``history``; drop their histograms."""
        old = self._slice_rows(0, k)
        self._fold_into_history(old)
        self._s += k
        self._n -= k
        if self._hn:
            drop = int(np.searchsorted(self.hist_steps, self.steps[0]))  # histogram steps are sorted
            self._hs += drop
            self._hn -= drop
