"""A field case: a training loop an installed package ships and runs itself, recorded with the
Recorder lines the README documents, on data bundled with installed packages, and the number that
says it trained healthily."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Health:
    """What says a run trained healthily: ``metric`` went from ``before`` to ``after``, and
    ``healthy`` is ``criterion`` applied to them (the case's assertion, kept in ``run.meta``)."""

    metric: str
    before: float
    after: float
    criterion: str
    healthy: bool

    def __str__(self) -> str:
        verdict = "holds" if self.healthy else "FAILS"
        return f"{self.metric} {self.before:.4g} -> {self.after:.4g} ({self.criterion}: {verdict})"

    def as_meta(self) -> dict:
        return {
            "metric": self.metric,
            "before": self.before,
            "after": self.after,
            "criterion": self.criterion,
            "healthy": self.healthy,
        }


@dataclass(frozen=True)
class FieldCase:
    """One field case. ``requires`` are the import names it needs (``package``: what to
    ``pip install``); ``train()`` runs the package's loop under a Recorder and returns
    ``(run, health)``."""

    id: str
    package: str
    requires: tuple[str, ...]
    task: str
    train: Callable

    def missing(self) -> list[str]:
        """The import names in ``requires`` that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def skip_reason(self) -> str | None:
        """Why the case cannot run here (a message naming what to install), or None."""
        gone = self.missing()
        if not gone:
            return None
        return f"{', '.join(gone)} not installed (pip install {self.package})"
