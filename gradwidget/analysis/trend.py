"""A trend that knows batch noise and run length: the Theil-Sen slope (the median of the pairwise
slopes, robust to spikes) with Sen's rank-based confidence interval, and the Mann-Kendall statistic.
The rules read ``falling`` / ``rising`` / ``flat_within``: each a claim only when the interval
supports it, so a short or noisy series claims nothing."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: fewest points a trend is fitted on: with fewer, even a perfectly monotone series is not
#: significant at 99% under Mann-Kendall (6 points reach z = 2.63).
MIN_POINTS = 8
#: longer series are block-averaged to this many points first (pairwise slopes grow as n^2).
MAX_POINTS = 400
#: two-sided normal quantile of the confidence interval (99%).
Z_99 = 2.5758


@dataclass(frozen=True)
class Trend:
    n: int  #: points fitted (after block averaging)
    slope: float  #: Theil-Sen slope, per unit of x
    low: float  #: lower end of its 99% confidence interval
    high: float  #: upper end
    z: float  #: Mann-Kendall z (positive: rising)
    span: float  #: x range covered

    @property
    def falling(self) -> bool:
        """Falling for certain: the whole confidence interval is below zero."""
        return self.high < 0

    @property
    def rising(self) -> bool:
        return self.low > 0

    def flat_within(self, per_x: float, total: float) -> bool:
        """Flat for certain: the whole interval within ``per_x`` per unit of x, or its change over
        the span within ``total`` (absolute units of the series)."""
        worst = max(abs(self.low), abs(self.high))
        return worst <= per_x or worst * self.span <= total


def _blocks(y: np.ndarray, x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    k = int(np.ceil(y.size / m))
    if k <= 1:
        return y, x
    n = (y.size // k) * k
    return y[-n:].reshape(-1, k).mean(axis=1), x[-n:].reshape(-1, k).mean(axis=1)


def theil_sen(y, x=None) -> Trend | None:
    """The trend of ``y`` over ``x`` (the index when None), ignoring non-finite points; None with
    fewer than ``MIN_POINTS``."""
    y = np.asarray(y, np.float64)
    x = np.arange(y.size, dtype=np.float64) if x is None else np.asarray(x, np.float64)
    ok = np.isfinite(y) & np.isfinite(x)
    y, x = y[ok], x[ok]
    if y.size < MIN_POINTS:
        return None
    y, x = _blocks(y, x, MAX_POINTS)
    n = y.size
    i, j = np.triu_indices(n, 1)
    dx = x[j] - x[i]
    dy = y[j] - y[i]
    keep = dx != 0
    slopes = np.sort(dy[keep] / dx[keep])
    N = slopes.size
    if N == 0:
        return None
    s = float(np.sign(dy[keep]).sum())
    var = n * (n - 1) * (2 * n + 5) / 18.0
    z = (s - np.sign(s)) / np.sqrt(var) if s != 0 else 0.0
    c = Z_99 * np.sqrt(var)
    lo = int(np.clip(np.floor((N - c) / 2), 0, N - 1))
    hi = int(np.clip(np.ceil((N + c) / 2), 0, N - 1))
    return Trend(n, float(np.median(slopes)), float(slopes[lo]), float(slopes[hi]), float(z), float(x[-1] - x[0]))
