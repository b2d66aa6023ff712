"""Network stability: the layers' median stability, its trend over the run, the instability
sources, and a forecast of the global gradient norm with a stated confidence (the probability of
its outlook under the fitted trend, not R^2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .stats import Series, _quiet, fmt_num as _fmt, nanmedian, trend_fit

if TYPE_CHECKING:
    from .risk_factor import RiskFactor


@dataclass
class InstabilitySource:
    kind: str
    layers: list[str]
    severity: float
    description: str


@dataclass
class Forecast:
    outlook: str  #: Improving / Stable / Deteriorating / Uncertain
    projected_decades: float  #: change of the global norm over the next window if the trend holds
    confidence: float  #: probability of the outlook given the fitted trend's uncertainty (see ``forecast``)
    basis: str
    interval: tuple[float, float] = (float("nan"), float("nan"))  #: 95% interval of projected_decades
    stable_band: float = float("nan")  #: |projected change| up to this many decades counts as Stable
    r2: float = float("nan")  #: share of the window's variance the line explains (~0 for a flat series)
    most_likely: str = ""  #: the most probable trend (confidence is its probability when Uncertain)
    steady: bool = True  #: the layers' median stability allowed a Stable outlook
    horizon: int = 0  #: recorded steps the projection looks ahead (the convergence window)


#: an outlook is stated only when the fitted trend makes it at least this probable; else Uncertain.
FORECAST_CONFIDENCE = 0.8


def _phi(z: float) -> float:
    """Standard normal CDF (inf-safe)."""
    from math import erf

    return 0.5 * (1.0 + erf(z / np.sqrt(2.0))) if np.isfinite(z) else float(z > 0)


def forecast(g: np.ndarray, window: int, band: float, steady: bool) -> Forecast:
    """Extrapolate the trend of the global norm ``g`` over the next ``window`` steps. With P the
    normal probability under the slope's standard error: Stable (projected change within
    +/-``band`` decades; only for a ``steady`` network), Deteriorating (above), Improving (below);
    the most probable is stated when its probability reaches ``FORECAST_CONFIDENCE``, else
    Uncertain. Confidence is that probability, not R^2: a flat series has R^2 ~ 0 by construction
    however sure its flatness is."""
    sl, se, r2, n = trend_fit(g, window)
    if not np.isfinite(sl):
        return Forecast(
            "Uncertain",
            float("nan"),
            float("nan"),
            f"no trend: {n} recorded step{'s' if n != 1 else ''} with a finite positive global "
            "gradient norm (at least 3 are needed)",
            stable_band=band,
        )
    k = window / np.log(10)  # ln per step -> decades per window
    proj, sp = sl * k, se * k
    if sp > 0:
        hi, lo = _phi((band - proj) / sp), _phi((-band - proj) / sp)
    else:
        hi, lo = float(proj <= band), float(proj < -band)
    p = {"Stable": hi - lo, "Deteriorating": 1 - hi, "Improving": lo}
    best = max(p, key=lambda k: p[k])
    outlook = best if p[best] >= FORECAST_CONFIDENCE and (best != "Stable" or steady) else "Uncertain"
    basis = (
        f"least-squares trend of log global gradient norm over the last {n} steps: {_fmt(proj)} decades "
        f"per {window} steps (95% interval {_fmt(proj - 1.96 * sp)} to {_fmt(proj + 1.96 * sp)}); "
        f"Stable within ±{_fmt(band)}" + ("" if steady else "; the layers are unsteady, so not Stable")
    )
    return Forecast(
        outlook,
        float(proj),
        float(p[best]),
        basis,
        (float(proj - 1.96 * sp), float(proj + 1.96 * sp)),
        float(band),
        r2,
        best,
        steady,
        int(window),
    )


@dataclass
class Stability:
    overall: float  #: median layer stability
    trend: str  #: Improving / Stable / Degrading (first vs last quarter of the run); Unknown
    #: with fewer than 8 finite global norms
    quarters: list[float]  #: stability 1/(1+CV) of the global norm per quarter of the run
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
        overall = (
            float(nanmedian(flow["stability"][s.trainable]))
            if np.isfinite(flow["stability"][s.trainable]).any()
            else float("nan")
        )
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
    kinds = {
        "exploding": "GradientExplosion",
        "nonfinite": "NonFinite",
        "vanishing": "GradientVanishing",
        "oscillating": "Oscillation",
        "unstable": "Instability",
        "dead": "DeadGradients",
    }
    srcs = [
        InstabilitySource(kinds[f.kind], [f.layer], f.severity, f"{f.layer}: {f.evidence}")
        for f in factors
        if f.kind in kinds
    ]
    srcs.sort(key=lambda x: -x.severity)
    W = int(t.convergence_window)
    steady = bool(np.isfinite(overall) and overall >= t.unstable)
    fc = forecast(g, W, t.trend_decades * W / max(1, run.n_steps), steady)
    return Stability(overall, trend, quarters, srcs[:max_sources], fc)
