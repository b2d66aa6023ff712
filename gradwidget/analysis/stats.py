"""Per-layer statistics over the step history (seed 000 ``GradientStatistics``), vectorised.

Every function takes ``(steps, layers)`` arrays and reduces along axis 0 with NaN-aware numpy, so a
frozen layer (all NaN) or a metric measured only every few steps (``update_norm``) reads right.

Long runs: distribution statistics (moments, median, percentiles) are computed on at most
``max_rows`` evenly spaced recorded steps (exact when the run is shorter); extremes and counts that
one step can change (``max_abs`` max, non-finite totals, flag shares) are always exact (see
``exact_reductions``). These are statistics *of a metric's history* (e.g. the skewness of a layer's
gradient-norm series), not of the gradient's entries: the entries' distribution is ``run.hist``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..run import METRICS, Run

#: statistics per (metric, layer), in column order.
STAT_NAMES = ("mean", "std", "variance", "median", "p5", "p95", "skewness", "kurtosis", "samples")
#: rows analysed at full resolution (distribution stats, flow characteristics) and the length of
#: the block-averaged copy used for trends, plateaus and correlations.
MAX_ROWS = 4096
_TINY = np.finfo(np.float32).tiny


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
    b = np.asarray(a[n - m:], np.float32).reshape((m // k, k) + a.shape[1:])
    b = np.where(np.isfinite(b), b, np.float32(np.nan))
    with np.errstate(invalid="ignore"), _quiet():
        return np.nanmean(b, axis=1, dtype=np.float64), k


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
    (population moments, as the seed). Zero-variance columns get skewness and kurtosis 0."""
    x = np.asarray(x, np.float64)
    x = np.where(np.isfinite(x), x, np.nan)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        n = np.sum(np.isfinite(x), axis=0)
        mean = np.nanmean(x, axis=0)
        d = x - mean
        d2 = d * d
        var = np.nanmean(d2, axis=0)
        skew = np.nanmean(d2 * d, axis=0) / var ** 1.5
        kurt = np.nanmean(d2 * d2, axis=0) / (var * var) - 3.0
    # a constant column (numerically: variance below float64 rounding of its mean) has no shape
    flat = ~(var > (np.abs(mean) * 1e-12) ** 2)
    skew = np.where(flat & (n > 0), 0.0, skew)
    kurt = np.where(flat & (n > 0), 0.0, kurt)
    return {"mean": mean, "std": np.sqrt(var), "variance": var, "skewness": skew, "kurtosis": kurt,
            "samples": n}


def quantiles(x: np.ndarray, qs=(0.05, 0.5, 0.95)) -> np.ndarray:
    """NaN-aware quantiles per column with linear interpolation, ``(len(qs), columns)``; one sort
    for all columns instead of ``np.nanpercentile``'s per-column loop."""
    x = np.asarray(x, np.float64)
    x = np.where(np.isfinite(x), x, np.nan)
    s = np.sort(x, axis=0)  # NaN sorts last
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


def layer_statistics(run: Run, metrics=METRICS, max_rows: int = MAX_ROWS) -> pd.DataFrame:
    """Long table: one row per (metric, layer) with ``STAT_NAMES`` over the recorded steps
    (on at most ``max_rows`` evenly spaced steps; see the module docstring)."""
    rows = sample_rows(run.n_steps, max_rows)
    names = np.array(run.layer_names, dtype=object)
    parts = []
    for m in metrics:
        st = column_stats(run.metric(m)[rows])
        df = pd.DataFrame({"metric": m, "layer": names, **st})
        parts.append(df)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["metric", "layer", *STAT_NAMES])
    out["samples"] = out["samples"].astype(np.int64)
    return out


def exact_reductions(run: Run) -> dict[str, np.ndarray]:
    """Per-layer values one step can change, computed over every recorded step: the largest max |g|,
    the total count of non-finite entries, and the share of steps each seed flag fired
    (vanishing, exploding, dead, non-finite)."""
    t = run.thresholds
    with _quiet(), np.errstate(invalid="ignore"):
        mx = run.metric("max_abs")
        nf = run.metric("nonfinite")
        nonfinite_total = np.nansum(nf, axis=0, dtype=np.float64)
        nonfinite_steps = np.sum(nf > 0, axis=0)
        max_abs_max = np.where(nonfinite_steps > 0, np.inf, np.nanmax(mx, axis=0)) if run.n_steps else \
            np.full(run.n_layers, np.nan)
        n = max(run.n_steps, 1)
        trainable = run.trainable_mask()
        vanishing_share = np.sum(run.metric("mean_abs") < t.vanishing, axis=0) / n * trainable
        exploding_share = np.sum((mx > t.exploding) | (nf > 0), axis=0) / n
        dead_share = np.sum(run.metric("zero_frac") >= t.dead_zero_fraction, axis=0) / n * trainable
        known = np.sum(np.isfinite(run.metric("grad_norm")) | (nf > 0), axis=0)
    return {"max_abs_max": max_abs_max, "nonfinite_total": nonfinite_total,
            "nonfinite_share": nonfinite_steps / n, "vanishing_share": vanishing_share,
            "exploding_share": exploding_share, "dead_share": dead_share, "known_steps": known}


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
        rec = np.asarray(g[max(0, n - max_rows):], np.float64)
        self.recent = np.where(np.isfinite(rec), rec, np.nan)  # non-finite steps are counted apart
        self.recent_steps = run.steps[max(0, n - max_rows):]
        coarse, self.block = block_mean(g, max_rows)
        self.coarse = log10_pos(coarse)
        m = (n // self.block) * self.block
        self.coarse_steps = run.steps[n - m:][:: self.block] if n else run.steps
        self.exact = exact_reductions(run)
        self.stats = layer_statistics(run, max_rows=max_rows)
        self.trainable = run.trainable_mask()

    def stat(self, metric: str, name: str) -> np.ndarray:
        """One statistic of one metric for every layer, in depth order."""
        s = self.stats
        return s.loc[s["metric"] == metric, name].to_numpy()
