"""How ``run.meta``'s changes reach a live run folder's meta.json (``MetaFollow``, owned by the
Recorder): a probe's evidence (the zero_grad check's counts, the noise probe's and the NaN
tracer's notes, the loss graph, a trainer's clipping) is in the folder while training goes on, so
``load_run``, ``gradwidget report`` and ``compare`` of a live folder read what the Recorder sees.

A finding (the first carried gradient, a NaN's origin, a note on why something is not measured) is
written at once. Counts that change every step are written at the end of a recorded step once a
flush interval passed since meta.json was last written: ``FLUSH_SECONDS`` of training, or 50
times what the last write took where that is longer (a model of many thousands of layers has a
large meta.json: its rewrites stay within 2% of the time). ``detach()`` writes what is left. A
reader of a live folder so lags the Recorder by at most one flush interval of training, and once
training pauses, by the steps of its last interval until the next recorded step or ``detach()``.
Private to ``gradwidget.collect``.
"""

from __future__ import annotations

import time

#: the shortest time between two rewrites of meta.json for counts that change every step (s)
FLUSH_SECONDS = 1.0
#: a rewrite may take at most this share of the time between two (a large meta.json waits longer)
WRITE_SHARE = 0.02


#: the clock the intervals are measured on (a test sets its own)
_clock = time.monotonic


class MetaFollow:
    """Whether ``run.meta`` changed since meta.json was written, and when to write it."""

    def __init__(self) -> None:
        self.clock = _clock
        self.dirty = False
        self._written_at = -float("inf")
        self._interval = FLUSH_SECONDS

    def changed(self, writer, now: bool = False) -> None:
        """``run.meta`` changed: write it with ``now`` (a finding), else within the interval."""
        self.dirty = True
        if now:
            self.flush(writer)

    def step_end(self, writer) -> None:
        """At the end of a recorded step: write what changed once the interval passed."""
        if self.dirty and self.clock() - self._written_at >= self._interval:
            self.flush(writer)

    def flush(self, writer) -> None:
        """Write meta.json now if it changed (``detach()``, a finding)."""
        if writer is None or not self.dirty:
            return
        start = self.clock()
        writer.write_meta()
        end = self.clock()
        self.dirty = False
        self._written_at = end
        self._interval = max(FLUSH_SECONDS, (end - start) / WRITE_SHARE)
