"""Evidence from the loss: what it did over the run (falling, flat at chance, diverging, spiking,
rebounding), read from the logged loss with batch noise smoothed out. Pure facts for the causes;
re-exported from ``evidence.py``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..run import Run
from .stats import trailing_median
from .trend import Trend, theil_sen


def _first(mask: np.ndarray, steps: np.ndarray) -> int | None:
    """The step number of the first True in ``mask`` (None when there is none)."""
    i = np.flatnonzero(mask)
    return int(steps[i[0]]) if i.size else None


#: recorded steps whose median is the loss "at the start" and "at the end" (batch noise; a median,
#: so one spike in the first steps does not move the start).
LOSS_EDGE_STEPS = 3
#: the loss "fell" when its end is below this share of its start.
LOSS_FELL = 0.8
#: the loss is "flat" when its end is within this share of its start.
LOSS_FLAT = 0.05
#: the loss "rebounds" when it climbs above its lowest value so far by this share of where it
#: started (a spike or a divergence; batch noise on a falling loss stays well under it).
LOSS_REBOUND = 0.5
#: the loss "converged" when its end is at or below this share of its start: four decades, which no
#: zoo run falls (healthy or not). Its gradients are then small because it is (they scale with it).
LOSS_CONVERGED = 1e-4


@dataclass
class LossEvidence:
    """What the logged loss did. All None/False without a logged loss."""

    logged: bool
    start: float = float("nan")  #: median of the first finite values
    end: float = float("nan")  #: median of the last finite values
    lowest: float = float("nan")
    fell: bool = (
        False  #: end < LOSS_FELL x start, and its trend falls for certain or its last quarter lies below its first
    )
    flat: bool = False  #: |end - start| < LOSS_FLAT x start, and no certain trend either way
    rebound: float = 0.0  #: largest rise above the running minimum, in units of start
    rebound_step: int | None = None  #: first step whose rise exceeded LOSS_REBOUND
    rebound_to: float = float("nan")  #: the loss at that step
    rebound_from: float = float("nan")  #: its lowest value before that step
    nonfinite_step: int | None = None  #: first step with a NaN/Inf loss
    spike_share: float = 0.0  #: share of steps after the first few above LOSS_SPIKE x start
    spike_step: int | None = None  #: the first of them
    plateau_level: float = float("nan")  #: end / start (how far the loss came down, 1 = not at all)
    converged: bool = False  #: a positive loss that ended at or below LOSS_CONVERGED x its start
    trend: Trend | None = None  #: Theil-Sen trend of the finite loss over the steps (None: too few values)
    diverged: bool = False  #: went NaN/Inf, or rebounded and ended above where it started


#: ... by at least this factor, and by this many times the loss's own batch-to-batch noise (robust
#: standard deviation of one step's change in log loss): the smoothed level of a noisy small-batch
#: loss wanders about 1.6 of those between its lowest and highest point, a divergence far more.
LOSS_REBOUND_FACTOR = 2.0
LOSS_REBOUND_SIGMA = 3.0
#: a loss above this many times its start, after the first LOSS_SPIKE_AFTER recorded steps, is a
#: spike (a healthy loss, however noisy, does not climb back over its starting value like that; a
#: small-batch MSE of a model that learns nothing reaches about 1.8x).
LOSS_SPIKE = 3.0
LOSS_SPIKE_AFTER = 5
#: the rebound is measured on the trailing median of this many recorded steps: one noisy batch is
#: no rebound, a climb that lasts (or spikes that keep coming) is.
LOSS_SMOOTH_STEPS = 5


def _log_noise(y: np.ndarray) -> float:
    """Robust standard deviation of one step's change in log loss (0 for a loss that is not positive)."""
    if y.size < 3 or not np.all(y > 0):
        return 0.0
    d = np.diff(np.log(y))
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / np.sqrt(2))


def _past_transient(over: np.ndarray, ys: np.ndarray, runmin: np.ndarray) -> int | None:
    """The first index of ``over`` (a rise above the running minimum) that is not a start-up
    transient: a climb within the first ``LOSS_SPIKE_AFTER + LOSS_SMOOTH_STEPS`` recorded steps after
    which the smoothed loss came back below the level it climbed from (a few large first steps, then
    training as usual). None when every rise is one."""
    start = 0
    while True:
        idx = np.flatnonzero(over[start:])
        if not idx.size:
            return None
        j = start + int(idx[0])
        if j >= LOSS_SPIKE_AFTER + LOSS_SMOOTH_STEPS:
            return j
        back = np.flatnonzero(ys[j:] <= runmin[j])
        if not back.size:
            return j
        start = j + int(back[0])


def loss_evidence(run: Run) -> LossEvidence:
    """The loss trajectory: where it started and ended, whether it fell, stayed flat, rebounded
    (spikes and divergence: a rise above its running minimum by ``LOSS_REBOUND`` of its start, by a
    factor of ``LOSS_REBOUND_FACTOR`` and beyond ``LOSS_REBOUND_SIGMA`` times its noise) or went
    non-finite."""
    loss = run.scalar("loss").astype(np.float64) if run.n_steps else np.zeros(0)
    steps = run.steps
    logged = ~np.isnan(loss)
    if not logged.any():
        return LossEvidence(logged=False)
    nonfinite_step = _first(logged & ~np.isfinite(loss), steps)
    fin = np.isfinite(loss)
    y = loss[fin]
    if not y.size:
        return LossEvidence(logged=True, nonfinite_step=nonfinite_step, diverged=nonfinite_step is not None)
    k = max(1, min(LOSS_EDGE_STEPS, y.size // 4 or 1))
    start, end = float(np.median(y[:k])), float(np.median(y[-k:]))
    scale = abs(start) if start != 0 else 1.0
    ys = trailing_median(y, LOSS_SMOOTH_STEPS)
    runmin = np.minimum.accumulate(ys)
    rise = (ys - runmin) / scale
    over = rise > LOSS_REBOUND
    if np.all(y > 0):
        with np.errstate(divide="ignore"):
            lrise = np.log(ys / runmin)
        over &= lrise > max(np.log(LOSS_REBOUND_FACTOR), LOSS_REBOUND_SIGMA * _log_noise(y))
    j = _past_transient(over, ys, runmin)
    trend = theil_sen(y, steps[fin])
    q = y.size // 4
    apart = bool(q and y[-q:].max() < y[:q].min())  # every late value below every early one: no noise makes that
    late = np.arange(y.size) >= LOSS_SPIKE_AFTER
    spikes = late & (y > LOSS_SPIKE * start) if start > 0 else np.zeros(y.size, bool)
    n_late = int(late.sum())
    return LossEvidence(
        spike_share=float(spikes.sum() / n_late) if n_late else 0.0,
        spike_step=int(steps[fin][np.argmax(spikes)]) if spikes.any() else None,
        logged=True,
        start=start,
        end=end,
        lowest=float(y.min()),
        fell=bool(end < LOSS_FELL * start if start > 0 else end < start) and (trend is None or trend.falling or apart),
        flat=bool(abs(end - start) < LOSS_FLAT * scale) and (trend is None or not (trend.falling or trend.rising)),
        rebound=float(rise.max()),
        rebound_step=int(steps[fin][j]) if j is not None else None,
        rebound_to=float(ys[j]) if j is not None else float("nan"),
        rebound_from=float(runmin[j]) if j is not None else float("nan"),
        nonfinite_step=nonfinite_step,
        plateau_level=float(end / start) if start > 0 else float("nan"),
        converged=bool(start > 0 and 0 <= end <= LOSS_CONVERGED * start),
        trend=trend,
        diverged=nonfinite_step is not None or (j is not None and end > start),
    )
