"""Ratios of step costs on a shared machine: many short blocks, paired and interleaved.

Other processes on the same cores slow whichever block runs while they run, by 20-40% on the
2-core machine this project is developed on. A long block per variant lets that drift land on
one variant; many short blocks, one of each variant per round in an order that alternates
(ABBA...), pair every block of a variant with the baseline block beside it, so the drift divides
out of each round's ratio. Each round gives a ratio in wall-clock time and one in the process's
CPU time (``time.process_time``: all its threads; what other processes run is not in it, though
they still slow it through shared caches). Reported: the median over rounds, the interquartile
range, and a bootstrap 95% confidence interval of the median.

Work a recorder does one step in N (histograms and update norms every 10 recorded steps, the noise
scale one step in 4) falls in a minority of short blocks, where a median over rounds never sees
it: ``group`` sums consecutive rounds into one ratio over a whole period of that work (rounds of
2 steps, a period of 20 steps: groups of 10), and the median is taken over those.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Callable


def interleaved_rounds(steps: dict[str, Callable[[], None]], rounds: int, per_block: int) -> dict[str, list[tuple]]:
    """Per variant, each round's ``(wall seconds, CPU seconds)`` of ``per_block`` calls of its step;
    the order of the variants reverses every round, so a trend over a round hits both ends alike."""
    names = list(steps)
    out: dict[str, list[tuple]] = {v: [] for v in names}
    for r in range(rounds):
        for v in names if r % 2 == 0 else names[::-1]:
            fn = steps[v]
            t, c = time.perf_counter(), time.process_time()
            for _ in range(per_block):
                fn()
            out[v].append((time.perf_counter() - t, time.process_time() - c))
    return out


def _median_ci(xs: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95% interval of the median of ``xs``."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return meds[int(0.025 * draws)], meds[int(0.975 * draws) - 1]


def grouped(blocks: list[tuple], group: int) -> list[tuple]:
    """Sums of ``group`` consecutive rounds' ``(wall, CPU)`` (a trailing partial group dropped)."""
    n = len(blocks) // group * group
    return [tuple(map(sum, zip(*blocks[i : i + group]))) for i in range(0, n, group)]


def ratio_summary(blocks: list[tuple], base: list[tuple], group: int = 1) -> dict[str, dict[str, float]]:
    """``{"wall"|"cpu": {median, q1, q3, lo, hi, n}}`` of the ratios of ``blocks`` to ``base`` per
    round, or per ``group`` consecutive rounds summed (a whole period of work done one step in N);
    lo-hi: the bootstrap 95% interval of the median; n: the ratios it is taken over."""
    if group > 1:
        blocks, base = grouped(blocks, group), grouped(base, group)
    if len(blocks) < 2:
        raise ValueError(f"{len(blocks)} ratio(s): too few rounds for groups of {group}")
    out = {}
    for k, clock in enumerate(("wall", "cpu")):
        ratios = [b[k] / a[k] for b, a in zip(blocks, base) if a[k] > 0]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        lo, hi = _median_ci(ratios)
        out[clock] = {"median": statistics.median(ratios), "q1": q1, "q3": q3, "lo": lo, "hi": hi, "n": len(ratios)}
    return out


def summary_text(s: dict[str, dict[str, float]]) -> str:
    """One table cell: the CPU and wall-clock medians with their 95% intervals."""
    c, w = s["cpu"], s["wall"]
    return (
        f"CPU {c['median']:.3f}x (95% CI {c['lo']:.3f}-{c['hi']:.3f}, IQR {c['q1']:.2f}-{c['q3']:.2f}); "
        f"wall {w['median']:.3f}x (95% CI {w['lo']:.3f}-{w['hi']:.3f}, IQR {w['q1']:.2f}-{w['q3']:.2f})"
    )
