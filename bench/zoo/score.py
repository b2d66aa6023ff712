"""Scoring diagnoses against the zoo's labels: pure functions over (case, findings) pairs, so a test
can assert on them without training anything.

A *finding* is one recommendation of ``gradwidget.analyze(run)``, reduced to what is scored: its
priority, its cause, the first step it applies from, and its layers (most affected first).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .case import Case

#: priorities that count as an alarm on a healthy run (Low is advice, not an alarm)
ALARM_PRIORITIES: tuple[str, ...] = ("Critical", "High", "Medium")
#: a matching finding is timely when its first step is below this many recorded steps
DETECTION_STEPS = 50
NONE = "none"  #: the reported cause when nothing was reported


@dataclass(frozen=True)
class Finding:
    priority: str
    cause: str
    first_step: int | None = None
    layers: tuple[str, ...] = ()

    def __str__(self) -> str:
        at = "" if self.first_step is None else f"@{self.first_step}"
        shown = list(self.layers[:4]) + (["..."] if len(self.layers) > 4 else [])
        return f"{self.priority} {self.cause}{at} [{', '.join(shown)}]"


def finding_of(rec) -> Finding:
    """One diagnosis as a finding."""
    step = getattr(rec, "first_step", None)
    return Finding(
        str(getattr(rec, "priority", "")),
        str(rec.cause),
        None if step is None else int(step),
        tuple(getattr(rec, "layers", None) or ()),
    )


def findings_of(report) -> list[Finding]:
    """The report's diagnoses in rank order, as findings."""
    return [finding_of(r) for r in report.diagnoses]


@dataclass
class Result:
    """One case's diagnosis: the labelled case, what was found (rank order), analysis seconds."""

    case: Case
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def alarms(self) -> list[Finding]:
        return [f for f in self.findings if f.priority in ALARM_PRIORITIES]

    @property
    def rank(self) -> int | None:
        """0-based rank of the first finding naming the case's cause (None: not found)."""
        return next((i for i, f in enumerate(self.findings) if f.cause == self.case.cause), None)

    @property
    def match(self) -> Finding | None:
        r = self.rank
        return None if r is None else self.findings[r]

    @property
    def first_cause(self) -> str:
        return self.findings[0].cause if self.findings else NONE


def false_alarms(results: list[Result]) -> list[Result]:
    """Healthy cases with any Critical/High/Medium finding."""
    return [r for r in results if r.case.healthy and r.alarms]


def cause_accuracy(results: list[Result]) -> dict:
    """Over the mistakes: the fraction with the right cause ranked first and within the first two,
    the fraction with the right cause first as an alarm (Medium or above: Low is advice a user may
    not act on), the ids of those that miss (right cause not first) and of those found only at Low."""
    ms = [r for r in results if not r.case.healthy]
    n = len(ms)
    top1 = [r for r in ms if r.rank == 0]
    top2 = [r for r in ms if r.rank is not None and r.rank < 2]
    low = [r for r in top1 if r.match is not None and r.match.priority not in ALARM_PRIORITIES]
    return {
        "n": n,
        "top1": len(top1) / n if n else float("nan"),
        "top2": len(top2) / n if n else float("nan"),
        "top1_alarm": (len(top1) - len(low)) / n if n else float("nan"),
        "misses": [r.case.id for r in ms if r.rank != 0],
        "low_only": [r.case.id for r in low],
    }


def by_cause(results: list[Result]) -> dict[str, tuple[int, int, int]]:
    """Per true cause: (right cause first, within the first two, cases)."""
    out: dict[str, tuple[int, int, int]] = {}
    for r in results:
        if r.case.cause is None:
            continue
        a, b, n = out.get(r.case.cause, (0, 0, 0))
        out[r.case.cause] = (a + (r.rank == 0), b + (r.rank is not None and r.rank < 2), n + 1)
    return dict(sorted(out.items()))


def layer_match(fault_layers, found_layers) -> tuple[float, float]:
    """(recall, precision) of ``found_layers`` against ``fault_layers``; a finding with no layers has
    precision 0 (it points nowhere) and recall 0."""
    truth, found = set(fault_layers), set(found_layers)
    hit = len(truth & found)
    return (hit / len(truth) if truth else float("nan"), hit / len(found) if found else 0.0)


def layer_scores(results: list[Result]) -> dict:
    """Over the mistakes with fault layers: per case (recall, precision) of the first matching
    finding's layers (0, 0 when the cause was not found), and their means."""
    per = {}
    for r in results:
        if r.case.healthy or not r.case.fault_layers:
            continue
        m = r.match
        per[r.case.id] = layer_match(r.case.fault_layers, m.layers) if m else (0.0, 0.0)
    n = len(per)
    return {
        "n": n,
        "per_case": per,
        "recall": sum(v[0] for v in per.values()) / n if n else float("nan"),
        "precision": sum(v[1] for v in per.values()) / n if n else float("nan"),
    }


def detection(results: list[Result], limit: int = DETECTION_STEPS) -> dict:
    """First steps of the matching findings; ``slow``: found at or after ``limit`` recorded steps, or
    found without a first step; ``expected``: those of them labelled ``slow_onset``. Cases whose
    cause was not found are not counted here."""
    matches = {r.case.id: m for r in results if not r.case.healthy and (m := r.match) is not None}
    found = [r for r in results if r.case.id in matches]
    steps = {i: m.first_step for i, m in matches.items()}
    slow = [i for i, s in steps.items() if s is None or s >= limit]
    expected = [r.case.id for r in found if r.case.id in slow and r.case.slow_onset]
    return {"steps": steps, "slow": slow, "expected": expected, "limit": limit}


def confusion(results: list[Result]) -> Counter:
    """Counts of (true cause, first reported cause) over every case; healthy is "healthy"."""
    return Counter((r.case.cause or "healthy", r.first_cause) for r in results)


def format_confusion(counts: Counter) -> str:
    """The confusion table as text: rows true cause, columns first reported cause."""
    rows = sorted({t for t, _ in counts})
    cols = sorted({p for _, p in counts})
    w = max([len(r) for r in rows] + [5]) + 1
    cw = [max(len(c), 3) + 1 for c in cols]
    head = " " * w + "".join(c.rjust(k) for c, k in zip(cols, cw))
    lines = [head] + [
        r.ljust(w) + "".join(str(counts.get((r, c), "") or ".").rjust(k) for c, k in zip(cols, cw)) for r in rows
    ]
    return "\n".join(lines)
