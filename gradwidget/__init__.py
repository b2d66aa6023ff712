"""gradwidget: see how gradients flow through a network while it trains.

Public API: GradientPanel, Recorder, record (array recorder), Run, load_run, analyze, compare, Thresholds;
the outputs of a run, a report or a comparison: summary(run), write_report(report, path),
write_comparison(cmp, path) (the text and file outputs of a Run: ``gradwidget.outputs``);
every warning gradwidget gives is a GradwidgetWarning.
Names are imported lazily so that ``import gradwidget`` stays fast and does not import torch.
"""

from __future__ import annotations

from ._warnings import GradwidgetWarning
from .run import METRICS, SCALARS, LayerInfo, NonfiniteOrigin, Run
from .thresholds import Thresholds

__version__ = "0.1.0"

_LAZY = {
    "Recorder": ("gradwidget.collect.torch", "Recorder"),
    "ArrayRecorder": ("gradwidget.collect.arrays", "ArrayRecorder"),
    "load_run": ("gradwidget.storage", "load_run"),
    "analyze": ("gradwidget.analysis", "analyze"),
    "compare": ("gradwidget.comparison", "compare"),
    "summary": ("gradwidget.outputs", "summary"),
    "write_report": ("gradwidget.report", "write_report"),
    "write_comparison": ("gradwidget.report", "write_comparison"),
    "GradientPanel": ("gradwidget.panel.widget", "GradientPanel"),
}

__all__ = [
    "GradientPanel",
    "Recorder",
    "ArrayRecorder",
    "Run",
    "LayerInfo",
    "NonfiniteOrigin",
    "load_run",
    "analyze",
    "compare",
    "summary",
    "write_report",
    "write_comparison",
    "Thresholds",
    "METRICS",
    "SCALARS",
    "GradwidgetWarning",
    "__version__",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gradwidget' has no attribute {name!r}")
