"""Training progress over time: convergence (how far gradients, loss and updates fell over the
last window, and the steps still to go) and training dynamics (phase, velocity, momentum, plateau
detection), as the original crate's enhanced analysis had them (see ``health`` for what was not
carried over and why)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .stats import Series, _quiet, block_mean, nanmedian, trend_fit
from .trend import theil_sen


def _progress_series(run) -> tuple[np.ndarray, np.ndarray, str]:
    """The series training progress is judged on: the loss when recorded, else the global norm."""
    loss = run.scalar("loss")
    if np.isfinite(loss).sum() >= 3:
        return loss, run.steps, "loss"
    return run.scalar("global_norm"), run.steps, "global gradient norm"


@dataclass
class Convergence:
    gradient: float  #: median layer convergence indicator
    loss: float  #: decades the loss fell over the window, clipped 0..1
    parameters: float  #: decades the median update/weight ratio fell over the window, clipped 0..1
    rel_change_per_step: float
    trend: str  #: Converging / Stable / Diverging / Unknown
    series: str  #: which series the trend is read from
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
    trend = (
        "Unknown"
        if not np.isfinite(rel)
        else "Converging"
        if rel < -t.plateau_rel_change
        else "Diverging"
        if rel > t.plateau_rel_change
        else "Stable"
    )

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
    return int(max(0, np.ceil(left))), (
        f"fit {c:.3g} + {a:.3g} e^(-{k:.3g} t) (R² {r2:.2f}) to the last {m} "
        f"points; its rate falls below {r:g} {max(0.0, left):.0f} steps after the last"
    )


@dataclass
class Plateau:
    is_plateau: bool
    duration_steps: int  #: user steps from start_step to end_step (0 without a plateau)
    severity: str  #: None / Mild / Moderate / Severe (share of the run on the plateau)
    rel_change_per_step: float  #: the flat stretch's least-squares slope / its mean level, per user step
    suggested_actions: list[str] = field(default_factory=list)
    start_step: int | None = None  #: first step of the trailing flat stretch (None when there is none)
    end_step: int | None = None  #: its last step: the last recorded step


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


def _flat_from(
    y: np.ndarray, x: np.ndarray, j: int, sigma: float, ys: np.ndarray, r: float, total: float
) -> tuple[bool, float]:
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
    sigma = _noise_sigma(y[-max(3, n // 4) :])
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


def _provably_flat(y: np.ndarray, x: np.ndarray, t) -> bool:
    """The stretch is flat for certain, not merely too noisy or too short to show its slope: the
    whole 99% interval of its Theil-Sen slope lies within ``plateau_rel_change`` of its level per
    step, or its change over the stretch within ``plateau_total_change`` of it (a noisy loss that
    falls 1% a step over 40 steps is progress, whatever a least-squares test fails to reject)."""
    tr = theil_sen(y, x)
    level = abs(float(np.median(y)))
    return tr is not None and tr.flat_within(t.plateau_rel_change * level, t.plateau_total_change * level)


@dataclass
class Dynamics:
    learning_phase: str  #: InitialLearning / RapidLearning / Refinement / Plateau / Diverging / Unknown
    rel_change_per_step: float
    plateau: Plateau
    series: str
    gradient_momentum: float = float("nan")  #: lag-1 autocorrelation of the global norm's log changes
    learning_velocity: float = float("nan")  #: mean share of the progress series shed per user step
    adaptation_rate: float = float("nan")  #: learning_velocity of the window's second half minus its first


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
    adapt = velocity(y[h:], steps[h:]) - velocity(y[: h + 1], steps[: h + 1]) if y.size >= 4 else float("nan")
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
    sb = steps[len(steps) - (len(steps) // k) * k :][::k].astype(np.float64)
    j, rel = _trailing_plateau(yb, sb, t.plateau_rel_change, t.plateau_total_change)
    start = int(steps[0]) if j == 0 else int(sb[j])  # a whole-run plateau starts at the first step
    duration = int(steps[-1]) - start
    span = int(steps[-1] - steps[0])
    is_plateau = (
        j < len(yb) - 1 and duration >= min(W, span // 2) and duration > 0 and _provably_flat(yb[j:], sb[j:], t)
    )
    share = duration / max(1, span)
    sev = (
        "None"
        if not is_plateau
        else "Severe"
        if share >= t.critical_issue_ratio
        else "Moderate"
        if share >= t.problem_issue_ratio
        else "Mild"
    )
    acts = []
    if is_plateau:
        acts = [
            "try a learning-rate schedule (warm restart or decay), or check that the model can still learn "
            "(vanishing or dead layers)"
        ]
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
    plateau = Plateau(
        is_plateau,
        duration if is_plateau else 0,
        sev,
        float(rel),
        acts,
        start if is_plateau else None,
        int(steps[-1]) if is_plateau else None,
    )
    g = run.scalar("global_norm")
    return Dynamics(phase, float(rel_now), plateau, what, *_rates(y, steps, g[np.isfinite(g)], W))
