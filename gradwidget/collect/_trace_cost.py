"""What the NaN-origin tracer costs a step, and whether ``trace_nonfinite="auto"`` keeps it on.

The tracer's hooks run Python at every module call (~10-40 us on CPU): nothing next to a
transformer block's matmuls, more than the whole work of a tiny module. The tracer times its own
hook bodies in their thread's CPU time (two ``thread_time`` reads per hook, ~0.3 us; a wait for the GIL
or a core is not the tracer's cost) and, after a warm-up
step, this meter sets that time over a few steps against the steps' wall time (end of one step to
end of the next). With ``"auto"`` the recorder then removes the hooks when they cost more than
``AUTO_SHARE`` of a step AND more than ``AUTO_FLOOR_S`` per step: both must hold, so a fast step of
a small model (the share alone is large) keeps its tracing, and so does a big model's slow step
(the time alone is large).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: the accepted values of ``Recorder(trace_nonfinite=...)``
TRACE_MODES = (True, False, "auto")
#: "auto" stops tracing above this share of the step's wall time. Measured on CPU (docs/costs.md):
#: the bench transformer's hooks take ~1.6% of its step (2.4 ms), a toy MLP's ~15% of its tiny
#: step (0.1 ms), 5,000 x Linear(2,2) ~30% (150 ms; 60-70% of a bare step): 10% keeps the first
#: and stops the last (the toy MLP is kept by the floor below)
AUTO_SHARE = 0.10
#: ... and above this many seconds per step: a toy MLP's hooks take ~0.1 ms a step, 50 x
#: Linear(2,2) ~0.8 ms, the bench transformer's ~2.5 ms, 500 tiny Linears' ~8 ms and 5,000's ~150 ms:
#: under 5 ms a step tracing is kept whatever its share (nobody notices it, and a small model is
#: where users learn where their NaN began)
AUTO_FLOOR_S = 0.005
#: steps not measured first (the first forward builds caches, the first backward plans)
WARMUP_STEPS = 1
#: steps measured after the warm-up before deciding
MEASURED_STEPS = 3


def check_mode(value) -> bool | str:
    """``value`` if it is True, False or "auto", else a clear TypeError."""
    if isinstance(value, (bool, str)) and value in TRACE_MODES:
        return value
    raise TypeError(f"trace_nonfinite must be True, False or 'auto', got {type(value).__name__} {value!r}")


@dataclass(frozen=True)
class TraceCost:
    """The tracer's measured cost, averaged per step over the measured steps."""

    step: int  #: the step at which it was measured
    hook_s: float  #: seconds inside the tracer's hooks per step
    step_s: float  #: wall seconds per step
    calls: float  #: module calls traced per step

    @property
    def share(self) -> float:
        return self.hook_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def too_dear(self) -> bool:
        """Whether ``"auto"`` turns tracing off (module constants read now, so a test can set them)."""
        return self.share > AUTO_SHARE and self.hook_s > AUTO_FLOOR_S

    def text(self) -> str:
        return (
            f"its hooks took {self.hook_s * 1e3:,.1f} ms per step ({self.share:.1%} of the step, "
            f"{self.calls:,.0f} module calls per step)"
        )


class CostMeter:
    """Adds up the tracer's hook time and the wall time of the steps after the warm-up; ``end_step``
    gives the cost once, when ``MEASURED_STEPS`` steps have been measured. ``clock``: seconds."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.clock = clock
        self._ended = 0
        self._last: float | None = None
        self._hook = self._wall = 0.0
        self._calls = 0
        self.done = False

    def end_step(self, step: int, hook_s: float, calls: int) -> TraceCost | None:
        """Account for one ended step (``hook_s`` seconds in the hooks over ``calls`` module calls)."""
        if self.done:
            return None
        now, last = self.clock(), self._last
        self._last = now
        self._ended += 1
        if self._ended <= WARMUP_STEPS or last is None:
            return None
        self._hook += hook_s
        self._wall += now - last
        self._calls += calls
        n = self._ended - WARMUP_STEPS
        if n < MEASURED_STEPS:
            return None
        self.done = True
        return TraceCost(step, self._hook / n, self._wall / n, self._calls / n)
