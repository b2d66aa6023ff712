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
#: the row of the non-finite counts in a step's ``(METRICS, layers)`` values: a Run keeps them
#: exact (float64) beside its float32 metrics
NONFINITE_ROW = METRICS.index("nonfinite")
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


#: the largest step number: steps are int64 in a run directory and plain numbers in the panel, which
#: holds whole numbers exactly up to 2**53 - 1 (JavaScript's Number.MAX_SAFE_INTEGER)
MAX_STEP = 2**53 - 1

#: what each per-step scalar may hold, as (lowest, NaN allowed, what it is): a loss is any real
#: number (NaN and inf are what a diverging run shows); a learning rate is a finite number >= 0; a
#: global norm is >= 0 (inf and NaN: non-finite gradients)
SCALAR_RULES: dict[str, tuple[float, bool, str]] = {
    "loss": (-np.inf, True, "a real number (NaN and inf included)"),
    "lr": (0.0, False, "a finite number >= 0"),
    "global_norm": (0.0, True, "a number >= 0 (inf or NaN for non-finite gradients)"),
}


def _as_step(step) -> int:
    """The step number as an int from 0 to ``MAX_STEP``; a whole float (3.0) is accepted, 'x',
    2.5, -1, 2**63 or 1e300 are refused, saying the range."""
    try:
        as_float = float(step)
        ok = as_float == int(as_float)
    except (TypeError, ValueError, OverflowError):
        ok = False
    if isinstance(step, bool) or isinstance(step, str) or not ok:
        raise ValueError(f"step must be a whole number (the optimizer step count), got {step!r:.60}")
    if not 0 <= int(step) <= MAX_STEP:
        raise ValueError(f"step must be a whole number from 0 to 2**53 - 1 ({MAX_STEP}), got {step!r:.60}")
    return int(step)


def check_scalar(name: str, value, given: bool = True) -> float:
    """A per-step scalar (``SCALARS``) as a float, or a ValueError that says its allowed range.
    ``given=False``: a value of a Run's row, where NaN stands for one not given."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name} must be a number (or None), got {value!r:.60}") from None
    lowest, nan_ok, what = SCALAR_RULES[name]
    if v < lowest or (not nan_ok and not np.isfinite(v) and (given or not np.isnan(v))):
        raise ValueError(f"{name} must be {what}, got {value!r:.60}")
    return v


def scalar_row(scalars: dict | None) -> np.ndarray:
    """The per-step scalars in SCALARS order (NaN where not given), with a clear error for an
    unknown name or a value that is not a number."""
    row = np.full(len(SCALARS), np.nan)
    for k, v in (scalars or {}).items():
        if k not in SCALARS:
            raise ValueError(f"unknown scalar {k!r}; scalars are {list(SCALARS)}")
        if v is not None:
            row[SCALARS.index(k)] = check_scalar(k, v, given=False)
    return row
