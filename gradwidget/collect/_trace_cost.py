"""What the per-module NaN tracer costs a step, measured whole, and whether ``trace_nonfinite="auto"``
keeps it on.

With ``"auto"`` the origin of a NaN is found by replaying the first non-finite step (``_replay``),
which costs a finite step almost nothing. The per-module tracer (what ``True`` runs on every step)
also sees steps that are not recorded (``every`` > 1) and models a replay cannot run again; "auto"
keeps it too where it is free, and only there. Whether it is free is measured the only honest way:
steps with its hooks and without them, alternated during the warm-up (paired, so that a busy
machine hits both alike), in wall-clock time and in the process's CPU time, and it stays only if
every pair (a step with the hooks over the step without them beside it) shows it within its share,
on both clocks. The largest of ``n`` paired ratios lies below the median of their distribution
with probability ``2**-n`` only, so at ``MEASURED_PAIRS = 4`` it bounds the tracer's cost from
above with 94% confidence, where a ratio of medians of four steps each bounds nothing (other
processes slow a step by 20-40% on a shared machine: bench/paired.py). Wall time alone, on a
shared machine, read 0.73x for a tracer that costs 1.1x (four steps of each, other processes'
bursts); CPU time alone misses a GPU's waits. Its hooks' own run time would miss most of the cost:
what hooks cost PyTorch (the slow path of every module call, the backward hooks' wrappers,
dispatch), measured in a Jupyter kernel at 1.35x a bare step while the hooks timed
themselves at 10%. The hooks are put on and taken off between steps, and the clock is
read after that, so the switching is in neither.

On a CPU the tracer is never that cheap for a real model (a transformer block's Python per module
call is a few percent of its step); on a GPU, where the host runs ahead of the device, it can be.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

#: the product's budget: recording at its defaults costs at most this times a bare step
BUDGET = 1.05
#: what an optional instrument may cost: steps with it at most this times the steps without, what
#: is left of ``BUDGET`` after the recording's own 2-3% (docs/costs.md). "auto" keeps the per-module
#: tracer only where it measures within it; the noise probe's cadence (``_noise.NOISE_EVERY``) is
#: set to keep it within it on the bench's models (bench/overhead.py --paired)
INSTRUMENT_SHARE = 1.02
#: steps not measured first (the first forward builds caches, the first backward plans)
WARMUP_STEPS = 1
#: steps measured with and without the tracer each, alternated, after the warm-up
MEASURED_PAIRS = 4
#: ... unless a pair already shows it this dear on both clocks: then it is taken off at once (on
#: thousands of tiny modules a traced step costs 2-3x; being wrong here only leaves the replay)
EARLY_OFF = 1.5


@dataclass(frozen=True)
class TraceCost:
    """The tracer's measured cost: median wall seconds of a step with and without its hooks."""

    step: int  #: the step at which it was measured
    on_s: float  #: median wall seconds of a step with the hooks
    off_s: float  #: median wall seconds of a step without them
    calls: float  #: module calls traced per step
    cpu_ratio: float = 1.0  #: the same ratio in the process's CPU time
    #: the largest paired ratio (a step with the hooks over the step without them beside it), wall
    #: and CPU: the upper confidence bound of the cost (None: the ratio of medians stands for it)
    wall_upper: float | None = None
    cpu_upper: float | None = None
    pairs: int = 0  #: the pairs the bounds are taken over

    @property
    def ratio(self) -> float:
        return self.on_s / self.off_s if self.off_s > 0 else float("inf")

    @property
    def too_dear(self) -> bool:
        """Whether ``"auto"`` takes the tracer off: either clock's upper bound is over
        ``INSTRUMENT_SHARE`` (the module constant read now, so a test can set it), or a ratio of
        medians is as far under 1 (``unmeasured``)."""
        wall = self.ratio if self.wall_upper is None else self.wall_upper
        cpu = self.cpu_ratio if self.cpu_upper is None else self.cpu_upper
        return self.unmeasured or not (wall <= INSTRUMENT_SHARE and cpu <= INSTRUMENT_SHARE)

    @property
    def unmeasured(self) -> bool:
        """Hooks only add work: a tracer that measured cheaper than none, by more than the budget's
        margin, measured other work done on the steps without it (a panel's first updates, another
        process), not itself (a panel's recorder would keep a tracer that costs more than the budget)."""
        floor = 2 - INSTRUMENT_SHARE
        return self.ratio < floor or self.cpu_ratio < floor

    def text(self) -> str:
        return (
            f"steps took {self.ratio:.2f}x with its hooks ({self.on_s * 1e3:,.1f} ms against "
            f"{self.off_s * 1e3:,.1f} ms, medians of up to {MEASURED_PAIRS} each; {self.cpu_ratio:.2f}x in CPU time; "
            + (
                f"at most {self.wall_upper:.2f}x and {self.cpu_upper:.2f}x over its {self.pairs} pairs; "
                if self.wall_upper is not None and self.cpu_upper is not None
                else ""
            )
            + f"{self.calls:,.0f} module calls per step"
            + ("; cheaper than none: other work measured, not its cost)" if self.unmeasured else ")")
        )


class PairedMeter:
    """Alternates the tracer on and off over the steps after the warm-up and times each step, from
    the end of one to the end of the next; ``end_step`` gives the cost once, when ``MEASURED_PAIRS``
    steps of each kind are measured. ``clock``: seconds."""

    def __init__(self, clock=time.perf_counter, cpu_clock=time.process_time) -> None:
        self.clock, self.cpu_clock = clock, cpu_clock
        self._ended = 0
        self._last: float | None = None
        self._last_cpu = 0.0
        self._on: list[float] = []
        self._off: list[float] = []
        self._cpu_on: list[float] = []
        self._cpu_off: list[float] = []
        self._calls: list[int] = []
        self.tracing = True  # whether the step under way runs with the hooks
        self.done = False

    def end_step(self, step: int, calls: int) -> TraceCost | None:
        """Account for the step that ended (``calls`` module calls traced in it, when traced);
        sets ``tracing`` for the next step. Call ``restart`` once the hooks are switched."""
        if self.done:
            return None
        now, cpu = self.clock(), self.cpu_clock()
        self._ended += 1
        if self._ended > WARMUP_STEPS and self._last is not None:
            (self._on if self.tracing else self._off).append(now - self._last)
            (self._cpu_on if self.tracing else self._cpu_off).append(cpu - self._last_cpu)
            if self.tracing:
                self._calls.append(calls)
        full = len(self._on) >= MEASURED_PAIRS and len(self._off) >= MEASURED_PAIRS
        if full or (self._on and self._off and self._ratios() > EARLY_OFF):
            self.done = True
            off_cpu = statistics.median(self._cpu_off)
            return TraceCost(
                step,
                statistics.median(self._on),
                statistics.median(self._off),
                statistics.fmean(self._calls),
                statistics.median(self._cpu_on) / off_cpu if off_cpu > 0 else 1.0,
                wall_upper=largest_ratio(self._on, self._off),
                cpu_upper=largest_ratio(self._cpu_on, self._cpu_off),
                pairs=min(len(self._on), len(self._off)),
            )
        if self._ended >= WARMUP_STEPS:
            self.tracing = not self.tracing
        return None

    def _ratios(self) -> float:
        """The smaller of the two clocks' ratios of medians so far."""
        wall = statistics.median(self._on) / max(statistics.median(self._off), 1e-12)
        cpu = statistics.median(self._cpu_on) / max(statistics.median(self._cpu_off), 1e-12)
        return min(wall, cpu)

    def restart(self) -> None:
        """Start the next step's clock (after the hooks were put on or taken off)."""
        self._last, self._last_cpu = self.clock(), self.cpu_clock()


def largest_ratio(on: list[float], off: list[float]) -> float:
    """The largest ratio of a step with the hooks to the step without them measured beside it
    (the steps alternate, so the ``i``-th of each are neighbours)."""
    return max((a / b if b > 0 else float("inf")) for a, b in zip(on, off))
