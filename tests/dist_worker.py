"""One process of a distributed recording test (started by tests/test_distributed.py).

    python tests/dist_worker.py MODE LOG_DIR OUT_DIR [--steps N] [--delay S]

MODE is ``single`` (no process group), ``ddp``, ``fsdp2``, ``fsdp1``, ``fsdp1-flat`` (``use_orig_params=False``), ``hsdp`` (FSDP2 on a 2 x 1 replicate x shard
mesh), ``tp`` (tensor parallel: ``parallelize_module`` with a column-wise then a row-wise linear layer,
the other layers plain, every rank training on the whole batch), ``2d`` (FSDP2 and tensor parallelism on
a 2 x W/2 mesh, the even MLP) or ``plain`` (an unwrapped
model in a process group, every rank training on the whole batch). With a process group the
rank, world size and rendezvous come from the usual environment variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as torchrun sets them. Every mode trains the same model on the same
global batches; rank r of W takes rows r::W... of each batch, so the averaged gradient equals the
single-process full-batch gradient. Each rank writes OUT_DIR/rank{r}.json describing what it did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton_interpreter  # noqa: E402  (beside this script: the fused kernel under Triton's interpreter)

from gradwidget.collect import _fused, _kernels  # noqa: E402
from gradwidget.collect.nonfinite import NonfiniteTracer  # noqa: E402
from gradwidget.collect.torch import Recorder  # noqa: E402

GLOBAL_BATCH = 16


class Transformer(nn.Module):
    """One encoder layer (multi-head attention whose out_proj is used without calling it) and a
    head; the input is a (batch, 10) row read as 5 tokens of 2 features."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(2, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.layer(self.embed(x.reshape(len(x), 5, 2))).mean(dim=1))


class Block(nn.Module):
    """A pre-norm feed-forward block and a head, as Megatron splits it with sequence parallelism:
    the input (batch, 10) is read as 2 tokens of 5 features, each rank normalising its own token."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(5)
        self.up = nn.Linear(5, 8)
        self.down = nn.Linear(8, 5)
        self.head = nn.Linear(5, 1)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(self.norm(x.reshape(len(x), -1, 5))))).mean(dim=1))


def make_model(kind: str = "mlp") -> nn.Module:
    torch.manual_seed(0)
    if kind == "transformer":
        return Transformer()
    if kind == "block":
        return Block()
    # odd widths: FSDP shards dim 0 unevenly, and some ranks hold empty shards (the 1-row head);
    # "even": a hidden width tensor parallelism splits in equal halves (it needs them)
    hidden = 8 if kind == "even" else 7
    return nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Linear(hidden, 5), nn.Tanh(), nn.Linear(5, 1))


def batches(steps: int):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, 10, generator=g)
        yield x, x[:, :1] * 2 - x[:, 1:2]


def _whole(t: torch.Tensor) -> torch.Tensor:
    """The logical tensor: a DTensor gathered from every rank, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def parallelize(model: nn.Module, kind: str, mesh) -> None:
    """Tensor parallelism over the ranks of the 1-D ``mesh``: the Megatron pair (a column-wise linear layer
    feeding a row-wise one) in the MLP or the encoder layer's feed-forward; the block adds sequence
    parallelism (its LayerNorm on each rank's token, whose gradients are per-rank parts of a sum)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    plan: dict = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if kind == "transformer":
        plan = {"layer.linear1": ColwiseParallel(), "layer.linear2": RowwiseParallel()}
    elif kind == "block":
        plan = {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Replicate()),
        }
    parallelize_module(model, mesh, plan)


def share(x, y, mode: str, pattern: str, kind: str, rank: int, world: int):
    """Rank ``rank``'s part of a global batch: its own rows (data parallel), or every row (tensor
    parallel, and a plain model's replicas unless each takes its own data). 2d: the rows of its
    data-parallel coordinate. Sequence parallelism (the block): every row, this rank's token."""
    if mode == "2d":
        return x[rank // (world // 2) :: 2], y[rank // (world // 2) :: 2]
    if mode == "tp" and kind == "block":
        return x.reshape(len(x), world, -1)[:, rank], y
    if mode == "tp" or (mode == "plain" and pattern != "own-data"):
        return x, y
    return x[rank::world], y[rank::world]


def train(
    mode: str,
    log_dir: str | None,
    steps: int,
    delay: float,
    histogram_every: int,
    update_every: int,
    no_optimizer: bool = False,
    model_kind: str = "mlp",
    nan_rank: int = -1,
    pattern: str = "",
    odd_rank: int = -1,
) -> dict:
    rank, world = 0, 1
    if mode != "single":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(model_kind)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        solo = dist.new_group([0]) if pattern == "ddp-one-rank" else None  # every rank makes the group
        if pattern == "ignored":  # DDP leaves the head's bias out of its sync: each rank keeps its own
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["4.bias"])
        if pattern != "ddp-one-rank":
            model = DistributedDataParallel(model)
        elif rank == 0:  # DDP on rank 0 only, over a group of itself: no rank syncs with another
            model = DistributedDataParallel(model, process_group=solo)
        if pattern == "to-dtype":  # pytorch#104336's move and back, on CPU: new gradient accumulators
            model.to(torch.float64)
            model.to(torch.float32)
    elif mode in ("fsdp2", "hsdp"):
        from torch.distributed.fsdp import fully_shard

        kw = {}
        if mode == "hsdp":  # replicate across the 2 ranks, shard within each (1-rank) group
            from torch.distributed.device_mesh import init_device_mesh

            kw["mesh"] = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
        for m in (model.layer,) if model_kind == "transformer" else model:
            if isinstance(m, (nn.Linear, nn.TransformerEncoderLayer)):
                fully_shard(m, **kw)
        fully_shard(model, **kw)
    elif mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        parallelize(model, model_kind, init_device_mesh("cpu", (world,)))
    elif mode == "2d":  # FSDP2 along the first dimension of a 2 x (world / 2) mesh, tensor parallelism along the second
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize(model, model_kind, mesh["tp"])
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif mode in ("fsdp1", "fsdp1-flat"):
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, use_orig_params=mode == "fsdp1", device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    odd = odd_rank % world  # the rank a "load" run loads its checkpoint on (-1: the last)
    inner = model.module if hasattr(model, "module") else model
    start = {k: v.clone() for k, v in inner.state_dict().items()}  # a checkpoint of step 0
    # the accelerator's path (the fused kernel) on CPU, where the test asks for it
    _kernels._CPU_AS_ACCELERATOR = os.environ.get("GW_FOREACH_ALL") == "1"
    rec = Recorder(
        model,
        None if no_optimizer else opt,
        log_dir=log_dir,
        histogram_every=histogram_every,
        update_every=update_every,
        noise_every=1,  # every step's noise row, to compare with the single process step by step
    )
    full_norms = []  # per step, each gradient's norm over the whole (logical) tensor
    for i, (x, y) in enumerate(batches(steps)):
        xb, yb = share(x, y, mode, pattern, model_kind, rank, world)
        if rank == nan_rank and i == 2:  # this rank's data holds a NaN at step 2
            xb = xb.clone()
            xb[0, 0] = float("nan")
        opt.zero_grad()
        unsynced = pattern == "no-sync" and i == (2 if rank == world - 1 else 3)
        with model.no_sync() if unsynced else contextlib.nullcontext():  # the last rank skips step 2's sync
            loss = ((model(xb) - yb) ** 2).mean()  # (and the others step 3's, so no all-reduce waits)
            rec.log(loss=loss)
            loss.backward()
        if pattern == "load" and rank == odd and i == 2:  # a checkpoint loaded on one rank only
            inner.load_state_dict(start)
        if pattern == "clip" and rank == world - 1 and i >= 2:  # one rank clips after the sync
            # (tensor parallel: the head, a plain parameter every rank holds whole)
            clipped = model.parameters() if mode != "tp" else list(model.children())[-1].parameters()
            torch.nn.utils.clip_grad_norm_(clipped, 0.05)
        if mode in ("tp", "2d"):  # full_tensor(): a collective every rank enters
            full_norms.append({n: float(_whole(p.grad).norm()) for n, p in model.named_parameters()})
        if no_optimizer:  # a hand-written update: each backward is a step
            with torch.no_grad():
                for p in model.parameters():
                    p.sub_(0.05 * p.grad)
        else:
            opt.step()
        if rank == 0:
            print(f"step {i}", flush=True)
        if delay:
            time.sleep(delay)
    info = {
        "rank": rank,
        "world": world,
        "has_run": rec.run is not None,
        "has_writer": rec._writer is not None,
        "grad_hooks": sum(len(p._post_accumulate_grad_hooks or {}) for p in rec.model.parameters()),
        "tracer_hooks": sum(
            isinstance(getattr(getattr(getattr(h, "fn", h), "func", None), "__self__", None), NonfiniteTracer)
            for m in rec.model.modules()
            for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
        ),
        "origin": rec.run.meta.get("nonfinite_origin") if rec.run is not None else None,
        "optimizer_hooks": len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks),
        "kind": rec._dist.kind if rec._dist is not None else None,
        "collectives": rec._dist.collectives if rec._dist is not None else 0,
        "bytes_sent": rec._dist.bytes_sent if rec._dist is not None else 0,
        "replica_bytes": rec._replicas.bytes_sent if rec._replicas is not None else 0,
        "full_grad_norms": full_norms,
        # whether the fused statistics kernel was taken (loaded where it was asked for), and worked
        "fused_kernel": "gradwidget.collect._fused_kernel" in sys.modules and _fused.broken is None,
    }
    rec.detach()
    return info


def main() -> None:
    triton_interpreter.mend()
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["single", "ddp", "fsdp2", "fsdp1", "fsdp1-flat", "plain", "hsdp", "tp", "2d"])
    ap.add_argument("log_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--histogram-every", type=int, default=1)
    ap.add_argument("--update-every", type=int, default=1)
    ap.add_argument("--no-optimizer", action="store_true")
    ap.add_argument("--model", choices=["mlp", "even", "transformer", "block"], default="mlp")
    ap.add_argument("--nan-rank", type=int, default=-1, help="this rank's data holds a NaN at step 2")
    ap.add_argument(
        "--pattern",
        choices=["", "to-dtype", "no-sync", "clip", "ddp-one-rank", "own-data", "ignored", "load"],
        default="",
        help="a way replicas fall out of sync (own-data: plain, clip: ddp or tp, the others: ddp)",
    )
    ap.add_argument(
        "--odd-rank", type=int, default=-1, help="the rank a 'load' run loads step 0's weights on at step 2"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    info = train(
        args.mode,
        args.log_dir,
        args.steps,
        args.delay,
        args.histogram_every,
        args.update_every,
        args.no_optimizer,
        args.model,
        args.nan_rank,
        args.pattern,
        args.odd_rank,
    )
    if args.mode != "single":
        import gc

        import torch.distributed as dist

        gc.collect()  # the model held the process group; see examples/distributed_train.py
        dist.barrier()
        dist.destroy_process_group()
    Path(args.out_dir, f"rank{info['rank']}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main()
