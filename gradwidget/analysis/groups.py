"""Layer groups: by gradient level (High / Medium / Low) and by module prefix, each characterised from
its members (the original crate's hierarchy; it hard-coded the characteristics as 2.0 / 0.8 / 0.7 ...).

Fields of the original crate not carried over, and why:
- ``GradientHierarchy.hierarchy_levels`` / ``cross_level_interactions``: the original crate's levels were the
  High / Medium / Low gradient bands (the ``by="level"`` groups here) with constant importance and
  impact, and its cross-level interactions were never filled in.
- ``OptimizationDifficulty.VeryDifficult``: never assigned by the original crate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .interplay import CORR_ROWS
from .stats import Series, _quiet, block_mean, nanmedian, standardized


@dataclass
class GroupCharacteristics:
    mean_gradient_norm: float  #: geometric mean of the members' median gradient norms
    synchronization: float  #: mean pairwise correlation of the members' log-norm series
    lr_sensitivity: float  #: median update/weight ratio of the members (NaN without optimizer)
    internal_coherence: float  #: 1/(1 + std of the members' log10 levels)
    difficulty: str  #: Difficult (a Critical member) / Moderate (a Warning) / Easy


@dataclass
class LayerGroup:
    name: str
    by: str  #: "level" or "module"
    layers: list[str]
    characteristics: GroupCharacteristics
    health_counts: dict


def _module_keys(names: list[str]) -> list[str]:
    """The shallowest module prefix (up to 3 dotted components) that splits the layers in 2+ groups."""
    parts = [n.split(".")[:-1] or [n] for n in names]
    for depth in (1, 2, 3):
        keys = [".".join(p[:depth]) for p in parts]
        if len(set(keys)) > 1:
            return keys
    return [".".join(p[:1]) for p in parts]


def layer_groups(s: Series, health: pd.DataFrame) -> list[LayerGroup]:
    """Groups by gradient level (High / Medium / Low: more than 1/``bottleneck_gain`` times above or
    below the median layer) and by module prefix, each characterised from its members."""
    run, t = s.run, s.run.thresholds
    names = run.layer_names
    known = (health["health"] != "Unknown").to_numpy()
    g = s.stat("grad_norm", "median")
    with np.errstate(divide="ignore", invalid="ignore"), _quiet():
        lg = np.log10(np.where(g > 0, g, np.nan))
        rel = lg - nanmedian(lg[known]) if known.any() else lg * np.nan
    band = -np.log10(t.bottleneck_gain)
    level = np.where(
        ~known | ~np.isfinite(rel),
        "",
        np.where(rel > band, "High gradient", np.where(rel < -band, "Low gradient", "Medium gradient")),
    )
    z, varies = standardized(block_mean(s.coarse, CORR_ROWS)[0])
    ur = health["update_ratio"].to_numpy()
    hv = health["health"].to_numpy()
    out = []
    for by, keys in (("level", level), ("module", np.array(_module_keys(names), dtype=object))):
        for key in pd.unique(keys[known]) if known.any() else []:
            if key == "":
                continue
            idx = np.flatnonzero((keys == key) & known)
            zz = z[:, idx][:, varies[idx]]
            k = zz.shape[1]
            sync = float((np.sum(zz.sum(1) ** 2) - k) / (k * (k - 1))) if k > 1 else float("nan")
            with _quiet():
                ch = GroupCharacteristics(
                    mean_gradient_norm=float(10 ** np.nanmean(lg[idx])) if np.isfinite(lg[idx]).any() else float("nan"),
                    synchronization=sync,
                    lr_sensitivity=float(nanmedian(ur[idx])) if np.isfinite(ur[idx]).any() else float("nan"),
                    internal_coherence=float(1 / (1 + np.nanstd(lg[idx])))
                    if np.isfinite(lg[idx]).any()
                    else float("nan"),
                    difficulty="Difficult"
                    if (hv[idx] == "Critical").any()
                    else "Moderate"
                    if (hv[idx] == "Warning").any()
                    else "Easy",
                )
            counts = {h: int((hv[idx] == h).sum()) for h in ("Healthy", "Warning", "Critical")}
            out.append(LayerGroup(str(key), by, [names[i] for i in idx], ch, counts))
    return out
