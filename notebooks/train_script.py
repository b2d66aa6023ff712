"""A plain training script that records its gradients to a run directory.

``from_script.ipynb`` starts it in a subprocess and opens the run directory in a live panel while
it trains; run it yourself with ``python train_script.py --log-dir runs/script``.
"""
import argparse
import time

import torch
from torch import nn

from gradwidget import Recorder
from gradwidget.demo import build_demo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--log-dir", default="runs/script", help="run directory to write")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--delay", type=float, default=0.02, help="seconds to pause per step (to watch it live)")
    args = p.parse_args()

    torch.set_num_threads(1)
    model, optimizer, batches = build_demo()
    loss_fn = nn.MSELoss()
    with Recorder(model, optimizer, log_dir=args.log_dir, overwrite=True) as rec:
        for step in range(args.steps):
            x, y = next(batches)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            optimizer.step()
            if args.delay:
                time.sleep(args.delay)
    print(f"trained {args.steps} steps; run in {args.log_dir}")


if __name__ == "__main__":
    main()
