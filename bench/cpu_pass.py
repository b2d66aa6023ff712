"""CPU's statistics in one compiled pass (``collect/_cpu_fused.py``) against PyTorch's eager CPU
kernels (``_kernels.grad_rows`` and ``norms``), over model sizes and torch's thread counts.

The eager kernels spread each of their six passes over every torch thread; the library shares its
one pass among them by tensors, largest first (``_cpu_fused._shares``: shares of at least
``SHARE_ENTRIES``). This measures both over thread counts: one step's statistics of a model's gradients and
weights (every tensor above the stacking size), caches flushed before each (a backward leaves the
gradients cold), median of ``--repeats``.

    python bench/cpu_pass.py [--threads 1 2 4 16] [--models transformer wide large] [--repeats 20]

``--stacking``: where a shape group of small tensors is cheaper stacked (``_groups``) than read by
the library one by one (``_fused.LIBRARY_STACK_MEMBERS`` and ``LIBRARY_STACK_NUMEL``): one
Recorder statistics collect (gradients and weights) of k same-shape small tensors beside four
large ones, both ways, on one thread, median of ``--repeats``, without and with exponent counts.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gradwidget.collect import _cpu_fused, _fused
from gradwidget.collect._groups import STACK_NUMEL
from gradwidget.collect._kernels import grad_rows, norms
from gradwidget.collect._stats import StepStatistics

#: the bench transformers (bench/overhead.py's ``make_model``): (d, layers, vocab)
MODELS = {"transformer": (256, 4, 2000), "wide": (512, 8, 16000), "large": (768, 12, 16000)}


def tensors(which: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gradients (random, the parameters' shapes) and weights of the named model's tensors that
    the library reads (those above the stacking size)."""
    from overhead import make_model

    d, layers, vocab = MODELS[which]
    params = [p.detach() for p in make_model(d=d, layers=layers, vocab=vocab).parameters() if p.numel() > STACK_NUMEL]
    return [torch.randn_like(p) for p in params], params


def median_ms(fn, repeats: int) -> float:
    flush = torch.empty(256 << 20, dtype=torch.uint8)  # larger than any last-level cache
    times = []
    for _ in range(repeats):
        flush.add_(1)
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def planned(params: list[torch.Tensor], stack: bool) -> StepStatistics:
    """A Recorder's statistics of ``params``, planned with their small tensors stacked by shape
    (``stack``) or read by the library."""
    from unittest import mock

    members, numel = (2, STACK_NUMEL) if stack else (1 << 62, 0)
    with mock.patch.multiple(_fused, LIBRARY_STACK_MEMBERS=members, LIBRARY_STACK_NUMEL=numel):
        stats = StepStatistics(params, foreach_all=False)
        for hist in (False, True):  # planned here, under the patch
            stats.collect(hist)
    return stats


def stacking(repeats: int) -> None:
    torch.set_num_threads(1)
    print("entries a tensor | tensors of that shape | stacked ms (with counts) | library ms (with counts)")
    for shape in ((4,), (32,), (128,), (256,), (512,), (1024,)):
        for k in (2, 8, 32, 128, 256, 512, 2000):
            params = [torch.nn.Parameter(torch.randn(shape)) for _ in range(k)]
            params += [torch.nn.Parameter(torch.randn(256, 256)) for _ in range(4)]
            for p in params:
                p.grad = torch.randn_like(p)
            ways = {"stacked": planned(params, True), "library": planned(params, False)}
            times: dict = {(w, h): [] for w in ways for h in (False, True)}
            for _ in range(repeats):  # interleaved: a busy machine hits both alike
                for (w, hist), ts in times.items():
                    t = time.perf_counter()
                    ways[w].collect(hist)
                    ts.append(time.perf_counter() - t)
            ms = {key: statistics.median(ts) * 1e3 for key, ts in times.items()}
            print(
                f"{shape[0]} | {k} | {ms['stacked', False]:.3f} ({ms['stacked', True]:.3f}) | "
                f"{ms['library', False]:.3f} ({ms['library', True]:.3f})",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["transformer", "wide"])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--stacking", action="store_true")
    args = ap.parse_args()
    if not _cpu_fused.takes(torch.float32):
        raise SystemExit(f"no CPU statistics library here: {_cpu_fused.broken}")
    if args.stacking:
        stacking(args.repeats)
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads by default")
    print(
        "model | entries | torch threads | one compiled pass ms (shared by the threads) | eager kernels ms | eager / pass"
    )
    for which in args.models:
        grads, weights = tensors(which)
        entries = sum(t.numel() for t in grads + weights)
        both = grads + weights
        for n in args.threads:
            torch.set_num_threads(n)
            fused = median_ms(lambda: _cpu_fused.rows(both, n_full=len(grads)), args.repeats)
            eager = median_ms(lambda: (grad_rows(grads, foreach_all=False), norms(weights)), args.repeats)
            print(
                f"{which} | {entries / 1e6:.1f} M | {n} | {fused:.2f} | {eager:.2f} | {eager / fused:.2f}", flush=True
            )


if __name__ == "__main__":
    main()
