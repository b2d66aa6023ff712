"""Training-step overhead of recording under 2-process DDP (or FSDP2, or tensor parallelism) on CPU, side by side.

Two gloo processes train a small transformer language model. Variants run in interleaved blocks
(bare, stats every step, + histograms every 10, + writing the run directory) so drift in machine
load hits all of them alike; rank 0 reports the median step time and its ratio to bare. Under DDP
rank 0 does the recording work while rank 1 does none, so rank 0's extra work shows up as the
other rank waiting at the next all-reduce: the step time of both. ``--tp``: every encoder layer's
feed-forward split column-wise then row-wise across the ranks (``parallelize_module``), the rest
plain; every rank trains on the same batch, as tensor parallelism needs.

    python bench/distributed.py [--blocks 6] [--steps 10] [--fsdp | --tp] [--nproc 2]

(it starts its processes itself; under torchrun it acts as one of them).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    from overhead import lm_training, make_model  # the single-process benchmark's transformer LM and step

    from gradwidget.collect.torch import Recorder

    torch.set_num_threads(1)
    # the LM's head returns a view; FSDP2 warns about in-place ops on it, which this loop never does
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model = make_model(d=128, layers=2, vocab=1000)
        if args.fsdp:
            from torch.distributed.fsdp import fully_shard

            for layer in model.encoder.layers:
                fully_shard(layer)
            fully_shard(model)
        elif args.tp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            plan: dict = {}
            for i in range(len(model.encoder.layers)):
                plan[f"encoder.layers.{i}.linear1"] = ColwiseParallel()
                plan[f"encoder.layers.{i}.linear2"] = RowwiseParallel()
            parallelize_module(model, init_device_mesh("cpu", (world,)), plan)
        else:
            model = nn.parallel.DistributedDataParallel(model)
        opt, step = lm_training(model, 1000, args.batch, args.seq, seed=0 if args.tp else rank)
        sharded = args.fsdp or args.tp  # every rank computes partial sums

        tmp = tempfile.mkdtemp(prefix="gw-bench-")
        variants = {
            "bare": lambda: None,
            "stats every step": lambda: Recorder(model, opt, histogram_every=0),
            "+ histograms every 10": lambda: Recorder(model, opt, histogram_every=10),
            "+ histograms + log_dir": lambda: Recorder(
                model, opt, histogram_every=10, log_dir=os.path.join(tmp, "run"), overwrite=True
            ),
        }
        times = {k: [] for k in variants}
        for i in range(3):  # warm-up
            step(i)
        for blk in range(args.blocks):
            order = list(variants) if blk % 2 == 0 else list(reversed(variants))
            for name in order:
                rec = variants[name]()
                step(0, rec)  # the first step under a new recorder sets it up: not timed
                for i in range(args.steps):
                    dist.barrier()  # start every timed step together
                    t = time.perf_counter()
                    step(i + 1, rec)
                    times[name].append(time.perf_counter() - t)
                if rec is not None:
                    rec.detach()
        # rank 0's recording work alone, on the same gradients (DDP: a rank-local cost, the others
        # wait for it at the next all-reduce; FSDP, tensor parallel: includes the reduces, run on every rank)
        step(0)
        work = {}
        for name in ("stats every step", "+ histograms every 10"):
            rec = Recorder(model, opt, histogram_every=1 if name.startswith("+") else 0, update_every=10)
            step(1, rec)
            ts = []
            for _ in range(args.blocks * args.steps):
                dist.barrier()
                t = time.perf_counter()
                if rec.run is not None or sharded:
                    rec._on_step(before_update=True)
                    rec._post_step(opt, (), {})
                ts.append(time.perf_counter() - t)
            rec.detach()
            work[name] = statistics.median(ts)
        # the replica check's own work per checked step on each rank: the fingerprint, then
        # a rank other than 0 posts it to the store and rank 0 reads the previous step's posts and compares
        rec = Recorder(model, opt, histogram_every=0)
        step(1, rec)
        check = rec._replicas
        assert check is not None  # under torch.distributed with an optimizer
        ts = []
        for _ in range(args.blocks * args.steps):
            dist.barrier()  # every rank posts step n before rank 0 reads it at n + 1, as DDP's lockstep does
            t = time.perf_counter()
            check.step_hook(opt, (), {})
            ts.append(time.perf_counter() - t)
        per_rank: list = [None] * world
        dist.all_gather_object(per_rank, (statistics.median(ts), check.bytes_sent / check.n, int(check.active)))
        compared = check.record.data["layers_compared"] if check.record is not None else 0
        rec.detach()
        if rank == 0:
            n_params = sum(p.numel() for p in model.parameters())  # a DTensor reports its global numel
            n_tensors = sum(1 for _ in model.parameters())
            med = {k: statistics.median(v) for k, v in times.items()}
            kind = "FSDP2 fully_shard" if args.fsdp else "tensor parallel (feed-forwards)" if args.tp else "DDP"
            print(
                f"{kind}, {world} processes (gloo, 1 thread each); transformer 2 x d128, {n_tensors} "
                f"parameter tensors, ~{n_params / 1e6:.2f} M parameters; batch {args.batch}/rank x seq {args.seq}"
            )
            print(f"{'variant':26s} {'median step':>12s} {'vs bare':>8s}  (n={args.blocks * args.steps} steps each)")
            for k, v in med.items():
                print(f"{k:26s} {v * 1e3:10.1f}ms {v / med['bare']:8.3f}x")
            if sharded:
                from gradwidget.collect.distributed import bytes_per_step

                print(
                    f"two reduces per recorded step: {bytes_per_step(n_tensors, False)} B per rank, "
                    f"{bytes_per_step(n_tensors, True)} B on histogram steps"
                )
            blk_ratio = {
                k: statistics.median(
                    statistics.median(times[k][b * args.steps : (b + 1) * args.steps])
                    / statistics.median(times["bare"][b * args.steps : (b + 1) * args.steps])
                    for b in range(args.blocks)
                )
                for k in times
            }
            print(
                "median over blocks of (variant / bare in the same block): "
                + ", ".join(f"{k} {v:.3f}x" for k, v in blk_ratio.items() if k != "bare")
            )
            u = "update norms every 10 steps"
            print(
                f"recording work on rank 0 per step, same gradients: stats {work['stats every step'] * 1e3:.2f} ms; "
                f"with a histogram {work['+ histograms every 10'] * 1e3:.2f} ms ({u})"
            )
            hist10 = work["stats every step"] + (work["+ histograms every 10"] - work["stats every step"]) / 10
            print(
                f"RATIO recording work / bare step = {work['stats every step'] / med['bare']:.3f} (stats), "
                f"{hist10 / med['bare']:.3f} (stats + histograms every 10, amortised)"
            )
            print(
                f"replica check per checked step ({compared} layers compared): "
                + ", ".join(f"rank {r} {t * 1e3:.2f} ms, {b:.0f} B posted" for r, (t, b, _) in enumerate(per_rank))
                + f"; rank 0 reads {sum(b for _, b, _ in per_rank):.0f} B"
            )
            print(
                f"RATIO replica check / bare step = {max(t for t, _, _ in per_rank) / med['bare']:.4f} (slowest rank)"
            )
            print(f"RATIO stats every step / bare = {med['stats every step'] / med['bare']:.3f}")
            print(
                f"RATIO stats + histograms every 10 + log_dir / bare = "
                f"{med['+ histograms + log_dir'] / med['bare']:.3f}"
            )
    finally:
        model = opt = step = rec = None  # free the process group's users first (examples/distributed_train.py)
        gc.collect()
        dist.destroy_process_group()


def launch(argv: list[str], nproc: int = 2) -> int:
    """Start ``nproc`` worker processes with the rendezvous environment torchrun would give them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nproc):
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen([sys.executable, __file__, *argv], env=env))
    try:
        return max(p.wait() for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per block")
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--seq", type=int, default=32)
    setup = ap.add_mutually_exclusive_group()
    setup.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    setup.add_argument("--tp", action="store_true", help="tensor parallelism (parallelize_module) instead of DDP")
    ap.add_argument("--nproc", type=int, default=2, help="gloo processes to start (2, 4, 8: how cost grows)")
    args = ap.parse_args()
    if "RANK" in os.environ:
        worker(args)
    else:
        sys.exit(launch(sys.argv[1:], args.nproc))


if __name__ == "__main__":
    main()
