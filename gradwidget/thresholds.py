"""One place for every threshold the flags and analyses use.

Defaults come from the original crate (vanishing: mean |g| < 1e-7, exploding: max |g| > 1e3),
except where the diagnosis zoo's healthy runs showed them flagging batch noise (each such field says
how it was calibrated). A bound read by more than one cause, or by a cause and a plot, is defined
here once; a bound only one cause reads lives in that cause's module (``analysis/causes/``), with
how it was set. Documented here so a tiny model and a huge one can be tuned with one object.
Scale-free signals (a layer vs. the median layer, the update/weight ratio) complement the absolute ones.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    #: a layer-step is *vanishing* when its mean |g| is below this (the original crate's default: 1e-7).
    vanishing: float = 1e-7
    #: a layer-step is *exploding* when its max |g| is above this (the original crate's default: 1e3).
    exploding: float = 1e3
    #: a layer whose median gradient norm is this many times below the median layer is "weak".
    relative_vanishing: float = 1e-3
    #: ... and this many times above the median layer is "hot".
    relative_exploding: float = 1e3
    #: a layer-step is *dead* when at least this fraction of its gradient entries is exactly zero.
    dead_zero_fraction: float = 0.99
    #: healthy band of the update/weight norm ratio per step, read by the diagnoses (lr_too_low below
    #: it with a loss that does not fall, lr_too_high above it with one that does not fall cleanly),
    #: the health risk factors, the drift and the plots alike. The zoo's healthy calibration runs:
    #: typical layer 2.9e-3 to 2.9e-2 (median over steps); its lr_too_low runs 1.1e-6 to 1.5e-3.
    update_ratio_low: float = 1e-4
    update_ratio_high: float = 1e-1
    #: the typical layer's weight norm grown this many times over the run: the steps are too large
    #: (the zoo's healthy runs: under 3x; lr x30-100: 10x and more).
    weight_blowup: float = 10.0
    #: a classifier's loss within this share of ln(classes) is at chance level (the zoo's healthy
    #: runs start at 0.86-1.01 x ln(classes)).
    chance_tolerance: float = 0.05
    #: a first loss above this is a sum over the batch, not a mean (a per-sample cross entropy starts
    #: at ln(classes), under 12 even for a 100,000-token vocabulary).
    summed_loss_start: float = 40.0
    #: the output bias gradient's largest entry within which a loss is a batch mean (a mean of
    #: (p - y) is at most 1; a sum over B samples reaches B).
    mean_loss_bias_grad: float = 1.5
    #: a series is *oscillating* when more than this fraction of consecutive differences flip sign.
    oscillation: float = 0.6
    #: a series is on a *plateau* when its relative change per step stays below this.
    plateau_rel_change: float = 1e-3
    #: ... and its fitted line moves by less than this share of its level over the whole plateau (a
    #: slow, steady descent over a long run is progress, not a plateau).
    plateau_total_change: float = 0.05
    #: shares of recorded steps: a layer flagged on at least the first counts (dead, vanishing), the
    #: others grade a plateau's and a dead zone's extent (the original crate: 0.1 / 0.3 / 0.5).
    minor_issue_ratio: float = 0.1
    problem_issue_ratio: float = 0.3
    critical_issue_ratio: float = 0.5
    #: ... an oscillation only counts when the norm also moves by more than this fraction of its
    #: level per step on average (plain minibatch noise flips sign 2/3 of the time).
    oscillation_amplitude: float = 0.5
    #: a layer's norm is "rising" / "falling" when its least-squares trend changes it by more than
    #: this many decades (powers of 10) over the run.
    trend_decades: float = 1.0
    #: a backward hop that keeps less than this share of the gradient (per-entry RMS) is a bottleneck;
    #: one that multiplies it by more than the inverse is an amplifier.
    bottleneck_gain: float = 0.1
    #: training is in "rapid learning" while the loss falls by more than this share per step.
    rapid_rel_change: float = 1e-2
    #: a layer whose stability 1/(1 + CV of its norm around its trend) is below this is "unstable".
    #: Calibrated on the diagnosis zoo (bench/diagnosis.py): 1.4% of the layers of its 28 healthy
    #: runs fall below 0.3 (12.6% below the original crate's 0.5, which flagged batch noise), 9.5% of
    #: the layers of its runs with a mistake.
    unstable: float = 0.3
    #: the network is "Stable" when the median layer stability is above this (the original crate: 0.8).
    stable_network: float = 0.8
    #: recorded steps over which convergence is judged (the original crate's convergence_window: 100).
    convergence_window: int = 100
    #: a dead zone dead on more than this share of steps has Low recovery potential (the original crate: 0.9).
    dead_recovery_share: float = 0.9
    #: data-parallel replicas differ when a parameter's weight or gradient norm differs across ranks by
    #: more than this, relative (the replica check, ``collect/_replicas``, applies it and records it;
    #: ``replicas_diverged`` reads that record). Healthy replicas are bit-identical (measured: exactly 0
    #: on every checked step of healthy DDP at 2 and 4 processes, plain and HSDP runs); float32 norms
    #: of 1e3-4e6 entries computed in another order (threads, permutation, reduction shape) moved by at
    #: most 1.3e-6; the broken patterns of tests/test_replicas_dist.py differ by 0.52-0.96 on their first step. 1e-5: 7x
    #: the reordering noise, 4 decades under the smallest real divergence.
    replica_tolerance: float = 1e-5
    #: the batch is named too small / too large (``batch_too_small``, ``batch_too_large``) when the
    #: gradient noise scale's estimate is this many times above / below it (and its one-sided 95%
    #: bound beyond ``batch_noise_sure``). Why 10: B_simple only marks where the trade between steps
    #: and examples turns (McCandlish et al. 2018: a batch of B_crit takes twice the minimum steps and
    #: twice the minimum examples); within a factor of a few either way the trade is mild, beyond 10x
    #: one side costs 10x.
    batch_noise_far: float = 10.0
    #: ... and only where the one-sided 95% bound of B_simple is this many times beyond the batch: the
    #: batch is surely not about right. Why not the 10 of ``batch_noise_far`` for the bound too: far
    #: below the noise scale |G|² is barely resolved, and a bound within 2x of a value 20x the batch
    #: takes more rows than the average's time constant holds (measured: a batch 20x below B_simple
    #: bounded at 6-9x over 150 steps each measured); 3 keeps a batch within 3x of it silent.
    batch_noise_sure: float = 3.0

    def __post_init__(self) -> None:
        """Every value checked here, where it is given (a Recorder, analyze, the CLI all build one),
        naming the field and what it may be: ``_FRACTIONS`` lie in [0, 1], ``_RATIOS`` in (0, 1],
        ``_POSITIVE`` above 0, ``_COUNTS`` whole numbers of at least their minimum, every other
        field a non-negative number; each pair of ``_ORDERED`` in that order."""
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _COUNTS:
                least = _COUNTS[f.name]
                if isinstance(v, bool) or not isinstance(v, int) or v < least:
                    raise ValueError(f"Thresholds.{f.name} must be a whole number of at least {least}, got {v!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
                raise ValueError(f"Thresholds.{f.name} must be a non-negative number, got {v!r}")
            if f.name in _FRACTIONS and v > 1:
                raise ValueError(f"Thresholds.{f.name} must be between 0 and 1 (a fraction), got {v!r}")
            if f.name in _RATIOS and not 0 < v <= 1:
                raise ValueError(f"Thresholds.{f.name} must be in (0, 1] (a ratio), got {v!r}")
            if f.name in _POSITIVE and not v > 0:
                raise ValueError(f"Thresholds.{f.name} must be above 0, got {v!r}")
        for lo, hi in _ORDERED:
            if not getattr(self, lo) < getattr(self, hi):
                raise ValueError(
                    f"Thresholds.{lo} ({getattr(self, lo)!r}) must be below Thresholds.{hi} ({getattr(self, hi)!r})"
                )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Thresholds":
        """Thresholds saved by ``to_dict`` (unknown keys are ignored, for runs from newer versions)."""
        if not d:
            return cls()
        if not isinstance(d, dict):
            raise TypeError(f"thresholds must be a dict of name: number, not {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        bad = {k: v for k, v in d.items() if k in known and (isinstance(v, bool) or not isinstance(v, (int, float)))}
        if bad:
            raise ValueError(f"thresholds must be numbers; got {bad}")
        ints = {f.name for f in fields(cls) if isinstance(f.default, int)}  # a count stays a count
        kwargs: dict[str, Any] = {
            k: (int(v) if k in ints and v == int(v) else float(v)) for k, v in d.items() if k in known
        }
        return cls(**kwargs)


#: shares of entries, steps or sign flips: in [0, 1]
_FRACTIONS = frozenset(
    {
        "dead_zero_fraction",
        "chance_tolerance",
        "oscillation",
        "minor_issue_ratio",
        "problem_issue_ratio",
        "critical_issue_ratio",
        "stable_network",
        "dead_recovery_share",
    }
)
#: factors below 1 that the analyses take logs of (a 0 makes every layer weak or a bottleneck)
_RATIOS = frozenset({"relative_vanishing", "bottleneck_gain", "unstable"})
#: above 0: factors above 1 (a hot layer, the weights' growth, the output bias gradient of a mean
#: loss), the update/weight band's lower end and a summed loss's first value (logs are taken of them)
_POSITIVE = frozenset(
    {"relative_exploding", "update_ratio_low", "weight_blowup", "summed_loss_start", "mean_loss_bias_grad"}
)
#: whole numbers, with the least each may be (a trend needs 3 points)
_COUNTS = {"convergence_window": 3}
#: pairs that must stay in this order (an inverted pair flags everything or nothing)
_ORDERED = (
    ("vanishing", "exploding"),
    ("relative_vanishing", "relative_exploding"),
    ("update_ratio_low", "update_ratio_high"),
    ("minor_issue_ratio", "problem_issue_ratio"),
    ("problem_issue_ratio", "critical_issue_ratio"),
    ("unstable", "stable_network"),
    ("batch_noise_sure", "batch_noise_far"),
)


def as_thresholds(value) -> Thresholds:
    """Accept None, a Thresholds, or a dict of overrides; raise a clear error otherwise."""
    if value is None:
        return Thresholds()
    if isinstance(value, Thresholds):
        return value
    if isinstance(value, dict):
        known = {f.name for f in fields(Thresholds)}
        unknown = set(value) - known
        if unknown:
            raise ValueError(f"unknown threshold(s) {sorted(unknown)}; known: {sorted(known)}")
        return Thresholds(**value)
    raise TypeError(f"thresholds must be a Thresholds, a dict or None, not {type(value).__name__}")
