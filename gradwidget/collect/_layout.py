"""The Recorder's column layout, fixed at its first recorded step: the order of the columns (depth
order, the reverse of the gradients' arrival), what the run says of each layer, and how many steps
the in-memory run keeps. Functions of what they are given; the Recorder keeps what they return.
Private to ``gradwidget.collect``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..noise_series import noise_dtype
from ..run import LayerInfo, step_bytes
from ._inputs import _module_of

if TYPE_CHECKING:
    from .distributed import DistContext


def column_order(arrived: list[int], n_params: int) -> list[int]:
    """The parameters' columns: those whose gradient arrived in depth order (the reverse of their
    arrival), each one that did not placed after the parameter before it in the model."""
    rank = {p: len(arrived) - 1 - k for k, p in enumerate(arrived)}  # depth rank
    keys: list[tuple[float, int, int]] = []
    last: float = -0.5
    for i in range(n_params):
        if i in rank:
            last = rank[i]
            keys.append((last, 0, i))
        else:
            keys.append((last, 1, i))
    return [i for _, _, i in sorted(keys)]


def layer_infos(
    model: nn.Module,
    names: list[str],
    params: list[torch.Tensor],
    tied: dict[int, tuple[str, ...]],
    order: list[int],
    arrived: list[int],
    dist: DistContext | None = None,
) -> list[LayerInfo]:
    """The run's layers, one per column of ``order``; ``arrived``: the parameters whose gradient
    arrived, in order; ``dist``: a sharded model's context (full shapes, FSDP's names cleaned)."""
    if dist is not None:
        from .distributed import clean_name, type_name
    seen = set(arrived)
    layers = []
    for i in order:
        p, name = params[i], names[i]
        mod, mtype = _module_of(model, name)
        status = "frozen" if not p.requires_grad else ("trainable" if i in seen else "unused")
        shape = dist.full_shape(name, p) if dist is not None else tuple(p.shape)
        if dist is not None:
            mtype = type_name(model.get_submodule(mod)) if mtype else mtype
            name, mod = clean_name(name), clean_name(mod)
        layers.append(
            LayerInfo(
                name=name,
                module=mod,
                module_type=mtype,
                shape=shape,
                numel=math.prod(shape),
                dtype=str(p.dtype).replace("torch.", ""),
                backward_index=arrived.index(i) if i in seen else -1,
                status=status,
                tied=tied.get(id(p), ()),
            )
        )
    return layers


def window(
    max_steps: int | str | None, memory_budget: int, histogram_every: int, n_layers: int, noise_every: int | None
) -> int | None:
    """Steps kept in memory: with "auto", as many as fit the memory budget (the Run's capacity is
    up to twice the window; docs/costs.md, Memory), at least 1,000. ``noise_every``: the noise
    probe keeps a row one recorded step in this many (None: it keeps none)."""
    if max_steps is None or isinstance(max_steps, int):
        return max_steps
    per_step = step_bytes(n_layers, histogram_every)
    if noise_every is not None:  # run.noise: a row a measured step
        per_step += noise_dtype(n_layers).itemsize / noise_every
    return max(1000, int(memory_budget / (2 * per_step)))


def window_text(max_steps: int | str | None, memory_budget: int, kept: int | None) -> str:
    """How many steps the in-memory run keeps (``kept``), and what decided it, in words."""
    if max_steps is None:
        return "keeping every step in memory (max_steps=None)"
    why = (
        f"max_steps='auto': a {memory_budget / 2**20:,.0f} MiB memory_budget"
        if max_steps == "auto"
        else f"max_steps={max_steps}"
    )
    return f"keeping the last {kept:,} steps in memory ({why})"
