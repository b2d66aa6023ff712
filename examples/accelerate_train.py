"""Record a Hugging Face ``accelerate`` loop with the plain Recorder: ``Accelerator.prepare``,
``accelerator.backward`` and gradient accumulation; ``--compile`` also compiles the model.

    python examples/accelerate_train.py --log-dir runs/accelerate --steps 20 [--compile]

Build the Recorder from what ``prepare`` returns: the prepared optimizer's inner torch optimizer
is hooked, so one step is one real update (accumulating micro-batches are not steps). Under DDP
(``accelerate launch``) rank 0 records, as the distributed Recorder does. A compiled model is
recorded without graph breaks, under its own layer names (no ``_orig_mod.``).
"""
from __future__ import annotations

import argparse
import gc

import torch
from accelerate import Accelerator
from torch import nn

from gradwidget import Recorder, summary


def train(steps: int = 20, log_dir=None, compile: bool = False, accumulation: int = 2) -> Recorder:
    """Train a small MLP for ``steps`` optimizer updates and return its (detached) Recorder."""
    torch.manual_seed(0)
    accelerator = Accelerator(gradient_accumulation_steps=accumulation, cpu=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    if compile:
        model = torch.compile(model)
    rec = Recorder(model, optimizer, log_dir=log_dir)
    for _ in range(steps * accumulation):
        x = torch.randn(32, 16)
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
            accelerator.backward(loss)
            rec.log(loss=loss)
            optimizer.step()
            optimizer.zero_grad()
    rec.detach()
    del model, optimizer
    gc.collect()  # free the DDP wrapper before the process group goes (gloo may abort otherwise)
    accelerator.end_training()  # destroys the process group under torchrun / accelerate launch
    return rec


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args(argv)
    rec = train(args.steps, args.log_dir, args.compile)
    if rec.run is not None:  # under DDP (torchrun / accelerate launch) rank 0 holds the run
        print(summary(rec.run))


if __name__ == "__main__":
    main()
