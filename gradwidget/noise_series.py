"""The gradient-noise series a Run holds (``run.noise``): per step, the squared norms of the gradient
at two batch sizes, the raw material of the gradient noise scale (McCandlish et al. 2018, appendix A;
``analysis/noise_scale.py`` turns them into estimates).

A row is one optimizer step that saw its gradient at two batch sizes: ``n_small`` gradients of
``b_small`` examples each (the micro-batches of gradient accumulation, or one rank's share under
DDP) and their sum or mean, the gradient of ``b_big`` examples. Per layer it keeps the mean over the
small gradients of their squared L2 norm (``small_sq``) and the squared L2 norm of the big one
(``big_sq``), both in the units of one small gradient (the big gradient is the sum of the increments
divided by their number), so a loss divided by the number of micro-batches or not, and a loss
scale applied to every backward, cancel out of every ratio. Float32 per layer; the totals over the
layers are summed in float64 before that (``small_total``, ``big_total``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the scalar fields of a noise row, in record order (then ``small_sq`` and ``big_sq``, per layer)
NOISE_SCALARS: tuple[str, ...] = ("b_small", "b_big", "n_small", "small_total", "big_total")

#: fewest rows a finding about the batch size rests on (``analysis.causes._batch_size``); the
#: Recorder's probe takes this many at consecutive recorded steps before it thins out to its
#: cadence (``collect._noise``), so the first estimate never waits for the cadence
NOISE_MIN_ROWS = 10


def noise_dtype(n_layers: int) -> np.dtype:
    """The record of one noise row (``noise.bin`` in a run directory, docs/run-format.md)."""
    fields: list[tuple] = [("step", "<i8")] + [(s, "<f8") for s in NOISE_SCALARS]
    fields += [("small_sq", "<f4", (n_layers,)), ("big_sq", "<f4", (n_layers,))]
    return np.dtype(fields)


class NoiseSeries:
    """Rows of ``noise_dtype(n_layers)``, appended in step order, at most ``max_rows`` kept (the
    oldest dropped first; None keeps every row)."""

    def __init__(self, n_layers: int, max_rows: int | None = None) -> None:
        self.n_layers = int(n_layers)
        self.max_rows = max_rows
        self._rows = np.zeros(0, noise_dtype(self.n_layers))
        self._n = 0

    @property
    def rows(self) -> np.ndarray:
        """The kept rows (a structured array: ``step``, ``NOISE_SCALARS``, ``small_sq``, ``big_sq``)."""
        return self._rows[: self._n]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, field: str) -> np.ndarray:
        return self.rows[field]

    def append(
        self, step: int, b_small: float, b_big: float, n_small: int, small_sq: np.ndarray, big_sq: np.ndarray
    ) -> None:
        """Add one step's row; ``small_sq``/``big_sq`` are per layer (float64 in, totals taken first)."""
        small_sq, big_sq = np.asarray(small_sq, np.float64), np.asarray(big_sq, np.float64)
        if small_sq.shape != (self.n_layers,) or big_sq.shape != (self.n_layers,):
            raise ValueError(f"a noise row needs {self.n_layers} values per layer, got {small_sq.shape}")
        rec: Any = np.zeros(1, self._rows.dtype)
        rec["step"], rec["b_small"], rec["b_big"], rec["n_small"] = step, b_small, b_big, n_small
        rec["small_total"], rec["big_total"] = np.nansum(small_sq), np.nansum(big_sq)
        rec["small_sq"], rec["big_sq"] = small_sq, big_sq
        self.extend(rec)

    def extend(self, recs: np.ndarray) -> None:
        """Add whole records (``noise_dtype``), e.g. read back from ``noise.bin``."""
        if not len(recs):
            return
        need = self._n + len(recs)
        if need > len(self._rows):
            grown = np.zeros(max(need, 2 * len(self._rows), 16), self._rows.dtype)
            grown[: self._n] = self._rows[: self._n]
            self._rows = grown
        self._rows[self._n : need] = recs
        self._n = need
        if self.max_rows is not None and self._n > 2 * self.max_rows:  # drop the oldest, amortised
            keep = self._rows[self._n - self.max_rows : self._n].copy()
            self._rows, self._n = keep, len(keep)

    def window(self) -> np.ndarray:
        """The rows of the window (at most ``max_rows``, the newest)."""
        rows = self.rows
        return rows if self.max_rows is None else rows[-self.max_rows :]

    def between(self, lo: int, hi: int) -> "NoiseSeries":
        """A copy holding the rows of steps ``lo`` to ``hi`` (a slice of the run)."""
        out = NoiseSeries(self.n_layers, self.max_rows)
        rows = self.rows
        out.extend(rows[(rows["step"] >= lo) & (rows["step"] <= hi)].copy())
        return out

    def select_layers(self, cols) -> "NoiseSeries":
        """A copy with only the layer columns ``cols`` (totals summed again over them)."""
        cols = np.asarray(cols, np.int64)
        out = NoiseSeries(len(cols), self.max_rows)
        rows = self.rows
        rec: Any = np.zeros(len(rows), noise_dtype(len(cols)))
        for f in ("step", "b_small", "b_big", "n_small"):
            rec[f] = rows[f]
        rec["small_sq"], rec["big_sq"] = rows["small_sq"][:, cols], rows["big_sq"][:, cols]
        rec["small_total"] = np.nansum(rows["small_sq"][:, cols].astype(np.float64), axis=1)
        rec["big_total"] = np.nansum(rows["big_sq"][:, cols].astype(np.float64), axis=1)
        out.extend(rec)
        return out

    def __repr__(self) -> str:
        return f"<NoiseSeries {self._n} rows x {self.n_layers} layers>"
