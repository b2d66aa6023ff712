"""Health: per-layer risk factors and Healthy / Warning / Critical / Unknown, comparative analysis,
and the network view, as the original crate's enhanced analysis had them. This module holds the
layer level and the overall health; the network level lives in ``interplay`` (distribution of
layer levels, layer interactions), ``dynamics`` (convergence, training dynamics with plateau
detection) and ``stability`` (stability assessment and forecast).

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


import numpy as np
import pandas as pd

from ..rules import CANNOT_MOVE
from .risk_factor import RiskFactor
from .stats import Series, _quiet, fmt_num as _fmt, log10_pos, lstsq_slope, nanmedian, quantiles


HEALTH = ("Healthy", "Warning", "Critical", "Unknown", CANNOT_MOVE)
#: a layer with more than this many risk factors is Critical even if none alone is (the original crate: > 2).
MAX_WARNING_FACTORS = 2


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
    (exact zeros) is not also reported as vanishing or weak. A parameter the loss cannot move
    (``Series.cannot_move``: its gradient is rounding noise) gets only the non-finite and exploding
    factors: every other statistic of its gradient is a statistic of that noise."""
    run, t, ex = s.run, s.run.thresholds, s.exact
    names = run.layer_names
    out: list[RiskFactor] = []

    def add(mask, kind, sev, crit, text):
        for i in np.flatnonzero(mask):
            out.append(RiskFactor(names[i], kind, float(np.clip(sev[i], 0, 1)), bool(crit[i]), text(i)))

    L = run.n_layers
    got = s.trainable & (ex["known_steps"] > 0)
    ok = got & ~s.cannot_move  # a gradient that is rounding noise has no other symptom
    nfs = ex["nonfinite_share"]
    add(
        got & (nfs > 0),
        "nonfinite",
        np.ones(L),
        np.ones(L, bool),
        lambda i: (
            f"non-finite (NaN/Inf) gradient entries on {nfs[i]:.0%} of steps "
            f"({int(ex['nonfinite_total'][i])} entries in total)"
        ),
    )
    es = ex["exploding_share"]
    finite_max = ex["max_abs_finite"]
    add(
        got & (es > 0) & (nfs == 0),
        "exploding",
        0.5 + 0.5 * es,
        np.ones(L, bool),
        lambda i: f"max |g| reached {_fmt(float(finite_max[i]))} (> {t.exploding:g}) on {es[i]:.0%} of steps",
    )
    vs = ex["vanishing_share"]
    ds = ex["dead_share"]
    dead = ds >= t.minor_issue_ratio  # exact zeros: "dead" is the sharper diagnosis than "vanishing"
    add(
        ok & (vs >= t.minor_issue_ratio) & ~dead,
        "vanishing",
        vs,
        vs >= t.critical_issue_ratio,
        lambda i: (
            f"mean |g| below {t.vanishing:g} on {vs[i]:.0%} of steps "
            f"(median {_fmt(float(s.stat('mean_abs', 'median')[i]))})"
        ),
    )
    add(
        ok & dead,
        "dead",
        ds,
        ds >= t.critical_issue_ratio,
        lambda i: f"at least {t.dead_zero_fraction:.0%} of gradient entries exactly zero on {ds[i]:.0%} of steps",
    )
    gm = s.stat("grad_norm", "median")
    with np.errstate(invalid="ignore", divide="ignore"):
        lvl = np.log10(np.where(gm > 0, gm, np.nan))
    rel = lvl - reference_level(lvl, ok & ~dead & ~(vs >= t.minor_issue_ratio), ok)
    lo, hi = np.log10(t.relative_vanishing), np.log10(t.relative_exploding)
    with np.errstate(invalid="ignore"):
        add(
            ok & (rel < lo) & ~(vs >= t.minor_issue_ratio) & ~dead,
            "weak",
            (lo - rel) / max(-lo, 1e-12),
            np.zeros(L, bool),
            lambda i: f"median gradient norm {10 ** -rel[i]:.3g}x below the typical layer ({REF_TEXT})",
        )
        add(
            ok & (rel > hi),
            "hot",
            (rel - hi) / max(hi, 1e-12),
            np.zeros(L, bool),
            lambda i: f"median gradient norm {10 ** rel[i]:.3g}x above the typical layer ({REF_TEXT})",
        )
    st = flow["stability"].to_numpy()
    with np.errstate(invalid="ignore"):
        add(
            ok & (st < t.unstable),
            "unstable",
            1 - st / t.unstable,
            np.zeros(L, bool),
            lambda i: f"gradient-norm stability 1/(1+CV) = {st[i]:.2f} (< {t.unstable:g})",
        )
    osc, fr, r1 = flow["oscillation"].to_numpy(), flow["flow_rate"].to_numpy(), flow["autocorr_lag1"].to_numpy()
    add(
        ok & flow["oscillating"].to_numpy(bool),
        "oscillating",
        osc,
        np.zeros(L, bool),
        lambda i: (
            f"norm alternates up and down (lag-1 autocorrelation {r1[i]:.2f}; direction changes on "
            f"{osc[i]:.0%} of steps), moving {fr[i]:.0%} of its level per step"
        ),
    )
    ur = update_ratio(s)
    with np.errstate(invalid="ignore", divide="ignore"):
        add(
            ok & (ur > t.update_ratio_high),
            "lr_high",
            np.log10(ur / t.update_ratio_high),
            np.zeros(L, bool),
            lambda i: f"median update/weight ratio {ur[i]:.3g} above {t.update_ratio_high:g}",
        )
        add(
            ok & (ur < t.update_ratio_low) & (ds < t.minor_issue_ratio) & (vs < t.minor_issue_ratio),
            "lr_low",
            np.log10(t.update_ratio_low / ur),
            np.zeros(L, bool),
            lambda i: f"median update/weight ratio {ur[i]:.3g} below {t.update_ratio_low:g}",
        )
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
    health = np.where(
        ~known,
        "Unknown",
        np.where(crit | (count > MAX_WARNING_FACTORS), "Critical", np.where(count > 0, "Warning", "Healthy")),
    )
    lvl = s.stat("mean_abs", "median")
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        llog = np.log10(np.where(lvl > 0, lvl, np.nan))
        med = nanmedian(llog[known]) if known.any() else np.nan
        rel = llog - med
        gap = np.abs(rel)
        potential = np.clip(gap / -np.log10(t.relative_vanishing), 0, 1)
    rank = pd.Series(np.where(known, lvl, np.nan)).rank(ascending=False, method="min").to_numpy()
    similar = _similar(llog, names, np.log10(1.2))
    return pd.DataFrame(
        {
            "layer": names,
            "health": health,
            "risk": np.where(known, risk, np.nan),
            "flags": [", ".join(f) for f in flags],
            "n_factors": count,
            "stability": flow["stability"].to_numpy(),
            "neuron_activity": 1 - s.stat("zero_frac", "mean"),
            "convergence": convergence_indicator(s),
            "update_ratio": update_ratio(s),
            "relative_level": 10**rel,
            "rank": rank,
            "similar_layers": similar,
            "gap_decades": gap,
            "potential": potential,
        }
    )


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
