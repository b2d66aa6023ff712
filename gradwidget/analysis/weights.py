"""Weights (the original crate's weight analysis): distribution statistics and health per layer, bounded outlier summaries,
gradient-explosion analysis, and weight drift — pure functions over ``{name: array}``.

Fixed from the original crate: entropy comes from a real histogram of the values (the original crate used log2 of the
std); issues carry codes so each one maps to its recommendation (the original crate matched "heavy-tailed"
against "Heavy-tailed" and never fired); mostly-zero weights are not called dead neurons (dead units
show in the gradients' zero fraction); outliers are summarised (count, worst few, where) not listed
per element.

Weight drift (``drift_between``, ``drift_from_run``) lives in ``drift.py`` and is re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..thresholds import as_thresholds
from .drift import Drift, drift_between, drift_from_run

__all__ = [
    "EXTREME_VALUE",
    "HEAVY_TAILED",
    "ISSUES",
    "MAX_OUTLIERS",
    "MOSTLY_ZERO",
    "OUTLIER_HIGH_Z",
    "OUTLIER_Z",
    "SKEWED",
    "Drift",
    "ExplodingLayer",
    "ExplosionAnalysis",
    "Outlier",
    "WeightReport",
    "analyze_weights",
    "distribution_health",
    "drift_between",
    "drift_from_run",
    "gradient_explosion",
    "health_score",
    "outliers",
    "weight_statistics",
    "weights_from_module",
]

#: the original crate's weight analysis: weight health score deductions (out of 100) and the limits that trigger them.
EXTREME_VALUE = 10.0
MOSTLY_ZERO = 0.5
SKEWED = 2.0
HEAVY_TAILED = 10.0
#: the original crate's weight analysis: distribution-health deductions use tighter limits.
DIST_ZERO, DIST_SKEW, DIST_KURT, DIST_EXTREME = 0.3, 1.0, 5.0, 5.0
#: outliers: |z| > 3, High above 5 (as the original crate); at most this many listed per layer.
OUTLIER_Z, OUTLIER_HIGH_Z, MAX_OUTLIERS = 3.0, 5.0, 5

ISSUES = {
    "nonfinite": (
        "NaN/Inf weights: training has diverged",
        "restore the last good checkpoint, then lower the learning rate, clip gradients "
        "(clip_grad_norm_) and check the loss for log(0) or division by zero",
    ),
    "mostly_zero": (
        "more than half of the weights are exactly zero (pruned, masked or never updated)",
        "check masking/pruning; if unintended, re-initialise the layer or lower weight decay",
    ),
    "skewed": (
        "highly skewed weight distribution (|skewness| > 2)",
        "consider weight normalisation or a different initialisation",
    ),
    "heavy_tailed": (
        "heavy-tailed weight distribution (excess kurtosis > 10)",
        "monitor for gradient instability; a few weights dominate the layer",
    ),
    "extreme": (
        "extreme weight values (|w| > 10)",
        "add weight decay / regularisation or clip weights; check the learning rate",
    ),
}


@dataclass
class Outlier:
    layer: str
    index: tuple
    value: float
    z_score: float
    severity: str  #: Medium (3 < |z| <= 5) or High


@dataclass
class ExplodingLayer:
    layer: str
    max_abs: float  #: largest |g| entry over the recorded steps (inf after a non-finite one)
    ratio_to_mean: float  #: max_abs / the mean over layers of their finite max |g|
    severity: str
    action: str


@dataclass
class ExplosionAnalysis:
    """The original crate's (weight analysis) explosion check on the same metric and threshold as the exploding flags: a
    layer's largest |g| entry against ``Thresholds.exploding`` (the original crate compared L2 norms, which
    grow with sqrt(numel): a healthy 5M-entry layer with |g| = 0.5 everywhere has norm 1118)."""

    exploding_layers: list[ExplodingLayer]
    max_abs: float  #: largest max |g| of any layer
    mean_max_abs: float  #: mean over layers of their finite max |g|
    std_max_abs: float
    explosion_ratio: float  #: share of layers above the threshold
    severity: str  #: Low / Medium / High / Critical
    threshold: float
    mitigation: list[str]


@dataclass
class WeightReport:
    layers: pd.DataFrame
    outliers: list[Outlier]
    distribution_score: float
    distribution_status: str
    explosion: ExplosionAnalysis | None = None
    drift: Drift | None = None
    run_drift: Drift | None = None

    def summary_text(self) -> str:
        df = self.layers
        lines = [
            f"Weights: {len(df)} layers, distribution health {self.distribution_status} "
            f"({self.distribution_score:.0f}/100)."
        ]
        bad = df[df["issues"].str.len() > 0]
        for _, r in bad.head(8).iterrows():
            lines.append(f"  {r['layer']}: {r['issues']} -> {r['recommendations']}")
        n_out = int(df["n_outliers"].sum())
        if n_out:
            worst = max(self.outliers, key=lambda o: abs(o.z_score))
            lines.append(
                f"  {n_out} outlier weights (|z| > {OUTLIER_Z:g}); worst {worst.layer}{list(worst.index)} "
                f"= {worst.value:.3g} (z = {worst.z_score:.1f})."
            )
        for d in (self.drift, self.run_drift):
            if d is not None:
                lines.append(
                    f"  Drift ({d.source}): mean {d.mean_drift:.3g}, max {d.max_drift:.3g} -> {d.severity}"
                    + (f"; layers: {', '.join(d.affected_layers[:5])}" if d.affected_layers else "")
                )
        if self.explosion is not None and self.explosion.exploding_layers:
            e = self.explosion
            lines.append(
                f"  Gradient explosion {e.severity}: {len(e.exploding_layers)} layers with |g| above {e.threshold:g}."
            )
        return "\n".join(lines)


def weights_from_module(model) -> dict[str, np.ndarray]:
    """``{parameter name: numpy copy}`` of a torch module's parameters (torch imported lazily)."""
    return {n: p.detach().float().cpu().numpy() for n, p in model.named_parameters()}


def weight_statistics(w: np.ndarray) -> dict:
    """Mean, std, skewness, excess kurtosis, entropy (bits, and normalised 0..1, of a histogram with
    ~sqrt(n) bins up to 256), min, max and zero fraction of one tensor's finite values, and the count
    of its non-finite ones (which the health scores treat as fatal, not as missing)."""
    a = np.asarray(w, np.float64).ravel()
    total = a.size
    a = a[np.isfinite(a)]
    n = a.size
    if n == 0:
        return dict(
            mean=np.nan,
            std=np.nan,
            skewness=np.nan,
            kurtosis=np.nan,
            entropy_bits=np.nan,
            entropy=np.nan,
            min=np.nan,
            max=np.nan,
            zero_frac=np.nan,
            numel=0,
            nonfinite=int(total),
        )
    m = a.mean()
    d = a - m
    var = np.mean(d * d)
    sd = np.sqrt(var)
    skew = float(np.mean(d**3) / sd**3) if sd > 0 and n >= 3 else 0.0
    kurt = float(np.mean(d**4) / var**2 - 3) if sd > 0 and n >= 4 else 0.0
    bins = int(min(256, max(2, round(np.sqrt(n)))))
    if a.max() > a.min():
        counts, _ = np.histogram(a, bins=bins)
        p = counts[counts > 0] / n
        h = float(-(p * np.log2(p)).sum())
        hn = h / np.log2(bins)
    else:
        h, hn = 0.0, 0.0
    return dict(
        mean=float(m),
        std=float(sd),
        skewness=skew,
        kurtosis=kurt,
        entropy_bits=h,
        entropy=float(hn),
        min=float(a.min()),
        max=float(a.max()),
        zero_frac=float(np.mean(a == 0)),
        numel=int(n),
        nonfinite=int(total - n),
    )


def health_score(st: dict) -> tuple[float, list[str]]:
    """The original crate's (weight analysis) score (100 minus deductions) and the issue codes that caused them; 0 with any NaN/Inf
    weight (the original crate would score the finite rest)."""
    if st.get("nonfinite", 0):
        return 0.0, ["nonfinite"]
    score, issues = 100.0, []
    if max(abs(st["max"]), abs(st["min"])) > EXTREME_VALUE:
        score -= 20
        issues.append("extreme")
    if st["zero_frac"] > MOSTLY_ZERO:
        score -= 30
        issues.append("mostly_zero")
    if abs(st["skewness"]) > SKEWED:
        score -= 15
        issues.append("skewed")
    if st["kurtosis"] > HEAVY_TAILED:
        score -= 15
        issues.append("heavy_tailed")
    return max(0.0, score), issues


def distribution_health(st: dict) -> tuple[float, str]:
    """The original crate's (weight analysis) distribution score and its status: Excellent >= 90, Good >= 75, Fair >= 60, Poor >= 40;
    0 and Critical with any NaN/Inf weight."""
    if st.get("nonfinite", 0):
        return 0.0, "Critical"
    score = 100.0
    if st["zero_frac"] > DIST_ZERO:
        score -= 25
    if abs(st["skewness"]) > DIST_SKEW:
        score -= 15
    if st["kurtosis"] > DIST_KURT:
        score -= 15
    if max(abs(st["max"]), abs(st["min"])) > DIST_EXTREME:
        score -= 20
    status = (
        "Excellent"
        if score >= 90
        else "Good"
        if score >= 75
        else "Fair"
        if score >= 60
        else "Poor"
        if score >= 40
        else "Critical"
    )
    return score, status


def outliers(name: str, w: np.ndarray, st: dict, k: int = MAX_OUTLIERS) -> tuple[int, list[Outlier]]:
    """Count of |z| > 3 entries and the ``k`` largest, with their multi-dimensional index."""
    a = np.asarray(w, np.float64)
    if not st["std"] or not np.isfinite(st["std"]):
        return 0, []
    z = np.abs((a - st["mean"]) / st["std"])
    z = np.where(np.isfinite(z), z, 0)
    flat = z.ravel()
    hit = np.flatnonzero(flat > OUTLIER_Z)
    if hit.size > k:
        hit = hit[np.argpartition(-flat[hit], k)[:k]]
    hit = hit[np.argsort(-flat[hit])]
    out = [
        Outlier(
            name,
            tuple(int(i) for i in np.unravel_index(h, a.shape)),
            float(a.ravel()[h]),
            float(flat[h]),
            "High" if flat[h] > OUTLIER_HIGH_Z else "Medium",
        )
        for h in hit
    ]
    return int(np.sum(flat > OUTLIER_Z)), out


def gradient_explosion(names, max_abs, threshold: float) -> ExplosionAnalysis:
    """The original crate's ``detect_gradient_explosion`` over per-layer max |g| (the exploding flags' metric;
    inf for a layer that had non-finite entries): layers above ``threshold`` with their ratio to the
    mean max |g| (Critical > 100x, High > 50x, Medium > 10x), the overall severity from the share of
    exploding layers and the largest value, and mitigations."""
    g = np.asarray(max_abs, np.float64)
    fin = np.isfinite(g)
    mean = float(g[fin].mean()) if fin.any() else float("nan")
    std = float(g[fin].std()) if fin.any() else float("nan")
    mx = float(np.max(np.where(np.isnan(g), -np.inf, g))) if g.size else float("nan")
    layers = []
    for n, v in zip(names, g):
        if not (v > threshold):
            continue
        ratio = v / mean if mean > 0 else float("inf")
        sev = "Critical" if ratio > 100 else "High" if ratio > 50 else "Medium" if ratio > 10 else "Low"
        act = (
            "reduce the learning rate 10x and clip gradients"
            if v > 100 * threshold
            else "reduce the learning rate and clip gradients"
            if v > 10 * threshold
            else "clip gradients or reduce the learning rate"
        )
        layers.append(ExplodingLayer(str(n), float(v), float(ratio), sev, act))
    ratio = len(layers) / max(1, g.size)
    sev = (
        "Critical"
        if ratio > 0.5 or mx > threshold * 10
        else "High"
        if ratio > 0.3 or mx > threshold * 5
        else "Medium"
        if ratio > 0.1 or mx > threshold * 2
        else "Low"
    )
    mit = []
    if ratio > 0.3:
        mit.append(
            f"{ratio:.0%} of layers have |g| entries above {threshold:g}: reduce the learning rate substantially"
        )
    if layers:
        mit.append(
            "clip gradients (torch.nn.utils.clip_grad_norm_); the typical layer's largest |g| is "
            f"{_g(np.median(g[fin])) if fin.any() else 'n/a'}"
        )
        mit.append("consider batch or layer normalisation in front of the exploding layers")
    return ExplosionAnalysis(layers, mx, mean, std, ratio, sev, threshold, mit)


def _g(x) -> str:
    return f"{x:.3g}"


def analyze_weights(
    weights: dict, previous: dict | None = None, thresholds=None, gradient_max_abs: dict | None = None
) -> WeightReport:
    """Weight statistics, health score, issues, recommendations and outliers per layer; the overall
    distribution health (numel-weighted mean of the layers' statistics); drift against
    ``previous``; gradient-explosion analysis when ``gradient_max_abs`` ({name: largest |g|}) is given."""
    t = as_thresholds(thresholds)
    if not isinstance(weights, dict) or not weights:
        raise TypeError("weights must be a non-empty dict {layer name: array} (see weights_from_module(model))")
    rows, outs = [], []
    for name, w in weights.items():
        a = np.asarray(w)
        st = weight_statistics(a)
        known = st["numel"] or st["nonfinite"]
        score, issues = health_score(st) if known else (float("nan"), [])
        dscore, dstatus = distribution_health(st) if known else (float("nan"), "Unknown")
        n_out, top = outliers(name, a, st)
        outs.extend(top)
        rows.append(
            dict(
                layer=name,
                **st,
                health_score=score,
                distribution=dstatus,
                issues=", ".join(ISSUES[i][0] for i in issues),
                recommendations="; ".join(ISSUES[i][1] for i in issues),
                issue_codes=",".join(issues),
                n_outliers=n_out,
            )
        )
    df = pd.DataFrame(rows)
    wts = df["numel"].to_numpy(np.float64)
    agg = {
        k: float(np.average(df[k].fillna(0), weights=wts)) if wts.sum() else float("nan")
        for k in ("zero_frac", "skewness", "kurtosis")
    }
    agg["max"], agg["min"] = float(df["max"].max()), float(df["min"].min())
    agg["nonfinite"] = int(df["nonfinite"].sum())
    dscore, dstatus = distribution_health(agg)
    rep = WeightReport(df, outs, dscore, dstatus)
    if previous is not None:
        rep.drift = drift_between(weights, previous, t)
    if gradient_max_abs:
        rep.explosion = gradient_explosion(list(gradient_max_abs), list(gradient_max_abs.values()), t.exploding)
    return rep
