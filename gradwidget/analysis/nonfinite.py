"""Where the run's first NaN/Inf was made: evidence for the ``nonfinite`` cause.

The torch Recorder traces it while training (``gradwidget.collect.nonfinite``) and keeps it in
the run (``run.nonfinite_origin``, saved in meta.json); the analysis reads it here, without I/O.
"""

from __future__ import annotations

import numpy as np

from ..run import NonfiniteOrigin, Run

__all__ = ["NonfiniteOrigin", "nonfinite_origin", "origin_layer", "weight_growth"]


def nonfinite_origin(run: Run) -> NonfiniteOrigin | None:
    """The traced origin of the run's first NaN/Inf (module, step, pass), or None when none was
    traced: the run stayed finite, or it was recorded without tracing (``trace_nonfinite=False``,
    ``ArrayRecorder``, a run written before tracing existed)."""
    if not isinstance(run, Run):
        raise TypeError(f"nonfinite_origin() needs a gradwidget Run, not {type(run).__name__}")
    return run.nonfinite_origin


def weight_growth(run: Run, origin: NonfiniteOrigin) -> float:
    """How far the weights had grown when the NaN was made: the largest factor by which a layer's
    weight norm rose from the first recorded step to the origin's step (weight norms are recorded
    before the update, so these are the weights that step's forward used); Inf when a norm no
    longer fits in float32. NaN when it cannot be told (no recorded step at or before the
    origin's, or no weight norm to start from).

    Why: a non-finite value in a module whose weights grew tenfold or more points at the learning
    rate, not at the module (for the ``nonfinite`` advice)."""
    if run.n_steps == 0 or origin.step < int(run.steps[0]):
        return float("nan")
    row = int(np.searchsorted(run.steps, origin.step, side="right")) - 1
    w = run.metric("weight_norm")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = w[row].astype(np.float64) / w[0]
    ratio = ratio[np.isfinite(w[0]) & (w[0] > 0) & ~np.isnan(ratio)]  # an Inf norm: grown past float32
    return float(ratio.max()) if ratio.size else float("nan")


def origin_layer(run: Run, origin: NonfiniteOrigin) -> int | None:
    """The layer (column) that stands for the origin's module on a layers x steps picture: the
    module's own first parameter; for a parameter-free module (an activation, a division) the
    layer whose module path shares the longest dotted prefix with it, the first such in depth
    order; None for the loss or the input (no module of the model) or a run without layers."""
    if not origin.module or run.n_layers == 0:
        return None
    target = origin.module.split(".")
    best, best_len = None, -1
    for i, layer in enumerate(run.layers):
        mod = (layer.module or layer.name.rsplit(".", 1)[0]).split(".")
        if mod[: len(target)] == target:
            return i
        n = next((k for k, (a, b) in enumerate(zip(mod, target)) if a != b), min(len(mod), len(target)))
        if n > best_len:
            best, best_len = i, n
    return best
