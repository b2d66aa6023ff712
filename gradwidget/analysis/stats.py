"""Per-layer statistics over the step history (the original crate's ``GradientStatistics``), vectorised.

Every function takes ``(steps, layers)`` arrays and reduces along axis 0 with NaN-aware numpy, so a
frozen layer (all NaN) or a metric measured only every few steps (``update_norm``) reads right.

Long runs: distribution statistics (moments, median, percentiles) are computed on at most
``max_rows`` evenly spaced recorded steps (exact when the run is shorter); extremes and counts that
one step can change (``max_abs`` max, non-finite totals, flag shares) are always exact (see
``exact_reductions``). These are statistics *of a metric's history* (e.g. the skewness of a layer's
gradient-norm series), not of the gradient's entries: the entries' distribution is ``run.hist``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..rules import over_threshold_mask, vanishing_flags
from ..run import METRICS, Run

#: statistics per (metric, layer), in column order.
STAT_NAMES = ("mean", "std", "variance", "median", "p5", "p95", "skewness", "kurtosis", "samples")
#: rows analysed at full resolution (distribution stats, flow characteristics) and the length of
#: the block-averaged copy used for trends, plateaus and correlations.
MAX_ROWS = 4096
#: evenly spaced steps the distribution statistics (moments, quantiles) are computed on.
STAT_ROWS = 2048
_TINY = np.finfo(np.float32).tiny


def fmt_num(x: float) -> str:
    """A number in evidence text: 3 significant digits, "n/a" when not finite."""
    return f"{x:.3g}" if np.isfinite(x) else "n/a"


def sample_rows(n: int, max_rows: int = MAX_ROWS) -> np.ndarray | slice:
    """Evenly spaced row indices (all rows when ``n <= max_rows``), always keeping the last row."""
    if n <= max_rows:
        return slice(None)
    return np.unique(np.linspace(0, n - 1, max_rows).round().astype(np.int64))


def block_mean(a: np.ndarray, max_rows: int = MAX_ROWS) -> tuple[np.ndarray, int]:
    """Average consecutive groups of rows so at most ``max_rows`` remain; NaN-aware. Returns the
    reduced array and the block length (rows per output row); a partial head block is dropped so
    the most recent steps are always whole."""
    n = a.shape[0]
    k = max(1, -(-n // max_rows))
    if k == 1:
        a = np.asarray(a, np.float64)
        return np.where(np.isfinite(a), a, np.nan), 1
    m = (n // k) * k
    out = np.empty((m // k,) + a.shape[1:], np.float64)
    per = max(1, (1 << 22) // max(1, k * int(np.prod(a.shape[1:]))))  # blocks per chunk: ~4M values
    with np.errstate(invalid="ignore"), _quiet():
        for i in range(0, m // k, per):  # chunks bound the temporary copies
            j = min(m // k, i + per)
            b = np.asarray(a[n - m + i * k : n - m + j * k]).reshape((j - i, k) + a.shape[1:])
            b = np.where(np.isfinite(b), b, np.float32(np.nan))
            out[i:j] = np.nanmean(b, axis=1, dtype=np.float64)
    return out, k


class _quiet:
    """Silence numpy's 'Mean of empty slice' warnings: all-NaN columns legitimately give NaN."""

    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def moments(x: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, std, variance, skewness, excess kurtosis and count of finite values per column
    (population moments, as the original crate). Zero-variance columns get skewness and kurtosis 0."""
    x = np.asarray(x, np.float64)
    x = np.where(np.isfinite(x), x, np.nan)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        n = np.sum(np.isfinite(x), axis=0)
        mean = np.nanmean(x, axis=0)
        d = x - mean
        d2 = d * d
        var = np.nanmean(d2, axis=0)
        skew = np.nanmean(d2 * d, axis=0) / var**1.5
        kurt = np.nanmean(d2 * d2, axis=0) / (var * var) - 3.0
    # a constant column (numerically: variance below float64 rounding of its mean) has no shape
    flat = ~(var > (np.abs(mean) * 1e-12) ** 2)
    var = np.where(flat & (n > 0), 0.0, var)
    skew = np.where(flat & (n > 0), 0.0, skew)
    kurt = np.where(flat & (n > 0), 0.0, kurt)
    return {"mean": mean, "std": np.sqrt(var), "variance": var, "skewness": skew, "kurtosis": kurt, "samples": n}


def quantiles(x: np.ndarray, qs=(0.05, 0.5, 0.95)) -> np.ndarray:
    """NaN-aware quantiles per column with linear interpolation, ``(len(qs), columns)``; one sort
    for all columns instead of ``np.nanpercentile``'s per-column loop."""
    x = np.asarray(x)
    x = np.where(np.isfinite(x), x, np.nan)
    s = np.sort(x, axis=0).astype(np.float64, copy=False)  # NaN sorts last; float32 input sorts as float32
    n = np.sum(np.isfinite(s), axis=0)
    out = np.full((len(qs), x.shape[1]), np.nan)
    ok = n > 0
    if not ok.any():
        return out
    for i, q in enumerate(qs):
        pos = q * (np.maximum(n, 1) - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        f = pos - lo
        a = np.take_along_axis(s, lo[None], 0)[0]
        b = np.take_along_axis(s, hi[None], 0)[0]
        out[i] = np.where(ok, a + (b - a) * f, np.nan)
    return out


def column_stats(x: np.ndarray) -> dict[str, np.ndarray]:
    """All of ``STAT_NAMES`` for each column of ``x``."""
    out = moments(x)
    p5, med, p95 = quantiles(x)
    out.update(median=med, p5=p5, p95=p95)
    return {k: out[k] for k in STAT_NAMES}


def layer_statistics(run: Run, metrics=METRICS, max_rows: int = STAT_ROWS) -> pd.DataFrame:
    """Long table: one row per (metric, layer) with ``STAT_NAMES`` over the recorded steps
    (on at most ``max_rows`` evenly spaced steps; see the module docstring)."""
    rows = sample_rows(run.n_steps, max_rows)
    names = np.array(run.layer_names, dtype=object)
    sample = run.block(rows)  # one gather for every metric
    parts = []
    for m in metrics:
        st = column_stats(run.metric(m)[rows] if m == "nonfinite" else sample[:, METRICS.index(m)])  # exact counts
        df = pd.DataFrame({"metric": m, "layer": names, **st})
        parts.append(df)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["metric", "layer", *STAT_NAMES])
    out["samples"] = out["samples"].astype(np.int64)
    return out


def dead_flags(zero_frac: np.ndarray, grad_norm: np.ndarray, t) -> np.ndarray:
    """A layer-step is dead when at least ``dead_zero_fraction`` of its gradient entries are exactly
    zero, or its gradient norm is exactly zero (also when the zero fraction was not recorded)."""
    with np.errstate(invalid="ignore"):
        return (zero_frac >= t.dead_zero_fraction) | (grad_norm == 0)


def _chunk_reductions(c: np.ndarray, nf: np.ndarray, t, k: int, with_coarse: bool) -> tuple:
    """The exact reductions of one contiguous chunk of rows ``(rows, metrics, layers)`` and its
    exact non-finite counts ``nf`` ``(rows, layers)``."""
    j = {m: i for i, m in enumerate(METRICS)}
    L = c.shape[2]
    with np.errstate(invalid="ignore", divide="ignore"):
        mx = c[:, j["max_abs"]]
        nfb = nf > 0
        cm = np.fmax.reduce(mx, axis=0)  # ignores NaN (no data); +inf marks a non-finite step
        bad = np.isposinf(cm)
        if bad.any():  # rare: recompute those columns without their non-finite steps
            sub = mx[:, bad]
            cm[bad] = np.where(np.isfinite(sub), sub, -np.inf).max(axis=0)
        nf_total = np.add.reduce(nf, axis=0, dtype=np.float64, where=nfb)  # no temporary
        nf_steps = np.count_nonzero(nfb, axis=0)
        van = np.count_nonzero(vanishing_flags(c[:, j["mean_abs"]], t), axis=0)
        expl = np.count_nonzero(over_threshold_mask(mx, t) | nfb, axis=0)
        g = c[:, j["grad_norm"]]
        dead = np.count_nonzero(dead_flags(c[:, j["zero_frac"]], g, t), axis=0)
        fin = np.isfinite(g)
        known = np.count_nonzero(fin | nfb, axis=0)
        coarse = None
        if with_coarse:
            f3 = fin.reshape(-1, k, L)
            total = np.add.reduce(g.reshape(-1, k, L), axis=1, dtype=np.float64, where=f3)
            cnt = np.count_nonzero(f3, axis=1)
            coarse = np.where(cnt > 0, total / np.maximum(cnt, 1), np.nan)
    return cm, nf_total, nf_steps, van, expl, dead, known, coarse


#: bytes of one metric's rows in a chunk of ``exact_reductions``: each temporary of a chunk (a mask, a
#: ``where``) is this size, so the dozen of them stay in cache (1 MiB: 0.31 s against 0.72 s for chunks
#: of 8,192 rows on 500 layers x 100,000 steps, bench/analysis.py; results identical).
CHUNK_BYTES = 1 << 20


def exact_reductions(
    run: Run, chunk: int | None = None, block: int = 0, threads: int = 2, movable: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Per-layer values one step can change, computed over every recorded step: the largest max |g|
    (inf when a step was non-finite; ``max_abs_finite`` ignores those), the total count of non-finite
    entries, and the share of steps each of the original crate's flags fired (vanishing, exploding, dead,
    non-finite). One pass over contiguous chunks of rows (``CHUNK_BYTES`` per metric, so a chunk's
    temporaries stay in cache), all reductions together (chunks spread over ``threads`` threads: numpy
    releases the GIL). The vanishing and dead shares count only on ``movable`` layers (trainable
    ones the loss can move, ``Run.cannot_move``; computed when not given). With ``block`` > 0 the
    same pass also returns
    ``coarse_grad_norm``: the gradient norm averaged over blocks of ``block`` steps aligned to the last
    step (finite values only; a partial first block is left out)."""
    t = run.thresholds
    L, n = run.n_layers, run.n_steps
    M, NF = run.block(), run.metric("nonfinite")
    k = max(1, block)
    head = n - (n // k) * k if block else n
    if chunk is None:
        chunk = CHUNK_BYTES // (4 * max(1, L))
    chunk = max(k, (chunk // k) * k)
    bounds = ([(0, head)] if head else []) + [(a, min(n, a + chunk)) for a in range(head, n, chunk)]

    def work(ab):
        a, b = ab
        return _chunk_reductions(M[a:b], NF[a:b], t, k, bool(block) and a >= head)

    if threads > 1 and len(bounds) > 2:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(work, bounds))
    else:
        parts = [work(ab) for ab in bounds]
    mx_max = np.full(L, -np.inf)
    for p in parts:
        np.fmax(mx_max, p[0], out=mx_max)
    nf_total, nf_steps, van, expl, dead, known = (
        sum((p[i] for p in parts), np.zeros(L, np.float64 if i == 1 else np.int64)) for i in range(1, 7)
    )
    if movable is None:
        movable = run.trainable_mask() & ~run.cannot_move()
    d = max(n, 1)
    finite_max = np.where(mx_max > -np.inf, mx_max, np.nan)
    out = {
        "max_abs_max": np.where(nf_steps > 0, np.inf, finite_max),
        "max_abs_finite": finite_max,
        "nonfinite_total": nf_total,
        "nonfinite_share": nf_steps / d,
        "vanishing_share": van / d * movable,
        "exploding_share": expl / d,
        "dead_share": dead / d * movable,
        "known_steps": known,
    }
    if block:
        cs = [p[7] for p in parts if p[7] is not None]
        out["coarse_grad_norm"] = np.concatenate(cs) if cs else np.empty((0, L))
    return out


def trailing_median(y: np.ndarray, w: int) -> np.ndarray:
    """Median of each row and the (up to) ``w - 1`` rows before it, along axis 0. A NaN is filled
    with its column's median first, so a missing step does not empty a window (and the fast,
    partition-based median applies)."""
    if y.shape[0] == 0 or w <= 1:
        return y.copy()
    y = np.asarray(y, np.float64)
    if np.isnan(y).any():
        with _quiet():
            fill = np.nanmedian(y, axis=0)
        y = np.where(np.isnan(y), fill, y)
    out = np.empty_like(y)
    head = min(w - 1, y.shape[0])
    for k in range(head):  # the first rows: the median of what came so far
        out[k] = np.median(y[: k + 1], axis=0)
    if y.shape[0] >= w:  # each window sorted (w is small), in chunks of rows: no copy of the whole view
        v = np.lib.stride_tricks.sliding_window_view(y, w, axis=0)
        rows = max(1, (1 << 22) // max(1, v.shape[1] * w))
        for a in range(0, v.shape[0], rows):
            srt = np.sort(v[a : a + rows], axis=-1)
            out[w - 1 + a : w - 1 + a + srt.shape[0]] = 0.5 * (srt[..., (w - 1) // 2] + srt[..., w // 2])
    return out


def nanmedian(x: np.ndarray, axis: int = 0) -> Any:
    """Median ignoring NaN/Inf; one sort (``np.nanmedian`` loops per column when NaNs are present).
    A float for 1-d ``x``, an array otherwise (typed Any: the type depends on ``x.ndim``)."""
    x = np.asarray(x, np.float64)
    if x.ndim == 1:
        return float(quantiles(x[:, None], (0.5,))[0, 0])
    if axis == 1:
        x = x.T
    return quantiles(x, (0.5,))[0]


def update_ratio_rows(run: Run, max_rows: int = MAX_ROWS) -> np.ndarray:
    """``update_norm / weight_norm`` per step and layer over the most recent ``2 * max_rows`` steps,
    keeping only steps where an update was measured (update_norm is measured every few steps); inf
    where the update or the weight norm overflowed."""
    c = run.block(slice(max(0, run.n_steps - 2 * max_rows), None))
    u, w = c[:, METRICS.index("update_norm")], c[:, METRICS.index("weight_norm")]
    rows = ~np.isnan(u).all(axis=1) | np.isinf(w).any(axis=1)  # the others are all NaN: dropped below
    u, w = u[rows].astype(np.float64), w[rows].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(w > 0, u / w, np.nan)
    r = np.where(np.isinf(u) | np.isinf(w), np.inf, r)  # an overflowed update or weight: not "no drift"
    return r[~np.isnan(r).all(axis=1)]


def lstsq_slope(y: np.ndarray, x: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope of each column of ``y`` against ``x`` (row index when None), ignoring
    non-finite entries; also the fit's R^2 (share of variance the line explains). Columns with fewer
    than 3 finite points get NaN."""
    y = np.asarray(y, np.float64)
    n_rows = y.shape[0]
    x = np.arange(n_rows, dtype=np.float64) if x is None else np.asarray(x, np.float64)
    xx = x.reshape((-1,) + (1,) * (y.ndim - 1))
    ok = np.isfinite(y)
    w = ok.astype(np.float64)
    yz = np.where(ok, y, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = w.sum(0)
        sx, sy = (w * xx).sum(0), yz.sum(0)
        sxx, sxy, syy = (w * xx * xx).sum(0), (yz * xx).sum(0), (yz * yz).sum(0)
        den = n * sxx - sx * sx
        slope = (n * sxy - sx * sy) / den
        vy = n * syy - sy * sy
        r2 = np.where(vy > 0, (n * sxy - sx * sy) ** 2 / (den * vy), 1.0)
    bad = (n < 3) | ~(den > 0)
    return np.where(bad, np.nan, slope), np.where(bad, np.nan, np.clip(r2, 0.0, 1.0))


def log10_pos(x: np.ndarray) -> np.ndarray:
    """log10 of a non-negative series with exact zeros mapped to log10(float32 tiny) (~ -38),
    so a dead layer is a constant, very low line rather than -inf."""
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, np.log10(np.maximum(x, _TINY)), np.where(x == 0, np.log10(_TINY), np.nan))


def standardized(x: np.ndarray, flat: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Columns centred and scaled to unit length (so ``z.T @ z`` is the Pearson correlation matrix),
    NaN treated as the column mean, and a mask of the columns that vary (root sum of squares of the
    deviations above ``flat``; constant columns, up to rounding, get z = 0)."""
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        x = x - np.nanmean(x, axis=0)
        x = np.where(np.isfinite(x), x, 0.0)
        sd = np.sqrt(np.sum(x * x, axis=0))
        ok = sd > flat
        return np.where(ok, x / np.where(ok, sd, 1), 0.0), ok


def runs_of_true(flags: np.ndarray) -> list[tuple[int, int]]:
    """Half-open ``(start, stop)`` index ranges of consecutive True values in a 1-D array."""
    f = np.concatenate([[False], np.asarray(flags, bool), [False]]).astype(np.int8)
    d = np.diff(f)
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def trailing_true(flags: np.ndarray) -> np.ndarray:
    """Per column of a ``(rows, columns)`` boolean array, how many rows at the end are all True."""
    f = np.asarray(flags, bool)
    if f.ndim == 1:
        f = f[:, None]
    n = f.shape[0]
    false_rows = np.where(~f, np.arange(n)[:, None], -1)
    return n - 1 - false_rows.max(axis=0)


class Series:
    """The views of a Run every analysis shares, computed once.

    ``recent``: the last ``max_rows`` recorded steps of gradient norm at full resolution (local
    properties: consistency, oscillation, direction). ``coarse`` / ``coarse_steps``: log10 gradient
    norm of the whole run block-averaged to at most ``max_rows`` rows (trends, plateaus,
    correlations), with ``block`` recorded steps per row.
    """

    def __init__(self, run: Run, max_rows: int = MAX_ROWS):
        self.run, self.max_rows = run, max_rows
        n = run.n_steps
        g = run.metric("grad_norm")
        rec = np.asarray(g[max(0, n - max_rows) :], np.float64)
        self.recent = np.where(np.isfinite(rec), rec, np.nan)  # non-finite steps are counted apart
        self.recent_steps = run.steps[max(0, n - max_rows) :]
        self.block = max(1, -(-n // max_rows))
        self.trainable = run.trainable_mask()
        #: per layer: a parameter the loss cannot move (``Run.cannot_move``): no symptom is read off it
        self.cannot_move = run.cannot_move()
        self.exact = exact_reductions(run, block=self.block, movable=self.trainable & ~self.cannot_move)
        self._stats: pd.DataFrame | None = None
        self._metric_stats: dict[str, dict[str, np.ndarray]] = {}
        self.coarse = log10_pos(self.exact.pop("coarse_grad_norm"))
        m = (n // self.block) * self.block
        self.coarse_steps = run.steps[n - m :][:: self.block] if n else run.steps
        self._update_ratio: np.ndarray | None = None
        self._update_rows: np.ndarray | None = None
        self._rms: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def update_rows(self) -> np.ndarray:
        """``update_ratio_rows(run)``, computed once."""
        if self._update_rows is None:
            self._update_rows = update_ratio_rows(self.run, self.max_rows)
        return self._update_rows

    @property
    def stats(self) -> pd.DataFrame:
        """``layer_statistics(run)``: every metric's statistics per layer, computed on first use
        (the health table reads three metrics through ``stat``, not this table)."""
        if self._stats is None:
            self._stats = layer_statistics(self.run, max_rows=min(self.max_rows, STAT_ROWS))
        return self._stats

    def stat(self, metric: str, name: str) -> np.ndarray:
        """One statistic of one metric for every layer, in depth order (the same sample of steps
        as ``stats``), computed once per metric."""
        if metric not in self._metric_stats:
            rows = sample_rows(self.run.n_steps, min(self.max_rows, STAT_ROWS))
            self._metric_stats[metric] = column_stats(self.run.metric(metric)[rows])
        return self._metric_stats[metric][name]


def trend_fit(y: np.ndarray, window: int, x: np.ndarray | None = None) -> tuple[float, float, float, int]:
    """Least-squares slope of ln y per unit of ``x`` (user steps; the point index when None) over the
    last ``window`` finite positive points, its standard error, R^2, and the number of points. The
    standard error is widened for autocorrelated residuals (a gradient norm's noise is not
    independent from step to step) by sqrt((1 + r) / (1 - r)) with r the residuals' lag-1
    autocorrelation clipped to [0, 0.95]."""
    y = np.asarray(y, np.float64)
    ok = np.isfinite(y) & (y > 0)
    x = (np.arange(y.size, dtype=np.float64) if x is None else np.asarray(x, np.float64))[ok][-window:]
    y = np.log(y[ok][-window:])
    n = y.size
    if n < 3:
        return float("nan"), float("nan"), float("nan"), n
    x = x - x.mean()
    sxx = float(x @ x)
    if not sxx > 0:
        return float("nan"), float("nan"), float("nan"), n
    slope = float(x @ (y - y.mean())) / sxx
    e = y - y.mean() - slope * x
    sse, syy = float(e @ e), float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sse / syy if syy > 0 else 1.0
    r = float(e[1:] @ e[:-1]) / sse if sse > 0 else 0.0
    r = min(max(r, 0.0), 0.95)
    se = np.sqrt(sse / max(n - 2, 1) / sxx * (1 + r) / (1 - r))
    return slope, float(se), float(min(max(r2, 0.0), 1.0)), n
