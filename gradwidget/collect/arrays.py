"""Framework-agnostic recording: ``record(step, {name: array})`` for numpy, JAX, anything array-like.

The original crate's ``record_step``: per layer mean |g|, max |g|, L2 norm, flags against the thresholds and
``flow_intensity`` (see Run), plus the rest of the Run's metrics, a rolling window (``max_steps``)
and, optionally, a run directory written as it goes (``log_dir``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from .._args import check_bool
from ..run import HIST_LOG2_LO, METRICS, N_BINS, LayerInfo, Run, check_max_steps
from ..thresholds import as_thresholds

if TYPE_CHECKING:
    from ..storage import RunWriter


def log_hist(a: np.ndarray) -> np.ndarray:
    """Counts of |a| in the Run's octave bins (bin k holds 2**(LO+k) <= |a| < 2**(LO+k+1)); zeros and
    non-finite entries are not counted (they have their own metrics); values beyond the range land
    in the edge bins."""
    a = np.abs(np.asarray(a, dtype=np.float64))
    a = a[np.isfinite(a) & (a > 0)]
    if a.size == 0:
        return np.zeros(N_BINS, np.uint64)
    _, e = np.frexp(a)  # a = m * 2**e with 0.5 <= m < 1, so floor(log2 a) = e - 1
    idx = np.clip(e.astype(np.int64) - 1 - HIST_LOG2_LO, 0, N_BINS - 1)
    return np.bincount(idx, minlength=N_BINS).astype(np.uint64)


def array_stats(g: np.ndarray, w: np.ndarray | None = None, prev_w: np.ndarray | None = None) -> np.ndarray:
    """One column of the Run's metrics (order: METRICS) from a gradient array and, optionally,
    the weights and the previous step's weights (for the update norm)."""
    g = np.asarray(g, dtype=np.float64).ravel()
    out = np.full(len(METRICS), np.nan)
    n = g.size
    if n:
        finite = np.isfinite(g)
        nonfinite = n - int(finite.sum())
        gf = g if nonfinite == 0 else np.where(finite, g, np.nan)
        a = np.abs(g)
        out[METRICS.index("grad_norm")] = np.sqrt(np.dot(g, g)) if nonfinite == 0 else np.inf
        out[METRICS.index("mean_abs")] = a.mean() if nonfinite == 0 else np.nan
        out[METRICS.index("max_abs")] = a.max() if nonfinite == 0 else np.inf
        out[METRICS.index("std")] = gf.std() if nonfinite == 0 else np.nan
        out[METRICS.index("zero_frac")] = float((g == 0).sum()) / n
        out[METRICS.index("nonfinite")] = nonfinite
    if w is not None:
        wv = np.asarray(w, dtype=np.float64).ravel()
        out[METRICS.index("weight_norm")] = np.sqrt(np.dot(wv, wv))
        if prev_w is not None and prev_w.shape == wv.shape:
            d = wv - prev_w
            out[METRICS.index("update_norm")] = np.sqrt(np.dot(d, d))
    return out


def _to_numpy(x, what: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - report any conversion failure plainly
        raise TypeError(f"{what} cannot be converted to an array: {e}") from None
    if not np.issubdtype(a.dtype, np.number):
        raise TypeError(f"{what} must be numeric, got dtype {a.dtype}")
    if np.iscomplexobj(a):  # its norms and histogram would silently drop the imaginary part
        raise TypeError(
            f"{what} is complex ({a.dtype}); gradwidget records real arrays: pass np.abs() "
            "of it, or its real and imaginary parts as two layers"
        )
    return a


def _check_options(max_steps, histogram_every) -> None:
    """Refuse bad recorder options at construction, not at the first record() call."""
    check_max_steps(max_steps)
    if histogram_every is not None and (
        isinstance(histogram_every, bool) or not isinstance(histogram_every, int) or histogram_every < 0
    ):
        raise ValueError(
            f"histogram_every must be a non-negative int (0 turns histograms off), got {histogram_every!r}"
        )


class ArrayRecorder:
    """Record per-layer gradient arrays step by step into a Run.

    ``record(step, {name: grad}, weights={name: w}, loss=...)``. The first call fixes the layers
    (in the order given); later calls must give the same names with the same shapes.
    """

    def __init__(
        self,
        *,
        max_steps: int | None = None,
        histogram_every: int = 10,
        thresholds=None,
        log_dir=None,
        overwrite: bool = False,
    ) -> None:
        _check_options(max_steps, histogram_every)
        check_bool("overwrite", overwrite)
        if log_dir is not None:
            from ..storage import check_log_dir

            check_log_dir(log_dir, overwrite)
        self.max_steps = max_steps
        self.histogram_every = histogram_every or 0
        self.thresholds = as_thresholds(thresholds)
        self.log_dir, self._overwrite = log_dir, overwrite
        self.run: Run | None = None
        self._shapes: dict[str, tuple] = {}
        self._prev_w: dict[str, np.ndarray] = {}
        self._writer: RunWriter | None = None
        self._count = 0

    def _start(self, gradients: Mapping) -> None:
        layers, shapes = [], {}
        for name, g in gradients.items():
            a = _to_numpy(g, f"gradient {name!r}")
            shapes[name] = a.shape
            layers.append(
                LayerInfo(
                    name=str(name),
                    shape=tuple(a.shape),
                    numel=int(a.size),
                    dtype=str(a.dtype),
                    backward_index=-1,
                    status="trainable",
                )
            )
        run = Run(layers, thresholds=self.thresholds, max_steps=self.max_steps)
        if self.log_dir is not None:  # before taking the run: a refused folder must fail every call
            from ..storage import RunWriter

            self._writer = RunWriter(self.log_dir, run, overwrite=self._overwrite)
        self.run, self._shapes = run, shapes

    def record(self, step: int, gradients: Mapping, weights: Mapping | None = None, loss=None, lr=None) -> None:
        if not isinstance(gradients, Mapping) or not gradients:
            raise TypeError("gradients must be a non-empty dict {layer name: array}")
        if weights is not None and not isinstance(weights, Mapping):
            raise TypeError("weights must be a dict {layer name: array} or None")
        if self.run is None:
            self._start(gradients)
        names = list(self._shapes)
        missing = [n for n in names if n not in gradients]
        extra = [n for n in gradients if n not in self._shapes]
        if missing or extra:
            raise ValueError(
                f"record() got different layers than the first step: missing {missing}, unexpected {extra}"
            )
        cols = np.empty((len(METRICS), len(names)))
        hist_now = self.histogram_every and self._count % self.histogram_every == 0
        hist = np.zeros((len(names), N_BINS), np.uint64) if hist_now else None
        new_w = {}  # kept only once the step is recorded: a rejected call must not move the baseline
        for j, n in enumerate(names):
            g = _to_numpy(gradients[n], f"gradient {n!r}")
            if g.shape != self._shapes[n]:
                raise ValueError(
                    f"gradient {n!r} has shape {g.shape}, expected {self._shapes[n]} (as in the first recorded step)"
                )
            w = None
            if weights is not None and n in weights:
                w = _to_numpy(weights[n], f"weight {n!r}").astype(np.float64).ravel()
                if w.size != g.size:
                    raise ValueError(f"weight {n!r} has {w.size} entries but its gradient has {g.size}")
            cols[:, j] = array_stats(g, w, self._prev_w.get(n))
            if w is not None:
                new_w[n] = w
            if hist is not None:
                hist[j] = log_hist(g.ravel())
        gn = cols[METRICS.index("grad_norm")]
        scalars = {"loss": loss, "lr": lr, "global_norm": float(np.sqrt(np.sum(gn.astype(np.float64) ** 2)))}
        assert self.run is not None  # made above, on the first step
        self.run.append(step, cols, scalars, hist)
        self._prev_w.update(new_w)
        self._count += 1
        if self._writer is not None:
            self._writer.append_new()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def record(recorder: ArrayRecorder, step: int, gradients: Mapping, **kw) -> None:
    """Functional spelling of ``recorder.record(...)``."""
    recorder.record(step, gradients, **kw)
