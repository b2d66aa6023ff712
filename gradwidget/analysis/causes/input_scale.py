"""``input_scale``: unnormalised inputs. Reads the RMS of the data entering the first layer, from
its weight and bias gradients (``evidence.input_rms``)."""

from __future__ import annotations

import numpy as np

from ..evidence import input_rms
from ._base import CauseRule, Context, Diagnosis
from ._shared import start_step

#: the data entering the first layer is unnormalised when its estimated RMS is outside this band
#: (normalised data: about 1; the zoo's healthy runs 0.3-3, its x255 and x1000 inputs 200 and up).
INPUT_RMS_HIGH = 30.0
INPUT_RMS_LOW = 0.01


def find(c: Context) -> Diagnosis | None:
    rms = input_rms(c.run, c.arch, c.s.cannot_move)
    if not np.isfinite(rms) or INPUT_RMS_LOW <= rms <= INPUT_RMS_HIGH:
        return None
    layers = [c.run.layer_names[i] for i in c.arch.input_layers]
    side = "large" if rms > INPUT_RMS_HIGH else "small"
    return Diagnosis(
        "input_scale",
        "High",
        layers,
        start_step(c.run),
        f"the data entering {layers[0]} has an RMS of about {rms:.3g} (normalised data: about 1), "
        f"read off its weight and bias gradients: the inputs are far too {side}",
        float(np.clip(abs(np.log10(rms)) / 3, 0, 1)),
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "normalise the inputs: subtract the training data's mean and divide by its std per feature or "
        "channel (e.g. torchvision's Normalize, or x = (x - mean) / std)"
    )


RULE = CauseRule(
    "input_scale",
    "unnormalised inputs",
    find,
    action,
    kind="observation",
    explains=("lr_too_high", "exploding", "nonfinite", "vanishing", "dead_units"),
)
