"""What a Run records: the per-step, per-layer metrics, the per-step scalars, the fixed histogram
bins, and the checks of a step's number and scalars (one definition, shared by the Run, the run
directory's record layout and every collector)."""

from __future__ import annotations

import numpy as np


#: per step x layer metrics, in storage order.
METRICS: tuple[str, ...] = (
    "grad_norm",  # L2 norm of the gradient tensor
    "mean_abs",  # mean |g|
    "max_abs",  # max |g|
    "std",  # standard deviation of g's entries
    "zero_frac",  # fraction of entries exactly 0
    "nonfinite",  # count of NaN/Inf entries
    "weight_norm",  # L2 norm of the parameter itself
    "update_norm",  # L2 norm of the optimizer's change to the parameter (NaN without an optimizer)
)
#: per step scalars.
SCALARS: tuple[str, ...] = ("loss", "lr", "global_norm")

#: histogram of |g| in fixed octave bins (factor-2 wide, 2**-50 ~ 8.9e-16 up to 2**14 = 16384) so
#: histograms add up across steps and processes and can be read straight off float exponents.
#: Values beyond the range land in the edge bins; zeros and non-finite values are not counted.
HIST_LOG2_LO, N_BINS = -50, 64
HIST_EDGES = np.arange(HIST_LOG2_LO, HIST_LOG2_LO + N_BINS + 1) * np.log10(2.0)  #: bin edges in log10|g|
HIST_LO, HIST_HI = float(HIST_EDGES[0]), float(HIST_EDGES[-1])


def _position(names: tuple[str, ...], name, what: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        raise KeyError(f"unknown {what} {name!r}; {what}s are {list(names)}") from None


def metric_index(name: str) -> int:
    """Where metric ``name`` sits in ``METRICS``; for any other name a KeyError that lists them
    (the Run and the figures refuse a wrong name with this one message)."""
    return _position(METRICS, name, "metric")


def scalar_index(name: str) -> int:
    """Where scalar ``name`` sits in ``SCALARS``; for any other name a KeyError that lists them."""
    return _position(SCALARS, name, "scalar")


def _as_step(step) -> int:
    """The step number as an int; a whole float (3.0) is accepted, 'x' or 2.5 are refused."""
    try:
        as_float = float(step)
        ok = as_float == int(as_float)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if isinstance(step, bool) or isinstance(step, str) or not ok:
        raise ValueError(f"step must be a whole number (the optimizer step count), got {step!r}")
    return int(step)


def scalar_row(scalars: dict | None) -> np.ndarray:
    """The per-step scalars in SCALARS order (NaN where not given), with a clear error for an
    unknown name or a value that is not a number."""
    row = np.full(len(SCALARS), np.nan)
    for k, v in (scalars or {}).items():
        if k not in SCALARS:
            raise ValueError(f"unknown scalar {k!r}; scalars are {list(SCALARS)}")
        if v is None:
            continue
        try:
            row[SCALARS.index(k)] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{k} must be a number (or None), got {v!r:.60}") from None
    return row
