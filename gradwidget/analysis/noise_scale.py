"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A) from the gradient seen at two batch sizes (``run.noise``).

For a gradient estimated from B examples, E|G_B|² = |G|² + tr(Σ)/B. Two batch sizes give two
equations, whose solution is unbiased:

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Each step's pair is noisy (|G|² may even come out negative), so, as in the paper, the two are
averaged separately over steps and B_simple is their ratio. What is shown is an estimate of the
present, not of the run so far:

- **The time constant is in steps, not rows** (``TAU_STEPS``, 64): a row ``age`` steps old weighs
  ``exp(-age / 64)``, whatever the cadence of the measured steps (the first 10 back to back, then
  one in 8: ``collect._noise``).
- **A row weighs the steps it stands for, over its gradient's size** (``row_weights``): the gap since
  the row before (a first row 1, a row one in 8 counts 8), divided by the squared norm of the
  gradient the optimizer stepped with in the rows just before it. The first steps' |G|² is 100-1,000x the later one; averaged
  by rows, they held B_simple at a tenth of its value for hundreds of steps.
- **The interval comes from the rows' own noise** (``noise_cov``): the variance of one row's
  estimates, in units of its size, from the differences between consecutive rows (a slow trend
  hardly enters them) over the last ``VAR_ROWS`` rows, times the weights' sum of squares; the delta
  method gives the ratio's 95% interval. When the interval of |G|² reaches 0 (a batch far below
  B_simple resolves tr(Σ) well and |G|² hardly at all), B_simple has no upper bound and its lower
  bound is tr(Σ)'s lower bound over |G|²'s upper bound: "at least N".

Each row is read at the batch sizes it was given: a row whose big gradient is no bigger than its
small ones (several ``backward()`` calls on one batch, recorded as one size) holds no second size
and is left out, never read as one.

Checked against the exact value at the step itself (``bench/noise_scale.py --present``: every
example's gradient, four models, three seeds): at the end of runs whose noise scale grew 10-100x it
reads closer than the 20-row average did (a breast-cancer MLP: 1.04x the exact value, against
0.12x), but not yet at the first third of such a run (0.03-0.3x: the rows of the rise are still in
the average), and where a handful of examples hold most of tr(Σ) a few rows read it low. The
interval holds only the rows' noise, not that lag: it held the exact value in 18 of 36 there.
Pure numpy: no torch, no I/O.

B_simple estimates the critical batch size: below it a larger batch trains in proportionally fewer
steps (with the learning rate raised to match); above it, more examples per step buy little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the average's time constant in steps: a row ``age`` steps old weighs ``exp(-age / TAU_STEPS)``
TAU_STEPS = 64
#: rows the per-row noise (``noise_cov``) is averaged over
VAR_ROWS = 100
#: rows before a row whose gradient size sets its weight (``row_weights``)
SIZE_ROWS = 3
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
    ``40 tau`` steps long so the factors stay well inside float64."""
    s = np.asarray(steps, np.float64)
    x = np.asarray(x, np.float64)
    out = np.empty_like(x)
    shape = (-1,) + (1,) * (x.ndim - 1)
    carry = np.zeros(x.shape[1:], np.float64)  # the sum so far, decayed to the block's first step
    i, n = 0, len(s)
    while i < n:
        j = max(int(np.searchsorted(s, s[i] + 40.0 * tau, side="right")), i + 1)
        t = ((s[i:j] - s[i]) / tau).reshape(shape)
        out[i:j] = np.exp(-t) * (carry + np.cumsum(x[i:j] * np.exp(t), axis=0))
        if j < n:
            carry = out[j - 1] * np.exp(-(s[j] - s[j - 1]) / tau)
        i = j
    return out


def row_weights(steps: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's weight before the decay: the steps it stands for (the gap since the row before,
    at least 1: the first rows, measured back to back, count one step each and a row one in 8
    counts 8) over the size of the gradient when it was taken (the geometric mean of ``scale``, the
    squared norm of the gradient the optimizer stepped with, over the ``SIZE_ROWS`` rows before it;
    the first row its own). So a row counts in proportion to its share of the steps, not to its size: the first
    steps' gradients, 100-1,000x larger than later ones, would otherwise hold the average for
    hundreds of steps. The rows before, not the row itself: a weight that shrank with its own
    row's noise would take the large draws of tr(Σ) out of the average (2.5x too low at a batch
    20x below B_simple). Returns ``(weight, gap, size)``; a row without a size weighs 0."""
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
    return np.where(good, gap / np.where(good, size, 1.0), 0.0), gap, np.where(good, size, np.nan)


def noise_cov(x: np.ndarray, y: np.ndarray, rows: int = VAR_ROWS) -> np.ndarray:
    """Per row, the covariance of one row's ``x`` and ``y`` around what they estimate (``x`` with
    itself: its variance), from the products of the differences of consecutive rows (half their
    mean: a trend moving slowly between rows hardly enters it), averaged over the last ~``rows``
    rows (an exponential average, normalised); NaN until two differences exist."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dx = np.diff(x, axis=0, prepend=x[:1] * np.nan)
    dy = np.diff(y, axis=0, prepend=y[:1] * np.nan)
    d = dx * dy
    d2 = np.where(np.isfinite(d), d / 2.0, 0.0)
    seen = np.isfinite(d).astype(np.float64)
    steps = np.arange(len(x), dtype=np.float64)
    tau = rows / 2.0
    num, den = decayed(steps, d2, tau), decayed(steps, seen, tau)
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


def smoothed(
    steps: np.ndarray, g2: np.ndarray, tr: np.ndarray, scale: np.ndarray, tau: float = TAU_STEPS, z: float = Z95
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B_simple, lo, hi)`` per row (and column) from per-row ``|G|²`` and ``tr(Σ)`` estimates at
    ``steps``: the ratio of their averages, each row weighted by ``row_weights`` (``scale``: the
    squared norm of each row's big gradient) times ``exp(-age / tau)`` (its age in steps),
    and the interval of that ratio at ``z`` (delta method; the per-row noise from ``noise_cov``).
    Where ``|G|²`` is not resolved (its interval reaches 0) B_simple has no upper bound and its
    lower bound is tr(Σ)'s lower bound over |G|²'s upper bound."""
    g2, tr = np.asarray(g2, np.float64), np.asarray(tr, np.float64)
    w, gap, size = row_weights(steps, scale)
    col = (slice(None),) + (None,) * (g2.ndim - 1)
    W = decayed(steps, w, tau)[col]
    with np.errstate(invalid="ignore", divide="ignore"):
        mg = decayed(steps, w[col] * np.nan_to_num(g2), tau) / W
        ms = decayed(steps, w[col] * np.nan_to_num(tr), tau) / W
        # the sum of the squared weights (each row's noise, in units of its size: ``gap`` = w size)
        q = decayed(steps, gap * gap, tau / 2.0)[col] / (W * W)
        xg, xs = g2 / size[col], tr / size[col]
        var_g = q * noise_cov(xg, xg)
        var_s = q * noise_cov(xs, xs)
        cov = q * noise_cov(xg, xs)
        b = np.where(mg > 0, ms / mg, np.nan)
        var_b = np.maximum(var_s - 2 * b * cov + b * b * var_g, 0.0) / (mg * mg)
        se_b, se_g, se_s = np.sqrt(var_b), np.sqrt(var_g), np.sqrt(var_s)
        resolved = mg - z * se_g > 0  # False where the noise is not known yet (NaN)
        lo = np.where(resolved, b - z * se_b, (ms - z * se_s) / (mg + z * se_g))
        lo = np.where(np.isfinite(lo), np.maximum(lo, 0.0), 0.0)
        hi = np.where(resolved, b + z * se_b, np.inf)
        # tr(Σ) is a sum of variances: an average not above 0 measured nothing B_simple can be read
        # from (too few rows, or a big gradient holding more than its micro-batches: past steps'
        # gradients never reset). Unknown, not a negative batch size
        known = ms > 0
        b, hi, lo = np.where(known, b, np.nan), np.where(known, hi, np.nan), np.where(known, lo, 0.0)
    # B_simple is NaN where the average |G|² is not above 0; its lower bound may still say much
    return b, np.where(np.isfinite(ms), lo, np.nan), np.where(np.isfinite(ms), hi, np.nan)


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
    steps, scale = rows["step"], rows["big_total"]
    b, lo, hi = smoothed(steps, g2, tr, scale, tau)
    _, floor, ceiling = smoothed(steps, g2, tr, scale, tau, Z_ONE)
    groups = {}
    by = _groups(run.layer_names)
    if len(by) > 1:
        small = np.nan_to_num(rows["small_sq"].astype(np.float64), posinf=0.0)
        big = np.nan_to_num(rows["big_sq"].astype(np.float64), posinf=0.0)
        per_s = np.stack([small[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        per_b = np.stack([big[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        gg, gt = two_size_estimates(rows["b_small"], rows["b_big"], per_s, per_b)
        gb, glo, ghi = smoothed(steps, gg, gt, scale, tau)
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
