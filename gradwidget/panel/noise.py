"""The gradient noise scale for the page (``noise`` and ``noise_text`` traits): per measured step,
B_simple, its 95% interval and the batch per step, from the report (``analyze(run).noise_scale``),
thinned to at most ``MAX_NOISE_POINTS``; in words, the estimate (and the modules where it is lowest
and highest) or why there is none."""

from __future__ import annotations

import re

import numpy as np

from ..analysis.noise_scale import no_estimate_note

#: a pointer into the source tree's docs ("..., docs/costs.md"): a notebook reader has no such path
_DOCS_PATH = re.compile(r",?\s*(see )?docs/[\w./-]+\w")
#: the most points of the noise-scale series sent to the page (a small chart: one per few pixels)
MAX_NOISE_POINTS = 512


def noise_values(report) -> dict:
    """``{"noise": (5, N) float64 array, "noise_text": str}`` of a Report (``b""`` when it has no
    noise scale); the ``noise`` trait encodes the array (its row of ``protocol.TRAITS``)."""
    ns = getattr(report, "noise_scale", None)
    if ns is None or not ns.rows:
        why = no_estimate_note(getattr(report, "run", None)) or ""
        return {"noise": b"", "noise_text": _DOCS_PATH.sub("", why)}
    keep = np.unique(np.linspace(0, ns.rows - 1, min(ns.rows, MAX_NOISE_POINTS)).round().astype(np.int64))
    rows = np.stack([ns.steps, ns.b_simple, ns.lo, ns.hi, np.full(ns.rows, ns.b_big)])[:, keep]
    # sentences: the estimate, then its lowest and highest modules (the report tables every module)
    text = ". ".join(t[:1].upper() + t[1:] for t in (ns.text(), ns.groups_text()) if t)
    return {"noise": rows.astype(np.float64), "noise_text": text}
