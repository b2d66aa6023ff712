"""``half_weights``: trainable weights in float16 (``model.half()``), so the optimizer's state is
float16 too, with no loss scaling (``torch.amp.GradScaler`` refuses float16 parameters): an update
under 2**-11 of a weight rounds away, Adam's eps (1e-8) is 0 in float16 and its second moment
underflows (0/0: NaN), gradients under 6e-8 flush to zero. Read from the recorded parameter dtypes:
an observation. The NaN, the stalled loss and the too small or too large steps that follow are its
symptoms."""

from __future__ import annotations

from ._base import CauseRule, Context, Diagnosis
from ._shared import start_step, tensors


def find(c: Context) -> Diagnosis | None:
    run = c.run
    idx = [i for i, info in enumerate(run.layers) if info.dtype == "float16" and info.status == "trainable"]
    if not idx or run.n_steps == 0:
        return None
    opt = run.meta.get("optimizer") if isinstance(run.meta, dict) else None
    return Diagnosis(
        "half_weights",
        "High",
        [run.layer_names[i] for i in idx],
        start_step(run),
        f"{tensors(run, idx, 'trainable ')} are float16, so "
        + (f"{opt}'s" if isinstance(opt, str) else "the optimizer's")
        + " state is float16 too, with no loss scaling: updates under 2**-11 of a weight round away, "
        "Adam's eps (1e-8) is 0 in float16, gradients under 6e-8 flush to zero",
        1.0,
    )


def action(d: Diagnosis, c: Context) -> str:
    return (
        "keep the weights in float32 (remove model.half()) and run the forward under "
        "torch.autocast(device_type, dtype=torch.float16) with a torch.amp.GradScaler, or under bfloat16 "
        "autocast, which needs no scaler"
    )


RULE = CauseRule(
    "half_weights",
    "float16 weights and optimizer state without loss scaling",
    find,
    action,
    kind="observation",
    explains=("nonfinite", "lr_too_low", "lr_too_high", "plateau", "exploding", "vanishing", "dead_units"),
    whole_run=True,
)
