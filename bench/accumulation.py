"""Accuracy and cost of accumulating gradient statistics in float32 (or wider) whatever the
gradient dtype, side by side with reducing in the gradient's own dtype (where a float16 sum
overflows at 65504).

For float16, bfloat16 and float32 gradients of a transformer-like set of tensors (with one layer of
large entries, as a loss-scaled or diverging layer has), it reports the worst relative error of the
L2 norm, mean |g| and std against a float64 reference, how many statistics came out non-finite,
and the median time of the statistics kernel (``grad_rows``) both ways, interleaved so machine
load hits both alike.

    python bench/accumulation.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np
import torch

from gradwidget.collect._kernels import grad_rows


def native_rows(grads: list[torch.Tensor]) -> torch.Tensor:
    """The kernel as it was: every reduction in the gradients' own dtype (CPU path)."""
    l2 = torch.stack(torch._foreach_norm(grads, 2))
    l1 = torch.stack([g.abs().sum() for g in grads])
    lo, hi = (torch.stack(x) for x in zip(*[torch.aminmax(g) for g in grads]))
    linf = torch.maximum(-lo, hi)
    nnz = torch.stack([torch.count_nonzero(g) for g in grads])
    sums = torch.stack([g.sum() for g in grads])
    return torch.stack([r.to(torch.float64) for r in (l2, l1, linf, nnz, sums)])


def tensors(dtype, seed=0) -> list[torch.Tensor]:
    """Sizes of a small transformer's parameters (d=512): matrices, vectors, an embedding, and one
    layer whose entries are ~300 (finite in float16; its sums are not)."""
    g = torch.Generator().manual_seed(seed)
    sizes = [512 * 512] * 8 + [512 * 2048] * 4 + [512] * 16 + [32000 * 512 // 8]
    out = [torch.randn(n, generator=g, dtype=torch.float64) * 10.0 ** -(k % 4 + 2) for k, n in enumerate(sizes)]
    out.append(300 + 30 * torch.randn(200_000, generator=g, dtype=torch.float64))
    return [t.to(dtype) for t in out]


def stats(rows: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    l2, l1, _, _, s = rows
    mean = s / n
    with np.errstate(invalid="ignore", over="ignore"):
        var = np.maximum(l2 * l2 / n - mean * mean, 0.0)
    return {"norm": l2, "mean_abs": l1 / n, "std": np.sqrt(var)}


def reference(grads) -> dict[str, np.ndarray]:
    a = [g.double().numpy() for g in grads]
    return {
        "norm": np.array([np.sqrt((x * x).sum()) for x in a]),
        "mean_abs": np.array([np.abs(x).mean() for x in a]),
        "std": np.array([x.std() for x in a]),
    }


def timed(fn, grads) -> float:
    t0 = time.perf_counter()
    fn(grads).numpy()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"{'dtype':9} {'kernel':8} {'non-finite':>10} {'norm err':>9} {'mean err':>9} {'std err':>9} "
        f"{'median ms':>9} {'ratio':>6}"
    )
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        grads = tensors(dtype)
        n = np.array([g.numel() for g in grads], np.float64)
        ref = reference(grads)
        times: dict[str, list[float]] = {"native": [], "float32": []}
        kernels = {"native": native_rows, "float32": grad_rows}
        for _ in range(args.repeats):  # interleaved
            for name, fn in kernels.items():
                times[name].append(timed(fn, grads))
        base = statistics.median(times["native"])
        for name, fn in kernels.items():
            got = stats(fn(grads).numpy(), n)
            bad = sum(int((~np.isfinite(v)).sum()) for v in got.values())
            errs = []
            for k in ("norm", "mean_abs", "std"):
                finite = np.isfinite(got[k])
                e = np.abs(got[k][finite] - ref[k][finite]) / np.maximum(ref[k][finite], 1e-30)
                errs.append(float(e.max()) if e.size else math.nan)
            med = statistics.median(times[name])
            print(
                f"{str(dtype)[6:]:9} {name:8} {bad:10d} {errs[0]:9.1e} {errs[1]:9.1e} {errs[2]:9.1e} "
                f"{1e3 * med:9.2f} {med / base:6.2f}"
            )


if __name__ == "__main__":
    main()
