"""A Run's layers: one ``LayerInfo`` per parameter tensor, and the check of a layer list."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable


#: statuses a layer can have.
LAYER_STATUSES = ("trainable", "frozen", "unused")


@dataclass
class LayerInfo:
    """One parameter tensor: where it lives in the model and where it sits in the backward graph."""

    name: str
    module: str = ""
    module_type: str = ""
    shape: tuple = ()
    numel: int = 0
    dtype: str = "float32"
    #: position at which its gradient arrived in the first recorded backward pass (0 = first,
    #: i.e. nearest the loss); -1 when it never received one.
    backward_index: int = -1
    #: "trainable", "frozen" (requires_grad=False) or "unused" (trainable but never got a gradient).
    status: str = "trainable"
    #: the other names this very tensor has in the model (tied weights: GPT-2's ``lm_head.weight`` is
    #: ``transformer.wte.weight``); it is recorded once, under ``name``, with the gradient of every use.
    tied: tuple = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["tied"] = list(self.tied)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LayerInfo":
        d = dict(d)
        d["shape"] = tuple(d.get("shape", ()))
        d["tied"] = tuple(d.get("tied", ()))
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def as_layers(layers) -> list[LayerInfo]:
    """A Run's layers as LayerInfo, from names, dicts or LayerInfo; names must be unique (a column
    is found by its name)."""
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise TypeError(f"layers must be a list of layer names, dicts or LayerInfo, not {type(layers).__name__}")
    out = []
    for x in layers:
        if isinstance(x, LayerInfo):
            out.append(x)
        elif isinstance(x, str):
            out.append(LayerInfo(name=x))
        elif isinstance(x, dict):
            out.append(LayerInfo.from_dict(x))
        else:
            raise TypeError(f"a layer must be a name, a dict or a LayerInfo, not {type(x).__name__}")
    names = [info.name for info in out]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"layer names must be unique; repeated: {dup}")
    return out
