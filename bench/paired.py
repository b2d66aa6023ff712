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
scale one step in 8) falls in a minority of short blocks, where a median over rounds never sees
it: ``group`` sums consecutive rounds into one ratio over a whole period of that work (rounds of
2 steps, a period of 40 steps: groups of 20), and the median is taken over those.

Python's full collections (the oldest generation: 100-150 ms with torch imported, several steps'
worth of a small model) land in whichever block is running when one is due: a few per run, each
moving one group's ratio by 10% or more. Each block's time spent in them is measured
(``FullCollections``) and taken out of the per-group ratios; how many each variant had, and the
ratio of all CPU time with them in (the cost over a whole run), are reported beside them.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Callable


class FullCollections:
    """Time this process has spent in Python's full collections (``gc.callbacks``), wall and CPU
    seconds, and how many: installed once per process (``installed``)."""

    _installed: FullCollections | None = None

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.count = 0
        self._start = (0.0, 0.0)
        gc.callbacks.append(self._see)

    @classmethod
    def installed(cls) -> FullCollections:
        if cls._installed is None:
            cls._installed = cls()
        return cls._installed

    def _see(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        now = (time.perf_counter(), time.process_time())
        if phase == "start":
            self._start = now
        else:
            self.wall += now[0] - self._start[0]
            self.cpu += now[1] - self._start[1]
            self.count += 1

    def reading(self) -> tuple[float, float, int]:
        return self.wall, self.cpu, self.count


def timed(step: Callable[[], None]) -> Callable[[int], tuple]:
    """A block of ``n`` calls of ``step`` in this process: its ``(wall seconds, CPU seconds, wall
    and CPU seconds of them in full collections, full collections)``."""
    full = FullCollections.installed()

    def block(n: int) -> tuple:
        g0 = full.reading()
        t, c = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        return (wall, cpu, *(b - a for a, b in zip(g0, full.reading())))

    return block


def interleaved_rounds(
    blocks: dict[str, Callable[[int], tuple]], rounds: int, per_block: int
) -> dict[str, list[tuple]]:
    """Per variant, each round's reading of a block of ``per_block`` steps (``blocks[v](n)`` runs
    and times one: ``timed``); the order of the variants reverses every round, so a trend over a
    round hits both ends alike."""
    names = list(blocks)
    out: dict[str, list[tuple]] = {v: [] for v in names}
    for r in range(rounds):
        for v in names if r % 2 == 0 else names[::-1]:
            out[v].append(tuple(blocks[v](per_block)))
    return out


def grouped(blocks: list[tuple], group: int) -> list[tuple]:
    """Sums of ``group`` consecutive rounds' readings (a trailing partial group dropped)."""
    n = len(blocks) // group * group
    return [tuple(map(sum, zip(*blocks[i : i + group]))) for i in range(0, n, group)]


def ratio_summary(blocks: list[tuple], base: list[tuple], group: int = 1) -> dict[str, dict[str, float]]:
    """``{"wall"|"cpu": {median, q1, q3, lo, hi, n}}`` of the ratios of ``blocks`` to ``base`` per
    round, or per ``group`` consecutive rounds summed (a whole period of work done one step in N),
    full collections' time taken out; lo-hi: the bootstrap 95% interval of the median; n: the
    ratios it is taken over. ``"all"``: the ratio of all CPU time, collections in (``ratio``, its
    bootstrap interval over the groups ``lo``-``hi``), and each side's full collections."""
    if group > 1:
        blocks, base = grouped(blocks, group), grouped(base, group)
    if len(blocks) < 2:
        raise ValueError(f"{len(blocks)} ratio(s): too few rounds for groups of {group}")
    out: dict[str, dict[str, float]] = {}
    for k, clock in enumerate(("wall", "cpu")):
        ratios = [(b[k] - b[k + 2]) / (a[k] - a[k + 2]) for b, a in zip(blocks, base) if a[k] > a[k + 2]]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        lo, hi = _bootstrap(ratios, statistics.median)
        out[clock] = {"median": statistics.median(ratios), "q1": q1, "q3": q3, "lo": lo, "hi": hi, "n": len(ratios)}
    pairs = [(b[1], a[1]) for b, a in zip(blocks, base)]
    lo, hi = _bootstrap(pairs, lambda ps: sum(b for b, _ in ps) / sum(a for _, a in ps))
    out["all"] = {
        "ratio": sum(b for b, _ in pairs) / sum(a for _, a in pairs),
        "lo": lo,
        "hi": hi,
        "collections": sum(b[4] for b in blocks),
        "base_collections": sum(a[4] for a in base),
    }
    return out


def _bootstrap(xs: list, stat: Callable[[list], float], draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95% interval of ``stat(xs)``."""
    rng = random.Random(seed)
    vals = sorted(stat(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return vals[int(0.025 * draws)], vals[int(0.975 * draws) - 1]


def summary_text(s: dict[str, dict[str, float]]) -> str:
    """One table cell: the CPU and wall-clock medians with their 95% intervals (full collections
    out), then all CPU time's ratio with them in."""
    c, w, a = s["cpu"], s["wall"], s["all"]
    return (
        f"CPU {c['median']:.3f}x (95% CI {c['lo']:.3f}-{c['hi']:.3f}, IQR {c['q1']:.2f}-{c['q3']:.2f}); "
        f"wall {w['median']:.3f}x (95% CI {w['lo']:.3f}-{w['hi']:.3f}, IQR {w['q1']:.2f}-{w['q3']:.2f}); "
        f"all CPU time {a['ratio']:.3f}x (95% CI {a['lo']:.3f}-{a['hi']:.3f}; "
        f"full collections {a['collections']:.0f} against {a['base_collections']:.0f})"
    )
