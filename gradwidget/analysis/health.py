"""Health: per-layer risk factors and Healthy / Warning / Critical / Unknown, comparative analysis,
and the network view (overall health, distribution of layer levels, layer interactions,
convergence, training dynamics with plateau detection, stability assessment), as the original crate's enhanced analysis had them.

Every number is measured from the Run: the neuron-activity ratio is 1 - the recorded zero fraction
(the original crate derived it from the norm), convergence and plateaus come from slopes of the real series,
and the forecast's confidence is the probability of its outlook under the fitted trend's standard
error (the R^2 a port of the original crate used is ~0 for any flat series, however sure its flatness is).

Fields of the original crate not carried over, and why:
- ``StabilityForecast.long_term_outlook`` and ``recommended_monitoring``: one horizon (the next
  ``convergence_window`` steps) is all a fit over the last window supports; the monitoring list was
  fixed text.
- ``LearningPhase.Overfitting`` / ``Convergence``: overfitting needs a validation loss, which a
  gradient recorder does not see; "converged" is a plateau at a low rate (``Plateau``).
- ``InstabilityType.Chaos`` / ``Stagnation``: no definition in the original crate; stagnation is the plateau.
- ``GradientDistribution.layer_gradient_ratios``: per layer in ``layer_health`` (``relative_level``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .evidence import zero_by_design
from .stats import (Series, _quiet, block_mean, log10_pos, lstsq_slope, moments, nanmedian, quantiles,
                    standardized)

HEALTH = ("Healthy", "Warning", "Critical", "Unknown")
#: a pair of layers whose log-norm series correlate at least this much (in absolute value) is
#: Cooperative (positive) or Competitive (negative); by convention |r| >= 0.5 is a strong correlation.
INTERACTION_CORR = 0.5
#: how many interacting pairs to keep, strongest first (bounds memory and output for 1,000 layers).
TOP_PAIRS = 50
#: rows of the series used for pairwise correlations (block-averaged).
CORR_ROWS = 512
#: a layer with more than this many risk factors is Critical even if none alone is (the original crate: > 2).
MAX_WARNING_FACTORS = 2


@dataclass
class RiskFactor:
    layer: str
    kind: str          #: nonfinite, exploding, vanishing, dead, weak, hot, unstable, oscillating, lr_high, lr_low
    severity: float    #: 0..1
    critical: bool
    evidence: str


def _fmt(x: float) -> str:
    return f"{x:.3g}" if np.isfinite(x) else "n/a"


#: the "typical layer" that weak / hot layers are measured against: this quantile of the log levels
#: (median gradient norm) of the layers with a usable gradient. The upper quartile, not the median:
#: a starved region (often half of a deep network, above the absolute vanishing threshold) cannot
#: pull it down and make the healthy output layers look "far stronger", and a few hot layers (up to
#: a quarter) cannot pull it up.
REFERENCE_QUANTILE = 0.75
REF_TEXT = "upper quartile of the layers with a usable gradient"


def reference_level(lvl: np.ndarray, usable: np.ndarray, fallback: np.ndarray) -> float:
    """``REFERENCE_QUANTILE`` of ``lvl`` over the ``usable`` layers (over ``fallback`` when none is
    usable); NaN without any finite level."""
    ref = usable if usable.any() else fallback
    return float(quantiles(lvl[ref][:, None], (REFERENCE_QUANTILE,))[0, 0]) if ref.any() else float("nan")


def risk_factors(s: Series, flow: pd.DataFrame) -> list[RiskFactor]:
    """Every risk factor that fires, with its evidence. Rules (thresholds from ``run.thresholds``):
    non-finite gradients (critical); max |g| above ``exploding`` on any step (critical: one explosion
    can wreck the weights); mean |g| below ``vanishing`` or zero fraction at least ``dead_zero_fraction`` on at
    least ``minor_issue_ratio`` of steps (critical from ``critical_issue_ratio``); median norm
    ``relative_vanishing`` times below / ``relative_exploding`` above the typical layer (the upper
    quartile of the layers that are neither vanishing nor dead, see ``REFERENCE_QUANTILE``); stability below
    ``unstable``; oscillation; median update/weight ratio outside the healthy band. A dead layer
    (exact zeros) is not also reported as vanishing or weak."""
    run, t, ex = s.run, s.run.thresholds, s.exact
    names = run.layer_names
    out: list[RiskFactor] = []

    def add(mask, kind, sev, crit, text):
        for i in np.flatnonzero(mask):
            out.append(RiskFactor(names[i], kind, float(np.clip(sev[i], 0, 1)), bool(crit[i]), text(i)))

    L = run.n_layers
    ok = s.trainable & (ex["known_steps"] > 0)
    by_design = np.array([zero_by_design(n) for n in names])  # a zero gradient there is no symptom
    nfs = ex["nonfinite_share"]
    add(ok & (nfs > 0), "nonfinite", np.ones(L), np.ones(L, bool),
        lambda i: f"non-finite (NaN/Inf) gradient entries on {nfs[i]:.0%} of steps "
                  f"({int(ex['nonfinite_total'][i])} entries in total)")
    es = ex["exploding_share"]
    finite_max = ex["max_abs_finite"]
    add(ok & (es > 0) & (nfs == 0), "exploding", 0.5 + 0.5 * es, np.ones(L, bool),
        lambda i: f"max |g| reached {_fmt(float(finite_max[i]))} (> {t.exploding:g}) on {es[i]:.0%} of steps")
    vs = ex["vanishing_share"]
    ds = ex["dead_share"]
    dead = ds >= t.minor_issue_ratio  # exact zeros: "dead" is the sharper diagnosis than "vanishing"
    add(ok & (vs >= t.minor_issue_ratio) & ~dead & ~by_design, "vanishing", vs, vs >= t.critical_issue_ratio,
        lambda i: f"mean |g| below {t.vanishing:g} on {vs[i]:.0%} of steps "
                  f"(median {_fmt(float(s.stat('mean_abs', 'median')[i]))})")
    add(ok & dead & ~by_design, "dead", ds, ds >= t.critical_issue_ratio,
        lambda i: f"at least {t.dead_zero_fraction:.0%} of gradient entries exactly zero on {ds[i]:.0%} of steps")
    gm = s.stat("grad_norm", "median")
    with np.errstate(invalid="ignore", divide="ignore"):
        lvl = np.log10(np.where(gm > 0, gm, np.nan))
    rel = lvl - reference_level(lvl, ok & ~dead & ~(vs >= t.minor_issue_ratio), ok)
    lo, hi = np.log10(t.relative_vanishing), np.log10(t.relative_exploding)
    with np.errstate(invalid="ignore"):
        add(ok & (rel < lo) & ~(vs >= t.minor_issue_ratio) & ~dead & ~by_design, "weak", (lo - rel) / max(-lo, 1e-12), np.zeros(L, bool),
            lambda i: f"median gradient norm {10 ** -rel[i]:.3g}x below the typical layer ({REF_TEXT})")
        add(ok & (rel > hi), "hot", (rel - hi) / max(hi, 1e-12), np.zeros(L, bool),
            lambda i: f"median gradient norm {10 ** rel[i]:.3g}x above the typical layer ({REF_TEXT})")
    st = flow["stability"].to_numpy()
    with np.errstate(invalid="ignore"):
        add(ok & (st < t.unstable), "unstable", 1 - st / t.unstable, np.zeros(L, bool),
            lambda i: f"gradient-norm stability 1/(1+CV) = {st[i]:.2f} (< {t.unstable:g})")
    osc, fr, r1 = flow["oscillation"].to_numpy(), flow["flow_rate"].to_numpy(), flow["autocorr_lag1"].to_numpy()
    add(ok & flow["oscillating"].to_numpy(bool), "oscillating", osc, np.zeros(L, bool),
        lambda i: f"norm alternates up and down (lag-1 autocorrelation {r1[i]:.2f}; direction changes on "
                  f"{osc[i]:.0%} of steps), moving {fr[i]:.0%} of its level per step")
    ur = update_ratio(s)
    with np.errstate(invalid="ignore", divide="ignore"):
        add(ok & (ur > t.update_ratio_high), "lr_high", np.log10(ur / t.update_ratio_high), np.zeros(L, bool),
            lambda i: f"median update/weight ratio {ur[i]:.3g} above {t.update_ratio_high:g}")
        add(ok & (ur < t.update_ratio_low) & (ds < t.minor_issue_ratio) & (vs < t.minor_issue_ratio), "lr_low",
            np.log10(t.update_ratio_low / ur), np.zeros(L, bool),
            lambda i: f"median update/weight ratio {ur[i]:.3g} below {t.update_ratio_low:g}")
    return out


def update_ratio(s: Series) -> np.ndarray:
    """Median over recorded steps of ||update|| / ||weight|| per layer (NaN without an optimizer;
    update_norm is measured every few steps, so NaN rows are skipped)."""
    if s._update_ratio is None:
        r = s.update_rows
        s._update_ratio = nanmedian(r) if r.shape[0] else np.full(s.run.n_layers, np.nan)
    return s._update_ratio


def convergence_indicator(s: Series) -> np.ndarray:
    """Per layer, how far the gradient norm fell over the last ``convergence_window`` steps, in
    decades, clipped to 0..1 (the original crate: negative trend slope over the window). NaN with fewer steps."""
    w = int(s.run.thresholds.convergence_window)
    x = s.recent
    if x.shape[0] < max(3, w):
        return np.full(x.shape[1], np.nan)
    slope, _ = lstsq_slope(log10_pos(x[-w:]))
    return np.clip(-slope * (w - 1), 0.0, 1.0)


def layer_health(s: Series, flow: pd.DataFrame, factors: list[RiskFactor]) -> pd.DataFrame:
    """One row per layer: health, risk (1 - prod(1 - severity)), flags, stability, neuron activity
    (1 - mean zero fraction), convergence indicator, update ratio and the comparative analysis
    (relative level to the median layer, rank by level, similar layers within 1.2x (as the original crate), gap in
    decades, optimisation potential = gap / the relative-vanishing gap, capped at 1)."""
    run, t, ex = s.run, s.run.thresholds, s.exact
    names = run.layer_names
    L = run.n_layers
    idx = {n: i for i, n in enumerate(names)}
    keep = np.ones(L)
    crit = np.zeros(L, bool)
    count = np.zeros(L, int)
    flags: list[list[str]] = [[] for _ in range(L)]
    for f in factors:
        i = idx[f.layer]
        keep[i] *= 1 - f.severity
        crit[i] |= f.critical
        count[i] += 1
        flags[i].append(f.kind)
    risk = 1 - keep
    known = s.trainable & (ex["known_steps"] > 0)
    health = np.where(~known, "Unknown", np.where(crit | (count > MAX_WARNING_FACTORS), "Critical",
                                                   np.where(count > 0, "Warning", "Healthy")))
    lvl = s.stat("mean_abs", "median")
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        llog = np.log10(np.where(lvl > 0, lvl, np.nan))
        med = nanmedian(llog[known]) if known.any() else np.nan
        rel = llog - med
        gap = np.abs(rel)
        potential = np.clip(gap / -np.log10(t.relative_vanishing), 0, 1)
    rank = pd.Series(np.where(known, lvl, np.nan)).rank(ascending=False, method="min").to_numpy()
    similar = _similar(llog, names, np.log10(1.2))
    return pd.DataFrame({
        "layer": names, "health": health, "risk": np.where(known, risk, np.nan), "flags": [", ".join(f) for f in flags],
        "n_factors": count, "stability": flow["stability"].to_numpy(),
        "neuron_activity": 1 - s.stat("zero_frac", "mean"), "convergence": convergence_indicator(s),
        "update_ratio": update_ratio(s), "relative_level": 10 ** rel, "rank": rank,
        "similar_layers": similar, "gap_decades": gap, "potential": potential,
    })


def _similar(llog: np.ndarray, names: list[str], tol: float, k: int = 5) -> list[list[str]]:
    """Up to ``k`` layers whose level is within ``tol`` decades, nearest first (sorted search: O(L log L))."""
    order = np.argsort(np.where(np.isfinite(llog), llog, np.inf))
    srt = llog[order]
    out: list[list[str]] = [[] for _ in names]
    for p, i in enumerate(order):
        if not np.isfinite(srt[p]):
            break
        lo, hi = max(0, p - k), min(len(srt), p + k + 1)
        cand = [order[q] for q in range(lo, hi) if q != p and abs(srt[q] - srt[p]) <= tol]
        cand.sort(key=lambda j: abs(llog[j] - srt[p]))
        out[i] = [names[j] for j in cand[:k]]
    return out


# --------------------------------------------------------------------------- network level
@dataclass
class Distribution:
    """Distribution across layers of their median gradient norm, in log10 (raw norms across layers
    span decades, so their raw skewness is always large)."""
    mean_log10: float
    std_log10: float
    skewness: float
    kurtosis: float
    kind: str           #: Normal / Skewed / HeavyTailed / Multimodal / Degenerate
    n_layers: int


def distribution(s: Series, known: np.ndarray) -> Distribution:
    """The original crate's (enhanced analysis) classification: Degenerate (fewer than 3 layers or no spread), Skewed (|skew| > 2),
    HeavyTailed (excess kurtosis > 3), Multimodal (excess kurtosis < -1, as a two-cluster mix gives),
    else Normal."""
    g = s.stat("grad_norm", "median")
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.log10(g[known & (g > 0)])
    if x.size < 3 or np.ptp(x) == 0:
        return Distribution(float(np.mean(x)) if x.size else float("nan"), 0.0, 0.0, 0.0, "Degenerate", int(x.size))
    m = moments(x[:, None])
    sk, ku = float(m["skewness"][0]), float(m["kurtosis"][0])
    kind = "Skewed" if abs(sk) > 2 else "HeavyTailed" if ku > 3 else "Multimodal" if ku < -1 else "Normal"
    return Distribution(float(m["mean"][0]), float(m["std"][0]), sk, ku, kind, int(x.size))


#: pairs correlating at or below minus this are Disruptive: one layer's gradient grows exactly
#: when the other's shrinks, so they pull training in turns (|r| >= 0.8: a very strong correlation).
DISRUPTIVE_CORR = 0.8


@dataclass
class Interaction:
    layer1: str
    layer2: str
    correlation: float
    interaction_type: str   #: Cooperative / Competitive / Disruptive / Neutral
    impact_score: float = float("nan")  #: |r| x the pair's share of the network's gradient energy


def energy_share(s: Series) -> np.ndarray:
    """Each layer's share of the network's gradient energy: median norm^2 / the sum over layers
    (0 for a layer without a usable norm). A coupled pair of tiny bias vectors matters less than
    a coupled pair of the largest matrices."""
    g = np.nan_to_num(s.stat("grad_norm", "median"), nan=0.0, posinf=0.0) ** 2
    tot = g.sum()
    return g / tot if tot > 0 else g


def _interaction_type(r: float) -> str:
    """The original crate's (enhanced analysis) interaction type from the correlation alone (it used a convergence difference)."""
    return ("Cooperative" if r >= INTERACTION_CORR else "Disruptive" if r <= -DISRUPTIVE_CORR
            else "Competitive" if r <= -INTERACTION_CORR else "Neutral")


def interactions(s: Series, top_k: int = TOP_PAIRS, block: int = 256) -> list[Interaction]:
    """The ``top_k`` most strongly correlated pairs of layers (Pearson r of their log10 gradient-norm
    series, block-averaged to ``CORR_ROWS`` rows): Cooperative (r >= ``INTERACTION_CORR``),
    Competitive (r <= -``INTERACTION_CORR``), Disruptive (r <= -``DISRUPTIVE_CORR``), else Neutral;
    impact = |r| x the pair's ``energy_share`` (the original crate halved a similarity of means). Computed block-wise: a ``(block, L)`` slice of the
    correlation matrix at a time, keeping a running top-k, so memory is O(block x L + k), never L^2."""
    x, _ = block_mean(s.coarse, CORR_ROWS)
    names = s.run.layer_names
    z, valid = standardized(x)
    L = z.shape[1]
    best_r = np.zeros(0)
    best_ij = np.zeros((0, 2), np.int64)
    for a in range(0, L, block):
        b = min(L, a + block)
        c = z[:, a:b].T @ z  # (b - a, L)
        i, j = np.nonzero(np.triu(np.ones((b - a, L), bool), k=a + 1) & valid[a:b, None] & valid[None, :])
        r = c[i, j]
        if r.size > top_k:
            keep = np.argpartition(-np.abs(r), top_k)[:top_k]
            i, j, r = i[keep], j[keep], r[keep]
        best_r = np.concatenate([best_r, r])
        best_ij = np.concatenate([best_ij, np.stack([i + a, j], 1)])
        if best_r.size > top_k:
            keep = np.argpartition(-np.abs(best_r), top_k)[:top_k]
            best_r, best_ij = best_r[keep], best_ij[keep]
    order = np.argsort(-np.abs(best_r), kind="stable")
    share = energy_share(s)
    out = []
    for k in order:
        i, j, r = best_ij[k, 0], best_ij[k, 1], float(np.clip(best_r[k], -1, 1))
        out.append(Interaction(names[i], names[j], r, _interaction_type(r), abs(r) * float(share[i] + share[j])))
    return out


def _progress_series(run) -> tuple[np.ndarray, np.ndarray, str]:
    """The series training progress is judged on: the loss when recorded, else the global norm."""
    loss = run.scalar("loss")
    if np.isfinite(loss).sum() >= 3:
        return loss, run.steps, "loss"
    return run.scalar("global_norm"), run.steps, "global gradient norm"


@dataclass
class Convergence:
    gradient: float         #: median layer convergence indicator
    loss: float             #: decades the loss fell over the window, clipped 0..1
    parameters: float       #: decades the median update/weight ratio fell over the window, clipped 0..1
    rel_change_per_step: float
    trend: str              #: Converging / Stable / Diverging / Unknown
    series: str             #: which series the trend is read from
    estimated_steps_to_convergence: int | None = None  #: user steps until the rate falls below
                                                        #: plateau_rel_change (see ``steps_to_convergence``)
    estimate_basis: str = ""  #: how the estimate was made, or why there is none


def _rel_slope(y: np.ndarray, window: int, x: np.ndarray | None = None) -> tuple[float, float]:
    """Relative change per step (slope of ln y against ``x``, the point index when None) over the
    last ``window`` finite points, and its R^2."""
    sl, _, r2, _ = trend_fit(y, window, x)
    return sl, r2


def convergence(s: Series, health: pd.DataFrame) -> Convergence:
    run, t = s.run, s.run.thresholds
    w = int(t.convergence_window)
    y, steps, what = _progress_series(run)
    rel, _ = _rel_slope(y, w, steps)  # per user step, as plateau_rel_change
    loss_fall, _ = _rel_slope(run.scalar("loss"), w)
    r = s.update_rows
    ratio = nanmedian(r, axis=1) if r.size else np.zeros(0)
    par, _ = _rel_slope(ratio, w)
    ln10 = np.log(10)
    trend = ("Unknown" if not np.isfinite(rel) else "Converging" if rel < -t.plateau_rel_change
             else "Diverging" if rel > t.plateau_rel_change else "Stable")

    def clip(v: float) -> float:
        return float(np.clip(-v * (w - 1) / ln10, 0, 1)) if np.isfinite(v) else float("nan")

    with _quiet():
        g = float(nanmedian(health["convergence"])) if np.isfinite(health["convergence"]).any() else float("nan")
    eta, why = steps_to_convergence(y, run.steps, w, t.plateau_rel_change)
    return Convergence(g, clip(loss_fall), clip(par), rel, trend, what, eta, why)


#: a decay-onto-a-floor fit must explain at least this share of the variance to be extrapolated.
DECAY_FIT_R2 = 0.9


def fit_decay(y: np.ndarray, x: np.ndarray) -> tuple[float, float, float, float]:
    """Least-squares fit of y = c + a e^(-k (x - x0)) (x0 the first x): (c, a, k, R^2). For each k of a
    log grid (then a finer one around the best) c and a are linear least squares."""
    x = np.asarray(x, np.float64) - x[0]
    span = max(float(x[-1]), 1.0)
    best = (np.nan, np.nan, np.nan, -np.inf)
    grid = np.geomspace(0.1 / span, 50.0 / span, 80)
    for _ in range(2):
        for k in grid:
            A = np.column_stack([np.ones_like(x), np.exp(-k * x)])
            coef = np.linalg.lstsq(A, y, rcond=None)[0]
            sse = float(np.sum((A @ coef - y) ** 2))
            if -sse > best[3]:
                best = (float(coef[0]), float(coef[1]), float(k), -sse)
        step = grid[1] / grid[0]
        grid = np.geomspace(best[2] / step, best[2] * step, 41)
    syy = float(np.sum((y - y.mean()) ** 2))
    c, a, k, neg = best
    return c, a, k, (1 + neg / syy) if syy > 0 else 0.0


def steps_to_convergence(y: np.ndarray, steps: np.ndarray, w: int, r: float) -> tuple[int | None, str]:
    """User steps after the last one until the series' relative change per user step falls below ``r``
    (the plateau threshold), and how that was read. The trailing half of the series (at least 2
    ``w`` points) is fitted with a decay onto a floor, y = c + a e^(-kt) (``fit_decay``); its rate
    a k e^(-kt) / y drops below ``r`` once e^(-kt) < r c / (a (k - r)). 0 when the last ``w``
    points already change by less than ``r``; None (with the reason) when the series rises, has too
    few points, does not follow such a decay (R^2 below ``DECAY_FIT_R2``), or decays towards zero
    (c <= 0: a constant relative rate never flattens)."""
    ok = np.isfinite(y) & (y > 0)
    y, steps = np.asarray(y, np.float64)[ok], np.asarray(steps, np.float64)[ok]
    now, _ = _rel_slope(y, w, steps)
    if not np.isfinite(now):
        return None, "fewer than 3 finite positive points"
    if abs(now) <= r:
        return 0, f"already changing by {abs(now):.2g} per step (below {r:g})"
    if now > 0:
        return None, f"rising by {now:.2g} per step: not converging"
    m = max(2 * w, y.size // 2)
    if y.size < m or y.size < 2 * w:
        return None, f"a decay fit needs {2 * w} points, {y.size} recorded"
    keep = np.unique(np.linspace(y.size - m, y.size - 1, min(m, 2048)).round().astype(np.int64))  # bounded cost
    c, a, k, r2 = fit_decay(y[keep], steps[keep])
    if not r2 >= DECAY_FIT_R2 or not a > 0:
        return None, f"the series does not follow a decay onto a floor (fit R² {r2:.2f})"
    if not c > 0:
        return None, "it decays towards zero at a steady relative rate, which never flattens"
    if k <= r:  # the fitted rate a k e^(-kt) / y never exceeds k
        return 0, f"the fitted decay rate {k:.2g} per step is already below {r:g}"
    t_end = np.log(a * (k - r) / (r * c)) / k  # since the fit's first step
    left = t_end - (steps[-1] - steps[-m])
    return int(max(0, np.ceil(left))), (f"fit {c:.3g} + {a:.3g} e^(-{k:.3g} t) (R² {r2:.2f}) to the last {m} "
                                        f"points; its rate falls below {r:g} {max(0.0, left):.0f} steps after the last")


@dataclass
class Plateau:
    is_plateau: bool
    duration_steps: int      #: user steps from start_step to end_step (0 without a plateau)
    severity: str            #: None / Mild / Moderate / Severe (share of the run on the plateau)
    rel_change_per_step: float  #: the flat stretch's least-squares slope / its mean level, per user step
    suggested_actions: list[str] = field(default_factory=list)
    start_step: int | None = None  #: first step of the trailing flat stretch (None when there is none)
    end_step: int | None = None    #: its last step: the last recorded step


#: a point departs from a flat stretch when it is more than this many noise standard deviations
#: (robust, from first differences) off the stretch's least-squares line.
PLATEAU_BAND_SIGMA = 4.0
#: candidate starts tried at full resolution per pass (coarser first, then refined).
_PLATEAU_GRID = 256


def _running_median(y: np.ndarray, width: int = 5) -> np.ndarray:
    """Centred running median (edges padded with the end values): one outlying point cannot end a
    plateau."""
    if y.size < width:
        return y
    h = width // 2
    p = np.concatenate([np.full(h, y[0]), y, np.full(h, y[-1])])
    return np.median(np.lib.stride_tricks.sliding_window_view(p, width), axis=1)


def _noise_sigma(y: np.ndarray) -> float:
    """Robust standard deviation of the point-to-point noise: MAD of the first differences / sqrt 2."""
    if y.size < 3:
        return 0.0
    d = np.diff(y)
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def _flat_from(y: np.ndarray, x: np.ndarray, j: int, sigma: float, ys: np.ndarray, r: float,
               total: float) -> tuple[bool, float]:
    """Whether ``y[j:]`` is flat, and its relative slope per unit of ``x``: its least-squares slope is
    not significantly (2 standard errors under the noise ``sigma``) above ``r`` of its mean level per
    unit of ``x``, nor its line's rise or fall over the stretch above ``total`` of that level; and no
    point of the smoothed series ``ys`` is more than ``PLATEAU_BAND_SIGMA`` sigma (at least ``r`` of
    the level) off the line."""
    yy, xx = y[j:], x[j:]
    level = abs(float(np.mean(yy)))
    xc = xx - xx.mean()
    sxx = float(xc @ xc)
    if sxx <= 0 or not level > 0:
        return False, float("nan")
    slope = float(xc @ (yy - yy.mean())) / sxx
    se = sigma / np.sqrt(sxx)
    tol = max(PLATEAU_BAND_SIGMA * sigma, r * level)
    off = np.abs(ys[j:] - (yy.mean() + slope * xc))
    width = float(xx[-1] - xx[0])
    flat = abs(slope) <= r * level + 2 * se and abs(slope) * width <= total * level + 2 * se * width
    return bool(flat and off.max() <= tol), slope / level


def _trailing_plateau(y: np.ndarray, x: np.ndarray, r: float, total: float) -> tuple[int, float]:
    """Start index of the longest flat suffix of ``y`` (at positions ``x``), scanning back from the end
    and stopping at the first suffix that is not flat (coarse candidates first, then every index
    between the last flat and first non-flat one), and the flat stretch's relative slope. The noise
    is measured on the last quarter, then again on the stretch found. ``len(y) - 1`` when not even
    the last 3 points are flat."""
    n = y.size
    if n < 3:
        return n - 1, float("nan")
    ys = _running_median(y)
    j, rel = n - 1, float("nan")
    sigma = _noise_sigma(y[-max(3, n // 4):])
    for _ in range(2):
        c = max(1, n // _PLATEAU_GRID)
        grid = list(range(n - 3, -1, -c))
        last_ok, last_rel, bad = n - 1, float("nan"), None
        for g in grid:
            ok, rr = _flat_from(y, x, g, sigma, ys, r, total)
            if not ok:
                bad = g
                break
            last_ok, last_rel = g, rr
        if bad is not None and c > 1:  # refine between the first non-flat and the last flat candidate
            for g in range(min(last_ok, n - 3) - 1, bad, -1):
                ok, rr = _flat_from(y, x, g, sigma, ys, r, total)
                if not ok:
                    break
                last_ok, last_rel = g, rr
        j, rel = last_ok, last_rel
        if j >= n - 3:
            break
        sigma = _noise_sigma(y[j:])  # the stretch's own noise: the slope before it is not noise
    return j, rel


@dataclass
class Dynamics:
    learning_phase: str      #: InitialLearning / RapidLearning / Refinement / Plateau / Diverging / Unknown
    rel_change_per_step: float
    plateau: Plateau
    series: str
    gradient_momentum: float = float("nan")  #: lag-1 autocorrelation of the global norm's log changes
    learning_velocity: float = float("nan")  #: mean share of the progress series shed per user step
    adaptation_rate: float = float("nan")    #: learning_velocity of the window's second half minus its first


def velocity(y: np.ndarray, steps: np.ndarray) -> float:
    """Mean relative fall per user step, -mean(Δy / y_prev / Δstep): positive while a loss falls
    (0.01 for y = 0.99^t), negative while it rises; NaN with fewer than 2 usable points."""
    y, steps = np.asarray(y, np.float64), np.asarray(steps, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = -np.diff(y) / y[:-1] / np.diff(steps)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else float("nan")


def momentum(g: np.ndarray) -> float:
    """Lag-1 autocorrelation of the changes of ln g: about -0.5 for a steady norm plus batch noise
    (differencing white noise gives -0.5), 0 for a random walk, towards +1 when the norm keeps moving
    the same way (persistent drift), towards -1 when it alternates. NaN with fewer than 4 points."""
    g = np.asarray(g, np.float64)
    d = np.diff(np.log(g[np.isfinite(g) & (g > 0)]))
    if d.size < 3:
        return float("nan")
    d = d - d.mean()
    den = float(d @ d)
    return float(d[1:] @ d[:-1]) / den if den > 0 else float("nan")


def _rates(y: np.ndarray, steps: np.ndarray, g: np.ndarray, w: int) -> tuple[float, float, float]:
    """(gradient_momentum, learning_velocity, adaptation_rate) over the last ``w`` points: the original crate's enhanced analysis
    scaled one convergence score into all three; here each is measured (see ``momentum``,
    ``velocity``)."""
    y, steps = y[-w:], steps[-w:]
    h = y.size // 2
    adapt = velocity(y[h:], steps[h:]) - velocity(y[:h + 1], steps[:h + 1]) if y.size >= 4 else float("nan")
    return momentum(g[-w:]), velocity(y, steps), adapt


def dynamics(s: Series) -> Dynamics:
    """Learning phase and plateau from the progress series (loss, else global norm; block-averaged to
    at most 4096 points on long runs).

    Plateau: the trailing stretch over which the series is flat (see ``_trailing_plateau``): its
    relative change per step is below ``plateau_rel_change`` and its total change below
    ``plateau_total_change`` of its level, up to noise, and no point leaves the
    band around its line. No moving average, so its start is where the series really flattens (a
    smoothed comparison missed plateaus shorter than two windows and moved their start). It counts as
    a plateau once it lasts ``convergence_window`` steps (or half a shorter run); severity from the
    share of the run it covers.
    Phases: Unknown (fewer than 3 finite values of the series although steps were recorded),
    InitialLearning (fewer steps than the window), Plateau, Diverging (loss rising by more than
    ``plateau_rel_change`` per step over the last window), RapidLearning (falling by more than
    ``rapid_rel_change``), else Refinement."""
    run, t = s.run, s.run.thresholds
    y, steps, what = _progress_series(run)
    ok = np.isfinite(y)
    y, steps = y[ok], steps[ok]
    W = int(t.convergence_window)
    if y.size < 3:
        phase = "InitialLearning" if 0 < run.n_steps < 3 and y.size == run.n_steps else "Unknown"
        return Dynamics(phase, float("nan"), Plateau(False, 0, "None", float("nan")), what)
    yb, k = block_mean(y[:, None], 4096)
    yb = yb[:, 0]
    sb = steps[len(steps) - (len(steps) // k) * k:][::k].astype(np.float64)
    j, rel = _trailing_plateau(yb, sb, t.plateau_rel_change, t.plateau_total_change)
    start = int(steps[0]) if j == 0 else int(sb[j])  # a whole-run plateau starts at the first step
    duration = int(steps[-1]) - start
    span = int(steps[-1] - steps[0])
    is_plateau = j < len(yb) - 1 and duration >= min(W, span // 2) and duration > 0
    share = duration / max(1, span)
    sev = ("None" if not is_plateau else "Severe" if share >= t.critical_issue_ratio
           else "Moderate" if share >= t.problem_issue_ratio else "Mild")
    acts = []
    if is_plateau:
        acts = ["try a learning-rate schedule (warm restart or decay), or check that the model can still learn "
                "(vanishing or dead layers)"]
    rel_now, _ = _rel_slope(y, W, steps)  # per user step, as the thresholds
    if is_plateau:
        phase = "Plateau"
    elif len(y) < W:
        phase = "InitialLearning"
    elif rel_now > t.plateau_rel_change:
        phase = "Diverging" if what == "loss" else "Refinement"
    elif rel_now < -t.rapid_rel_change:
        phase = "RapidLearning"
    else:
        phase = "Refinement"
    plateau = Plateau(is_plateau, duration if is_plateau else 0, sev, float(rel), acts,
                      start if is_plateau else None, int(steps[-1]) if is_plateau else None)
    g = run.scalar("global_norm")
    return Dynamics(phase, float(rel_now), plateau, what, *_rates(y, steps, g[np.isfinite(g)], W))


@dataclass
class InstabilitySource:
    kind: str
    layers: list[str]
    severity: float
    description: str


@dataclass
class Forecast:
    outlook: str            #: Improving / Stable / Deteriorating / Uncertain
    projected_decades: float  #: change of the global norm over the next window if the trend holds
    confidence: float       #: probability of the outlook given the fitted trend's uncertainty (see ``forecast``)
    basis: str
    interval: tuple[float, float] = (float("nan"), float("nan"))  #: 95% interval of projected_decades
    stable_band: float = float("nan")  #: |projected change| up to this many decades counts as Stable
    r2: float = float("nan")  #: share of the window's variance the line explains (~0 for a flat series)
    most_likely: str = ""     #: the most probable trend (confidence is its probability when Uncertain)
    steady: bool = True       #: the layers' median stability allowed a Stable outlook
    horizon: int = 0          #: recorded steps the projection looks ahead (the convergence window)


#: an outlook is stated only when the fitted trend makes it at least this probable; else Uncertain.
FORECAST_CONFIDENCE = 0.8


def _phi(z: float) -> float:
    """Standard normal CDF (inf-safe)."""
    from math import erf

    return 0.5 * (1.0 + erf(z / np.sqrt(2.0))) if np.isfinite(z) else float(z > 0)


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


def forecast(g: np.ndarray, window: int, band: float, steady: bool) -> Forecast:
    """Extrapolate the trend of the global norm ``g`` over the next ``window`` steps. With P the
    normal probability under the slope's standard error: Stable (projected change within
    +/-``band`` decades; only for a ``steady`` network), Deteriorating (above), Improving (below);
    the most probable is stated when its probability reaches ``FORECAST_CONFIDENCE``, else
    Uncertain. Confidence is that probability, not R^2: a flat series has R^2 ~ 0 by construction
    however sure its flatness is."""
    sl, se, r2, n = trend_fit(g, window)
    if not np.isfinite(sl):
        return Forecast("Uncertain", float("nan"), float("nan"),
                        f"no trend: {n} recorded step{'s' if n != 1 else ''} with a finite positive global "
                        "gradient norm (at least 3 are needed)", stable_band=band)
    k = window / np.log(10)  # ln per step -> decades per window
    proj, sp = sl * k, se * k
    if sp > 0:
        hi, lo = _phi((band - proj) / sp), _phi((-band - proj) / sp)
    else:
        hi, lo = float(proj <= band), float(proj < -band)
    p = {"Stable": hi - lo, "Deteriorating": 1 - hi, "Improving": lo}
    best = max(p, key=lambda k: p[k])
    outlook = best if p[best] >= FORECAST_CONFIDENCE and (best != "Stable" or steady) else "Uncertain"
    basis = (f"least-squares trend of log global gradient norm over the last {n} steps: {_fmt(proj)} decades "
             f"per {window} steps (95% interval {_fmt(proj - 1.96 * sp)} to {_fmt(proj + 1.96 * sp)}); "
             f"Stable within ±{_fmt(band)}" + ("" if steady else "; the layers are unsteady, so not Stable"))
    return Forecast(outlook, float(proj), float(p[best]), basis, (float(proj - 1.96 * sp), float(proj + 1.96 * sp)),
                    float(band), r2, best, steady, int(window))


@dataclass
class Stability:
    overall: float          #: median layer stability
    trend: str              #: Improving / Stable / Degrading (first vs last quarter of the run); Unknown
                            #: with fewer than 8 finite global norms
    quarters: list[float]   #: stability 1/(1+CV) of the global norm per quarter of the run
    sources: list[InstabilitySource]
    forecast: Forecast


def stability(s: Series, flow: pd.DataFrame, factors: list[RiskFactor], max_sources: int = 20) -> Stability:
    """Network stability: the median layer stability; its trend from the global norm's stability in
    the first and last quarter of the run; the instability sources (layers with exploding,
    non-finite, vanishing, oscillating or unstable factors, strongest first); and a forecast that
    extrapolates the last ``convergence_window`` steps of the global norm (see ``forecast``): Stable
    when the projected change stays within the pace of ``trend_decades`` per run."""
    run, t = s.run, s.run.thresholds
    with _quiet():
        overall = float(nanmedian(flow["stability"][s.trainable])) if np.isfinite(flow["stability"][s.trainable]).any() else float("nan")
    g = run.scalar("global_norm")
    g = g[np.isfinite(g)]
    quarters = []
    if g.size >= 8:
        for part in np.array_split(g, 4):
            m = part.mean()
            quarters.append(float(1 / (1 + part.std() / m)) if m > 0 else float("nan"))
    trend = "Unknown"  # fewer than 8 finite global norms: nothing to compare
    if len(quarters) == 4 and all(np.isfinite(quarters)):
        trend = "Stable"
        if quarters[-1] < t.stable_network <= quarters[0] or (quarters[-1] < quarters[0] and quarters[-1] < t.unstable):
            trend = "Degrading"
        elif quarters[0] < t.stable_network <= quarters[-1]:
            trend = "Improving"
    kinds = {"exploding": "GradientExplosion", "nonfinite": "NonFinite", "vanishing": "GradientVanishing",
             "oscillating": "Oscillation", "unstable": "Instability", "dead": "DeadGradients"}
    srcs = [InstabilitySource(kinds[f.kind], [f.layer], f.severity, f"{f.layer}: {f.evidence}")
            for f in factors if f.kind in kinds]
    srcs.sort(key=lambda x: -x.severity)
    W = int(t.convergence_window)
    steady = bool(np.isfinite(overall) and overall >= t.unstable)
    fc = forecast(g, W, t.trend_decades * W / max(1, run.n_steps), steady)
    return Stability(overall, trend, quarters, srcs[:max_sources], fc)


def overall_health(health: pd.DataFrame, exact: dict) -> str:
    """Critical when any layer had non-finite gradients or more than 30% of known layers are Critical
    (as the original crate); Warning when any layer is Critical or more than 10% are Warning; Unknown without any
    known layer; else Healthy."""
    h = health["health"]
    known = h != "Unknown"
    n = int(known.sum())
    if n == 0:
        return "Unknown"
    crit = float((h == "Critical").sum()) / n
    warn = float((h == "Warning").sum()) / n
    if (exact["nonfinite_share"] > 0).any() or crit > 0.3:
        return "Critical"
    if crit > 0 or warn > 0.1:
        return "Warning"
    return "Healthy"
