"""The gradient noise scale B_simple = tr(Σ) / |G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A) from the gradient seen at two batch sizes (``run.noise``).

For a gradient estimated from B examples, E|G_B|² = |G|² + tr(Σ)/B. Two batch sizes give two
equations, whose solution is unbiased:

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Each step's pair is noisy (|G|² may even come out negative), so, as in the paper, the two are
smoothed separately over steps by an exponential moving average (``EMA_STEPS``, bias-corrected as
Adam's moments are) and B_simple is their ratio. Its 95% interval comes from the delta method: the
variance of each smoothed mean is its EMA weights' sum of squares times the per-step variance (and
covariance) of the two estimates around their average, over the same window. When the interval of
|G|² reaches 0 (a batch far below B_simple resolves tr(Σ) well and |G|² hardly at all), B_simple has
no upper bound and its lower bound is tr(Σ)'s lower bound over |G|²'s upper bound. Pure numpy: no
torch, no I/O.

B_simple estimates the critical batch size: below it a larger batch trains in proportionally fewer
steps (with the learning rate raised to match); above it, more examples per step buy little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the moving average's span in noise rows (alpha = 2 / (EMA_STEPS + 1), ~EMA_STEPS rows of memory)
EMA_STEPS = 20
#: z of a two-sided 95% normal interval
Z95 = 1.959964


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


def ema(x: np.ndarray, span: int = EMA_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected exponential moving average of ``x`` (finite) along its first axis and, per
    row, the sum of the squared normalised weights (the variance factor of that mean). Vectorised a
    block of rows at a time (the block as long as the weights' range stays well inside float64)."""
    x = np.asarray(x, np.float64)
    n = x.shape[0]
    a = 2.0 / (span + 1.0)
    d = 1.0 - a
    k = np.arange(1, n + 1, dtype=np.float64).reshape((n,) + (1,) * (x.ndim - 1))
    wsum = 1.0 - d**k
    w2 = a * a * (1.0 - d ** (2 * k)) / (1.0 - d * d) / (wsum * wsum) if d > 0 else np.ones_like(k)
    if d <= 0:
        return x.copy(), np.broadcast_to(w2, x.shape).copy()
    block = int(min(256, max(1, 20 / -np.log10(d))))
    m = np.zeros(x.shape, np.float64)
    carry = np.zeros(x.shape[1:], np.float64)
    for s in range(0, n, block):  # m_i = d m_(i-1) + a x_i, as cumulative sums within a block
        xs = x[s : s + block]
        j = np.arange(len(xs), dtype=np.float64).reshape((len(xs),) + (1,) * (x.ndim - 1))
        m[s : s + block] = d**j * (d * carry + a * np.cumsum(xs * d**-j, axis=0))
        carry = m[s + len(xs) - 1]
    return m / wsum, np.broadcast_to(w2, x.shape).copy()


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
    ema_steps: int = EMA_STEPS
    how: str = ""  #: how the two sizes were seen and where the batch size came from
    every: int = 1  #: the probe measured one recorded step in this many (``Recorder(noise_every=...)``)
    first: int = 0  #: ... after this many recorded steps in a row (0: from the start)

    @property
    def window_text(self) -> str:
        """What the estimate averages, in words: "EMA over 20 of 34 measured steps (the first 10,
        then one in 8)"."""
        cadence = ""
        if self.every > 1:
            cadence = (
                f" (the first {self.first}, then one in {self.every})" if self.first else f" (one in {self.every})"
            )
        return f"EMA over {min(self.ema_steps, self.rows)} of {self.rows} measured steps{cadence}"

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
            "ema_steps": self.ema_steps,
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


def smoothed(g2: np.ndarray, tr: np.ndarray, span: int = EMA_STEPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B_simple, lo, hi)`` per row (and column) from per-row ``|G|²`` and ``tr(Σ)`` estimates:
    the ratio of their moving averages and its delta-method 95% interval."""
    mg, wg = ema(g2, span)
    ms, _ = ema(tr, span)
    # per-step spread around the smoothed values, itself smoothed over the same span, corrected for
    # the mean it is taken around (n / (n - 1), n the effective number of rows: 1 / the weights' sum
    # of squares), so the first rows have no interval rather than a zero-width one
    vg, _ = ema((g2 - mg) ** 2, span)
    vs, _ = ema((tr - ms) ** 2, span)
    cv, _ = ema((g2 - mg) * (tr - ms), span)
    with np.errstate(invalid="ignore", divide="ignore"):
        n = 1.0 / wg
        corr = np.where(n > 1.5, n / (n - 1.0), np.inf)
        b = np.where(mg > 0, ms / mg, np.nan)
        var_g, var_s, cov = wg * vg * corr, wg * vs * corr, wg * cv * corr
        var_b = np.maximum(var_s - 2 * b * cov + b * b * var_g, 0.0) / (mg * mg)
        se_b, se_g, se_s = np.sqrt(var_b), np.sqrt(var_g), np.sqrt(var_s)
        resolved = mg - Z95 * se_g > 0
        lo = np.where(resolved, b - Z95 * se_b, (ms - Z95 * se_s) / (mg + Z95 * se_g))
        lo = np.where(np.isfinite(lo), np.maximum(lo, 0.0), 0.0)
        hi = np.where(resolved, b + Z95 * se_b, np.inf)
        # tr(Σ) is a sum of variances: a smoothed estimate not above 0 measured nothing B_simple can
        # be read from (too few rows, or a big gradient holding more than its micro-batches: past
        # steps' gradients never reset). Unknown, not a negative batch size
        known = ms > 0
        b, hi, lo = np.where(known, b, np.nan), np.where(known, hi, np.nan), np.where(known, lo, 0.0)
    # B_simple is NaN where the smoothed |G|² is not above 0; its lower bound may still say much
    return b, np.where(np.isfinite(ms), lo, np.nan), np.where(np.isfinite(ms), hi, np.nan)


def _groups(names: list[str]) -> dict[str, list[int]]:
    from .groups import _module_keys  # the module prefixes the layer groups use

    out: dict[str, list[int]] = {}
    for i, k in enumerate(_module_keys(names)):
        out.setdefault(k, []).append(i)
    return out


def noise_scale(run, span: int = EMA_STEPS) -> NoiseScale | None:
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
    b, lo, hi = smoothed(g2, tr, span)
    groups = {}
    by = _groups(run.layer_names)
    if len(by) > 1:
        small = np.nan_to_num(rows["small_sq"].astype(np.float64), posinf=0.0)
        big = np.nan_to_num(rows["big_sq"].astype(np.float64), posinf=0.0)
        per_s = np.stack([small[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        per_b = np.stack([big[:, cols].sum(axis=1) for cols in by.values()], axis=1)
        gg, gt = two_size_estimates(rows["b_small"], rows["b_big"], per_s, per_b)
        gb, glo, ghi = smoothed(gg, gt, span)
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
        ema_steps=span,
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
