"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A) from the gradient seen at two batch sizes (``run.noise``).

For a gradient estimated from B examples, E|G_B|² = |G|² + tr(Σ)/B. Two batch sizes give two
equations, whose solution is unbiased:

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Each step's pair is noisy (|G|² may even come out negative), so, as in the paper, the two are
averaged separately over steps and B_simple is their ratio. What is shown is an estimate of the
present, not of the run so far (``present``):

- **The time constant is in steps, not rows** (``TAU_STEPS``, 64): a row ``age`` steps old weighs
  ``exp(-age / 64)``, whatever the cadence of the measured steps (the first 10 back to back, then
  one in 8: ``collect._noise``).
- **A row weighs the steps it stands for, over |G|² when it was taken** (``row_scale``): the gap
  since the row before (a first row 1, a row one in 8 counts 8), over the squared norm of the
  gradient stepped with in the rows just before it, read as |G|² with the lower bound of B_simple
  found there. So the ratio of the averages is an average of B_simple over the steps: the first
  steps, whose |G|² is 100-1,000x the later one, do not hold it, nor do the rows of small B_simple
  outweigh the later ones.
- **The lag is taken out where it stands out of the noise**: the averages at 64 and 32 steps give
  the lag's first order (exact for a B_simple growing exponentially), taken where it stands more
  than 2 sd out of its own noise (three quarters of it at 4 sd); the share not taken stays in
  the interval.
- **The interval comes from the rows' own noise** (``noise_cov``), in 1/B_simple, where the rows'
  noise adds up linearly: the variance of one row's estimates, in units of its size, from the
  differences between consecutive rows (a slow trend hardly enters them) over the last
  ``VAR_ROWS`` rows. Where it reaches 0 (a batch far below B_simple resolves tr(Σ) well and |G|²
  hardly at all), B_simple has no upper bound and the estimate is a lower bound: "at least N".

Each row is read at the batch sizes it was given: a row whose big gradient is no bigger than its
small ones (several ``backward()`` calls on one batch, recorded as one size) holds no second size
and is left out, never read as one.

How close it comes to the exact value at the step, and where it cannot (|G|² not resolved far
below B_simple; a handful of examples holding most of tr(Σ); the exact value itself jumping 2-3x
between measured steps under Adam): docs/noise-scale.md. Pure numpy: no torch, no I/O.

B_simple estimates the critical batch size: below it a larger batch trains in proportionally fewer
steps (with the learning rate raised to match); above it, more examples per step buy little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the average's time constant in steps: a row ``age`` steps old weighs ``exp(-age / TAU_STEPS)``
TAU_STEPS = 64
#: rows the per-row noise (``noise_cov``) is averaged over: an exponential average whose time
#: constant is half of them
VAR_ROWS = 100
VAR_TAU_ROWS = VAR_ROWS / 2.0
#: rows before a row whose gradient size sets its weight (``row_scale``)
SIZE_ROWS = 3
#: passes of ``present``'s weights after the first: each reads |G|² at a row from its size and the
#: lower bound of B_simple the pass before found at the row before
WEIGHT_PASSES = 2
#: the lag correction is taken in full where it stands this many variances of its own noise out of
#: it, in part down to one, not at all below: 1 - LAG_SURE var(d) / d² (a positive-part shrinkage)
LAG_SURE = 4.0
#: time constants an exponential average reaches back: a row older than this weighs under
#: exp(-40) ~ 4e-18 of a new one (``decayed``'s blocks; ``last_rows``)
HORIZON_TAUS = 40.0
#: z of a two-sided 95% normal interval
Z95 = 1.959964
#: z of a one-sided 95% bound (what a finding that B_simple lies beyond a bound tests)
Z_ONE = 1.644854


def two_size_estimates(b_small, b_big, small_sq, big_sq) -> tuple[np.ndarray, np.ndarray]:
    """Per row (and column), the unbiased estimates ``(|G|², tr(Σ))`` from the mean squared norm of
    gradients of ``b_small`` examples and the squared norm of one of ``b_big`` examples."""
    bs, bb = np.asarray(b_small, np.float64), np.asarray(b_big, np.float64)
    s, b = np.asarray(small_sq, np.float64), np.asarray(big_sq, np.float64)
    if s.ndim == 2:
        bs, bb = bs[:, None], bb[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        g2 = (bb * b - bs * s) / (bb - bs)
        tr = (s - b) / (1.0 / bs - 1.0 / bb)
    return g2, tr


def decayed(steps: np.ndarray, x: np.ndarray, tau: float) -> np.ndarray:
    """Per row n, ``sum over rows i <= n of exp(-(steps[n] - steps[i]) / tau) * x[i]`` (along the
    first axis; ``steps`` increasing): cumulative sums a block at a time, each block at most
    ``HORIZON_TAUS`` time constants long so the factors stay well inside float64."""
    s = np.asarray(steps, np.float64)
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    shape = (-1,) + (1,) * (x.ndim - 1)
    carry = np.zeros(x.shape[1:], np.float64)  # the sum so far, decayed to the block's first step
    i, n = 0, len(s)
    while i < n:
        j = max(int(np.searchsorted(s, s[i] + HORIZON_TAUS * tau, side="right")), i + 1)
        t = ((s[i:j] - s[i]) / tau).reshape(shape)
        out[i:j] = np.exp(-t) * (carry + np.cumsum(x[i:j] * np.exp(t), axis=0))
        if j < n:
            carry = out[j - 1] * np.exp(-(s[j] - s[j - 1]) / tau)
        i = j
    return out


def row_scale(steps: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``(gap, size)``: the steps it stands for (the gap since the row before, at least 1:
    the first rows, measured back to back, count one step each and a row one in 8 counts 8) and
    the size of the gradient when it was taken (the geometric mean of ``scale``, the squared norm of
    the gradient the optimizer stepped with, over the ``SIZE_ROWS`` rows before it; the first row
    its own; NaN without one). The rows before, not the row itself: a weight that shrank with its
    own row's noise would take the large draws of tr(Σ) out of the average (2.5x too low at a batch
    20x below B_simple)."""
    steps = np.asarray(steps, np.float64)
    gap = np.maximum(np.diff(steps, prepend=steps[:1] - 1.0), 1.0)
    sc = np.asarray(scale, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        ls = np.where(sc > 0, np.log(np.where(sc > 0, sc, 1.0)), np.nan)
    ok = np.isfinite(ls)
    c = np.concatenate([[0.0], np.cumsum(np.where(ok, ls, 0.0))])
    k = np.concatenate([[0], np.cumsum(ok)])
    idx = np.arange(len(ls))
    lo = np.maximum(idx - SIZE_ROWS, 0)
    tot, cnt = c[idx] - c[lo], k[idx] - k[lo]  # rows lo .. i-1
    with np.errstate(invalid="ignore", divide="ignore"):
        size = np.exp(np.where(cnt > 0, tot / np.maximum(cnt, 1), ls))  # the first row: its own
    good = np.isfinite(size) & (size > 0)
    return gap, np.where(good, size, np.nan)


def noise_cov(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row, the covariance of one row's ``x`` and ``y`` around what they estimate (``x`` with
    itself: its variance), from the products of the differences of consecutive rows (half their
    mean: a trend moving slowly between rows hardly enters it), averaged over the last ~``VAR_ROWS``
    rows (an exponential average over ``VAR_TAU_ROWS``, normalised); NaN until two differences exist."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dx = np.diff(x, axis=0, prepend=x[:1] * np.nan)
    dy = np.diff(y, axis=0, prepend=y[:1] * np.nan)
    d = dx * dy
    d2 = np.where(np.isfinite(d), d / 2.0, 0.0)
    seen = np.isfinite(d).astype(np.float64)
    steps = np.arange(len(x), dtype=np.float64)
    num, den = decayed(steps, d2, VAR_TAU_ROWS), decayed(steps, seen, VAR_TAU_ROWS)
    cnt = np.cumsum(seen, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt >= 2, num / den, np.nan)


def interval_text(lo: float, hi: float) -> str:
    """A 95% interval of B_simple in words: "33–52", or "at least 33" when |G|² is not resolved
    (no upper bound)."""
    return f"{lo:,.0f}–{hi:,.0f}" if np.isfinite(hi) else f"at least {lo:,.0f}"


@dataclass
class NoiseScale:
    """The gradient noise scale over a run: per noise row, the smoothed estimate and its interval
    (global), the last estimate per layer group, and the batch sizes it was seen at."""

    steps: np.ndarray  #: the step of each noise row
    b_simple: np.ndarray  #: smoothed tr(Σ)/|G|² at each row (NaN until |G|² > 0)
    lo: np.ndarray  #: 95% interval, lower bound
    hi: np.ndarray  #: 95% interval, upper bound (inf when |G|² is not distinguishable from 0)
    b_small: float  #: the micro-batch (or one rank's) batch size, median over rows
    b_big: float  #: the batch the optimizer steps with, median over rows
    rows: int
    groups: dict = field(default_factory=dict)  #: module prefix -> (b_simple, lo, hi) at the last row
    floor: np.ndarray | None = None  #: one-sided 95% lower bound per row (``Z_ONE``)
    ceiling: np.ndarray | None = None  #: one-sided 95% upper bound per row (inf where |G|² is not resolved)
    tau: float = TAU_STEPS  #: the average's time constant in steps
    how: str = ""  #: how the two sizes were seen and where the batch size came from
    every: int = 1  #: the probe measured one recorded step in this many (``Recorder(noise_every=...)``)
    first: int = 0  #: ... after this many recorded steps in a row (0: from the start)

    @property
    def window_text(self) -> str:
        """What the estimate averages, in words: "averaged with a time constant of 64 steps over 34
        measured steps (the first 10, then one in 8)"."""
        cadence = ""
        if self.every > 1:
            cadence = (
                f" (the first {self.first}, then one in {self.every})" if self.first else f" (one in {self.every})"
            )
        return f"averaged with a time constant of {self.tau:,.0f} steps over {self.rows} measured steps{cadence}"

    @property
    def last(self) -> tuple[float, float, float]:
        """``(B_simple, lo, hi)`` at the last row (NaNs without rows)."""
        if not self.rows:
            return math.nan, math.nan, math.nan
        return float(self.b_simple[-1]), float(self.lo[-1]), float(self.hi[-1])

    def to_dict(self) -> dict:
        b, lo, hi = self.last
        return {
            "b_simple": b,
            "interval": [lo, hi],
            "b_small": self.b_small,
            "b_big": self.b_big,
            "rows": self.rows,
            "tau_steps": self.tau,
            "groups": {k: list(v) for k, v in self.groups.items()},
            "how": self.how,
            "every": self.every,
            "first": self.first,
        }

    def text(self) -> str:
        """The estimate in words."""
        b, lo, hi = self.last
        if not np.isfinite(b):
            floor = f", at least {lo:,.0f} examples" if lo > 0 else ""
            return (
                f"gradient noise scale: |G|² not yet above 0 ({self.window_text}{floor}), "
                f"batch {self.b_big:,.0f} per step"
            )
        return (
            f"gradient noise scale B_simple ≈ {b:,.0f} examples (95% interval {interval_text(lo, hi)}; "
            f"{self.window_text}), batch {self.b_big:,.0f} per step "
            f"(seen at {self.b_small:,.0f} and {self.b_big:,.0f}{'; ' + self.how if self.how else ''})"
        )

    def groups_text(self) -> str:
        """The per-module estimates in one line: every module when there are at most three with an
        estimate, else the lowest and the highest (where a batch size helps the least and the
        most parts of the model); "" with none."""
        done = sorted(((b, k, lo, hi) for k, (b, lo, hi) in self.groups.items() if np.isfinite(b)), key=lambda t: t[0])
        if not done:
            return ""

        def one(b, k, lo, hi):
            return f"{k} ≈ {b:,.0f} ({interval_text(lo, hi)})"

        if len(done) <= 3:
            return "by module: " + "; ".join(one(*t) for t in done)
        return f"by module, of {len(done)}: lowest {one(*done[0])}, highest {one(*done[-1])}"


def present(
    steps: np.ndarray, g2: np.ndarray, tr: np.ndarray, scale: np.ndarray, b_big=np.inf, tau: float = TAU_STEPS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, se, trace)`` per row (and column) from per-row ``|G|²`` and ``tr(Σ)`` estimates at
    ``steps``: ``q`` estimates |G|²/tr(Σ) = 1/B_simple at the row's own step, ``se`` its standard
    error, ``trace`` the weighted sum of tr(Σ) (B_simple is known where it is above 0; ``bounds``).
    ``scale``: each row's squared norm of the big gradient, ``b_big`` its batch (one or per row).

    In 1/B_simple the rows' noise adds up linearly (|G|², the noisy one, is the numerator), so the
    interval is a plain normal one there, and where it reaches 0 B_simple has no upper bound.

    - **Weights**: a row stands for the steps since the row before (``row_scale``), over |G|² when
      it was taken: its gradient's size over the rows before it, read as |G|² with the lower 95%
      bound of B_simple the previous pass found at the row before, size / (1 + bound / b_big)
      (``WEIGHT_PASSES``; the bound, not the estimate, whose heavy upper tail where |G|² is barely
      resolved would make the weights as noisy as the rows).
      The ratio of the averages is then an average of B_simple over the steps; weighted by the size
      alone, it leaned towards the rows of small B_simple, and a noise scale growing 10-100x read
      a tenth of its value.
    - **Lag**: the averages decay with ``tau`` and ``tau / 2`` steps. An average lags a trend by
      about its time constant, so q(tau) + 2 (q(tau / 2) - q(tau)) takes the lag's first order out
      (exactly, for a B_simple growing or falling exponentially). With d = q(tau / 2) - q(tau), the
      share 1 - ``LAG_SURE`` var(d) / d² of that correction is taken (none below 2 sd of its own
      noise): a noise scale that holds still keeps the precision of the ``tau`` average, and the
      share not taken stays in ``se``, as the lag it may still be.
    - **Noise**: one row's variance of |G|² - q tr(Σ), in units of its size, from the differences of
      consecutive rows (``noise_cov``), times the squares of each row's weight in the combination."""
    g2, tr = np.asarray(g2, np.float64), np.asarray(tr, np.float64)
    steps = np.asarray(steps, np.float64)
    gap, size = row_scale(steps, scale)
    col = (slice(None),) + (None,) * (g2.ndim - 1)
    ok = np.isfinite(size)
    unit = np.where(ok, size, 1.0)[col]
    bb = np.broadcast_to(np.asarray(b_big, np.float64), steps.shape)[col]
    with np.errstate(invalid="ignore", divide="ignore"):
        xg, xs = np.where(ok[col], g2 / unit, np.nan), np.where(ok[col], tr / unit, np.nan)
        vgg, vss, vgs = noise_cov(xg, xg), noise_cov(xs, xs), noise_cov(xg, xs)
        g, s = np.nan_to_num(g2), np.nan_to_num(tr)
        before = np.zeros(g2.shape)  # B_simple the previous pass found at the row before
        for _ in range(WEIGHT_PASSES + 1):
            h = np.where(ok, gap, 0.0)[col] * (1.0 + before / bb)  # a row's weight times its size
            w = h / unit
            s1, s2 = decayed(steps, w * s, tau), decayed(steps, w * s, tau / 2)
            q1, q2 = decayed(steps, w * g, tau) / s1, decayed(steps, w * g, tau / 2) / s2
            k2, k3, k4 = (decayed(steps, h * h, tau / n) for n in (2, 3, 4))
            ve = np.maximum(vgg - 2 * q1 * vgs + q1 * q1 * vss, 0.0)  # one row's, per unit of size²
            var1 = ve * k2 / s1**2
            var_d = ve * (k4 / s2**2 - 2 * k3 / (s1 * s2) + k2 / s1**2)
            cov_d = ve * (k3 / (s1 * s2) - k2 / s1**2)
            d = q2 - q1
            take = np.clip(np.nan_to_num(1.0 - LAG_SURE * var_d / (d * d)), 0.0, 1.0)
            q = q1 + 2 * take * d
            var = var1 + 4 * take * cov_d + 4 * take * take * var_d + (2 * (1 - take) * d) ** 2
            se = np.sqrt(np.maximum(var, 0.0))
            trace = np.where(s2 > 0, s1, np.minimum(s1, s2))  # both averages of tr(Σ) above 0, or not
            _, lo, _ = bounds(q, se, trace, Z95)
            best = np.nan_to_num(lo)
            before = np.concatenate([np.zeros((1,) + g2.shape[1:]), best[:-1]])
    return q, se, trace


def bounds(q: np.ndarray, se: np.ndarray, trace: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B_simple, lo, hi)`` from ``present``'s ``(q, se, trace)`` at ``z``: 1/q and the interval
    q ± z se turned over. Where its upper end reaches 0 (|G|² not resolved), B_simple has no upper
    bound (inf) and its lower bound is 1 / (q + z se): "at least N". Where the average tr(Σ) is not
    above 0, B_simple is unknown (NaN; lo 0): tr(Σ) is a sum of variances, so such an average
    measured nothing it can be read from (too few rows, or a big gradient holding more than its
    micro-batches: past steps' gradients never reset), never a negative batch size. NaN bounds
    where no row weighs yet."""
    with np.errstate(invalid="ignore", divide="ignore"):
        known = trace > 0
        top, bottom = q + z * se, q - z * se
        b = np.where(known & (q > 0), 1.0 / q, np.nan)
        lo = np.where(known & (top > 0), 1.0 / top, 0.0)
        lo = np.where(np.isfinite(lo), lo, 0.0)
        hi = np.where(known, np.where(bottom > 0, 1.0 / bottom, np.inf), np.nan)
    seen = np.isfinite(trace)
    return b, np.where(seen, lo, np.nan), np.where(seen, hi, np.nan)


def smoothed(
    steps: np.ndarray,
    g2: np.ndarray,
    tr: np.ndarray,
    scale: np.ndarray,
    tau: float = TAU_STEPS,
    z: float = Z95,
    b_big=np.inf,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B_simple, lo, hi)`` per row (and column): ``present`` read at ``z`` (``bounds``). Without
    ``b_big`` the weights take each row's size for |G|²."""
    return bounds(*present(steps, g2, tr, scale, b_big, tau), z)


def last_rows(steps: np.ndarray, tau: float) -> slice:
    """The rows the estimate at the last row reads (``present``): those within ``HORIZON_TAUS``
    time constants of its step, and of its row for the per-row noise (``noise_cov``, averaged over
    ``VAR_ROWS``); what lies before weighs under exp(-40) of them."""
    steps = np.asarray(steps, np.float64)
    by_step = int(np.searchsorted(steps, steps[-1] - HORIZON_TAUS * tau, side="left"))
    by_row = len(steps) - int(HORIZON_TAUS * VAR_TAU_ROWS) - SIZE_ROWS - 1
    return slice(max(0, min(by_step, by_row)), None)


def _groups(names: list[str]) -> dict[str, list[int]]:
    from .groups import _module_keys  # the module prefixes the layer groups use

    out: dict[str, list[int]] = {}
    for i, k in enumerate(_module_keys(names)):
        out.setdefault(k, []).append(i)
    return out


def noise_scale(run, tau: float = TAU_STEPS) -> NoiseScale | None:
    """The gradient noise scale of ``run`` (None when it holds no gradient at two batch sizes)."""
    ns = getattr(run, "noise", None)
    if ns is None or not len(ns):
        return None
    rows = ns.window()
    ok = np.isfinite(rows["b_small"]) & (rows["b_big"] > rows["b_small"])
    rows = rows[ok & np.isfinite(rows["small_total"]) & np.isfinite(rows["big_total"])]  # a NaN/Inf step: skipped
    if not len(rows):
        return None
    g2, tr = two_size_estimates(rows["b_small"], rows["b_big"], rows["small_total"], rows["big_total"])
    steps, scale, b_big = rows["step"], rows["big_total"], rows["b_big"]
    now = present(steps, g2, tr, scale, b_big, tau)
    b, lo, hi = bounds(*now, Z95)
    _, floor, ceiling = bounds(*now, Z_ONE)
    groups = {}
    by = _groups(run.layer_names)
    if len(by) > 1:  # only the last row's estimate per group: the rows it reads
        recent = rows[last_rows(steps, tau)]
        small = np.nan_to_num(recent["small_sq"].astype(np.float64), posinf=0.0)
        big = np.nan_to_num(recent["big_sq"].astype(np.float64), posinf=0.0)
        per_s = np.stack([small[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        per_b = np.stack([big[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        gg, gt = two_size_estimates(recent["b_small"], recent["b_big"], per_s, per_b)
        gb, glo, ghi = smoothed(recent["step"], gg, gt, recent["big_total"], tau, b_big=recent["b_big"])
        groups = {k: (float(gb[-1, j]), float(glo[-1, j]), float(ghi[-1, j])) for j, k in enumerate(by)}
    meta = run.meta.get("noise_scale") or {}
    every, first = meta.get("every", 1), meta.get("first", 0)
    how = ", ".join(
        f"{k.replace('_', ' ')}: {meta[k]}" for k in ("two_sizes", "batch_size") if isinstance(meta.get(k), str)
    )
    return NoiseScale(
        steps=rows["step"].copy(),
        b_simple=b,
        lo=lo,
        hi=hi,
        b_small=float(np.median(rows["b_small"])),
        b_big=float(np.median(rows["b_big"])),
        rows=len(rows),
        groups=groups,
        tau=tau,
        floor=floor,
        ceiling=ceiling,
        how=how,
        every=every if _count(every) and every >= 1 else 1,
        first=first if _count(first) else 0,
    )


def _count(x) -> bool:
    """Whether ``x`` (read from a run's meta.json) is a non-negative int."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def no_estimate_note(run) -> str | None:
    """Why the run has no noise scale, as its recorder said: it saw only one batch size
    (``one_size``), or it could not look (``unavailable``: a sharded model)."""
    meta = (getattr(run, "meta", None) or {}).get("noise_scale") or {}
    note = meta.get("one_size") or meta.get("unavailable")
    return note if isinstance(note, str) else None
