"""Record gradients of a 2-process data-parallel (DDP) or fully sharded (FSDP2) training run.

Launch on CPU with gloo (no GPU needed):

    torchrun --nproc_per_node=2 examples/distributed_train.py --log-dir runs/ddp
    torchrun --nproc_per_node=2 examples/distributed_train.py --log-dir runs/fsdp --fsdp

Every rank builds the same ``Recorder(model, optimizer, log_dir=...)``; gradwidget detects the
process group. Under DDP rank 0 records the averaged gradients and the other ranks do nothing;
under FSDP every rank contributes partial sums of its shards (two reduces per recorded step) and
rank 0 records the statistics of the unsharded model. Only rank 0 writes the run directory.

While it trains, follow the run from a notebook:

    from gradwidget import GradientPanel
    GradientPanel.from_run("runs/ddp", live=True)

and afterwards: ``gradwidget report runs/ddp -o report.html``.
"""
from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from gradwidget import Recorder


def build_model() -> nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights
    return nn.Sequential(
        nn.Linear(16, 64), nn.GELU(),
        nn.Linear(64, 64), nn.GELU(),
        nn.Linear(64, 32), nn.GELU(),
        nn.Linear(32, 1),
    )


def global_batches(steps: int, batch: int):
    """The same stream of synthetic regression batches on every rank."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(16, 1, generator=g)
    for _ in range(steps):
        x = torch.randn(batch, 16, generator=g)
        yield x, torch.sin(x @ w) + 0.1 * torch.randn(batch, 1, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-dir", default="runs/distributed", help="run directory (written by rank 0)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64, help="global batch, split across ranks")
    ap.add_argument("--fsdp", action="store_true", help="shard with FSDP2 fully_shard instead of DDP")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds to pause per step (to watch it live)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    try:
        train(args)
        # FSDP2 modules keep references to the process group. Free them before destroying it:
        # left to interpreter exit, a gloo process group is sometimes destructed with its worker
        # threads still joinable, and the process aborts ("terminate called without an active
        # exception"; seen in about 1 run in 8 with torch 2.13 on CPU, never after this collect).
        gc.collect()
    finally:
        dist.destroy_process_group()


def train(args: argparse.Namespace) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss_fn = nn.MSELoss()
    with Recorder(model, optimizer, log_dir=args.log_dir, overwrite=True) as rec:
        for x, y in global_batches(args.steps, args.batch):
            xb, yb = x[rank::world], y[rank::world]  # this rank's share of the global batch
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            rec.log(loss=loss)  # rank 0's loss on its share is what gets recorded
            optimizer.step()
            if args.delay:
                time.sleep(args.delay)
    if rank == 0:
        print(f"{'FSDP2' if args.fsdp else 'DDP'} on {world} processes: recorded "
              f"{rec.run.n_steps} steps of {rec.run.n_layers} layers in {os.path.abspath(args.log_dir)}")


if __name__ == "__main__":
    main()
