"""Where the run's first NaN/Inf was made: evidence for the ``nonfinite`` cause.

The torch Recorder traces it while training (``gradwidget.collect.nonfinite``) and keeps it in
the run (``run.nonfinite_origin``, saved in meta.json); the analysis reads it here, without I/O.
"""
from __future__ import annotations

from ..run import NonfiniteOrigin, Run

__all__ = ["NonfiniteOrigin", "nonfinite_origin"]


def nonfinite_origin(run: Run) -> NonfiniteOrigin | None:
    """The traced origin of the run's first NaN/Inf (module, step, pass), or None when none was
    traced: the run stayed finite, or it was recorded without tracing (``trace_nonfinite=False``,
    ``ArrayRecorder``, a run written before tracing existed)."""
    if not isinstance(run, Run):
        raise TypeError(f"nonfinite_origin() needs a gradwidget Run, not {type(run).__name__}")
    return run.nonfinite_origin
