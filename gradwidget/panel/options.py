"""The constructor's options checked before anything is attached: a failed constructor must not
leave hooks (and an on_step callback) on the user's model."""

from __future__ import annotations

import numpy as np

from ..run import METRICS, Run


def check_options(metric, columns, max_rate, poll_interval, recorder_kwargs: dict) -> None:
    """Clear errors for the constructor's options (raised before anything is attached)."""
    if not isinstance(metric, str) or metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {list(METRICS)}")
    if isinstance(columns, bool) or not isinstance(columns, (int, np.integer)) or columns < 1:
        raise ValueError(f"columns must be a positive int (step columns of the heatmap), got {columns!r}")
    if isinstance(max_rate, bool) or not (isinstance(max_rate, (int, float)) and max_rate > 0):
        raise ValueError(f"max_rate must be a positive number of updates per second, got {max_rate!r}")
    if isinstance(poll_interval, bool) or not (isinstance(poll_interval, (int, float)) and poll_interval > 0):
        raise ValueError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
    if "step" in recorder_kwargs:
        raise TypeError(
            "GradientPanel takes no step argument: set panel.step (a recorded step) once "
            "the panel exists, which also stops it following the newest step"
        )


def source_layer_names(source) -> list[str] | None:
    """The layer names a source will show, known before attaching to it (None: a run directory,
    read when attached, or a source of unknown kind, rejected when attached)."""
    run = getattr(source, "run", None) if not isinstance(source, Run) else source
    if isinstance(run, Run):
        return run.layer_names
    if is_module(source):
        model = getattr(source, "module", source) if type(source).__name__ == "DistributedDataParallel" else source
        return [n for n, _ in model.named_parameters()]
    names = getattr(source, "layer_names", None)  # a Recorder (or trainer callback) before its first step
    return names if isinstance(names, list) else None


def check_layer_option(layer, names: list[str]) -> None:
    """``layer`` must be None, one of ``names`` or a column index of them (a clear error otherwise)."""
    if layer is None:
        return
    shown = ", ".join(repr(n) for n in names[:8]) + (f", ... ({len(names)} layers)" if len(names) > 8 else "")
    if isinstance(layer, str):
        if layer not in names:
            raise ValueError(f"no layer named {layer!r}; layers are {shown or 'none'}")
        return
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
        raise TypeError(
            f"layer must be a layer name (str) or a column index (int), got {type(layer).__name__} {layer!r}"
        )
    if not -1 <= int(layer) < len(names):
        raise ValueError(
            f"layer {int(layer)} is out of range: -1 (none) or a column index below "
            f"{len(names)}; layers are {shown or 'none'}"
        )


def is_module(obj) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(obj, torch.nn.Module)
