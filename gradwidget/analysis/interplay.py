"""The network's layers side by side: the distribution of their gradient levels and the pairs
whose gradient-norm series move together or against each other (the original crate's enhanced
analysis: ``GradientDistribution``, ``LayerInteraction``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stats import Series, block_mean, moments, standardized

#: a pair of layers whose log-norm series correlate at least this much (in absolute value) is
#: Cooperative (positive) or Competitive (negative); by convention |r| >= 0.5 is a strong correlation.
INTERACTION_CORR = 0.5
#: how many interacting pairs to keep, strongest first (bounds memory and output for 1,000 layers).
TOP_PAIRS = 50
#: rows of the series used for pairwise correlations (block-averaged).
CORR_ROWS = 512


# --------------------------------------------------------------------------- network level
@dataclass
class Distribution:
    """Distribution across layers of their median gradient norm, in log10 (raw norms across layers
    span decades, so their raw skewness is always large)."""

    mean_log10: float
    std_log10: float
    skewness: float
    kurtosis: float
    kind: str  #: Normal / Skewed / HeavyTailed / Multimodal / Degenerate
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
    interaction_type: str  #: Cooperative / Competitive / Disruptive / Neutral
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
    return (
        "Cooperative"
        if r >= INTERACTION_CORR
        else "Disruptive"
        if r <= -DISRUPTIVE_CORR
        else "Competitive"
        if r <= -INTERACTION_CORR
        else "Neutral"
    )


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
