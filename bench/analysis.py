"""Analysis speed: ``analyze`` on 500 layers x 100,000 recorded steps, against a straight per-layer
Python-loop port of the original crate's analyses, side by side.

The port of the original crate (``crate_loop``) walks each layer's gradient-norm history in Python, as the Rust crate
did (statistics, flow characteristics, health, temporal direction, regions). It is far too slow for
the full run, so it is timed on a slice of the same run (all layers, ``--crate-steps`` steps) and the
vectorised engine is timed on the same slice too; the full-size time of the loop is extrapolated
linearly in steps (its cost is linear per layer) and printed as such.

    python bench/analysis.py [--layers 500] [--steps 100000] [--crate-steps 5000]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gradwidget.analysis import analyze  # noqa: E402
from gradwidget.run import METRICS, LayerInfo, Run  # noqa: E402


def synthetic_run(n_layers: int, n_steps: int, seed: int = 0) -> Run:
    """A run filled directly (no per-step append): log-normal gradient norms whose level falls with
    depth, a vanishing block, a dead block, an exploding tail in one layer, an update every 10 steps."""
    rng = np.random.default_rng(seed)
    layers = [
        LayerInfo(
            f"block{i // 10}.layer{i % 10}.weight",
            module=f"block{i // 10}.layer{i % 10}",
            module_type="Linear",
            shape=(64, 64),
            numel=4096,
        )
        for i in range(n_layers)
    ]
    run = Run(layers, edges=[(i, i + 1) for i in range(n_layers - 1)])
    m = np.empty((n_steps, len(METRICS), n_layers), np.float32)
    level = np.logspace(-4, -1, n_layers, dtype=np.float32)
    level[10:20] = 1e-9
    noise = rng.standard_normal((n_steps, n_layers), dtype=np.float32)
    g = level * np.exp(0.2 * noise)
    g[-n_steps // 20 :, -1] *= 1e6
    m[:, 0] = g
    m[:, 1] = g / 64
    m[:, 2] = g / 8
    m[:, 3] = g / 64
    m[:, 4] = 0
    m[:, 4, 30:35] = 1
    m[:, 5] = 0
    m[:, 6] = 10
    m[:, 7] = np.nan
    m[::10, 7] = 1e-3
    run._metrics = m
    run._nonfinite = m[:, 5].astype(np.float64)  # the exact non-finite counts (Run._NF)
    run._steps = np.arange(n_steps, dtype=np.int64)
    sc = np.full((n_steps, 3), np.nan)
    sc[:, 0] = 1 / np.sqrt(1 + np.arange(n_steps)) + 0.01 * rng.random(n_steps)
    sc[:, 2] = np.sqrt((g.astype(np.float64) ** 2).sum(1))
    run._scalars = sc
    run._n = run._cap = n_steps
    return run


# --------------------------------------------------------------------------- the original crate, as a loop
def _crate_layer(h: list[float], window: int = 100) -> dict:
    n = len(h)
    mean = sum(h) / n
    var = sum((x - mean) ** 2 for x in h) / n
    std = math.sqrt(var)
    srt = sorted(h)
    med = (srt[n // 2 - 1] + srt[n // 2]) / 2 if n % 2 == 0 else srt[n // 2]
    p5, p95 = srt[int(n * 0.05)], srt[min(int(n * 0.95), n - 1)]
    skew = sum(((x - mean) / std) ** 3 for x in h) / n if std > 0 else 0.0
    kurt = sum(((x - mean) / std) ** 4 for x in h) / n - 3 if std > 0 else 0.0
    var_ = [abs(h[i + 1] - h[i]) / (h[i] + 1e-8) for i in range(n - 1)]
    consistency = 1 / (1 + sum(var_) / len(var_))
    d2 = [abs(h[i + 2] - 2 * h[i + 1] + h[i]) for i in range(n - 2)]
    smooth = 1 / (1 + sum(d2) / len(d2))
    diffs = [h[i + 1] - h[i] for i in range(n - 1)]
    osc = sum(1 for i in range(len(diffs) - 1) if diffs[i] * diffs[i + 1] < 0) / n
    stab = 1 / (1 + std / mean) if mean else 0.0
    flow_rate = sum(abs(d) for d in diffs) / n
    bottleneck = 1 - min(min(h) / mean, 1) if mean else 1.0
    rec = h[-window:][::-1]
    xs = range(len(rec))
    sx, sy = sum(xs), sum(rec)
    sxy, sxx = sum(i * y for i, y in zip(xs, rec)), sum(i * i for i in xs)
    slope = (len(rec) * sxy - sx * sy) / (len(rec) * sxx - sx * sx)
    risk = (mean < 1e-5) + (mean > 100) + (stab < 0.5) + (osc > 0.5)
    dead = sum(1 for x in h if x < 1e-8) / n
    return dict(
        mean=mean,
        std=std,
        median=med,
        p5=p5,
        p95=p95,
        skew=skew,
        kurt=kurt,
        consistency=consistency,
        smooth=smooth,
        osc=osc,
        stab=stab,
        flow=flow_rate,
        bottleneck=bottleneck,
        slope=slope,
        health="Critical" if risk > 2 else "Warning" if risk else "Healthy",
        vanishing=mean < 1e-5,
        exploding=max(h) > 100,
        dead=dead > 0.5,
    )


def crate_loop(run: Run) -> dict:
    g = run.metric("grad_norm")
    return {name: _crate_layer([float(v) for v in g[:, j]]) for j, name in enumerate(run.layer_names)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=500)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--crate-steps", type=int, default=5000)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    run = synthetic_run(a.layers, a.steps)
    print(
        f"built a run of {a.layers} layers x {a.steps} steps ({run.nbytes() / 2**20:.0f} MiB) "
        f"in {time.perf_counter() - t0:.1f} s"
    )
    analyze(synthetic_run(8, 500))  # warm imports
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        rep = analyze(run)
        times.append(time.perf_counter() - t0)
    dt = min(times)
    tracemalloc.start()  # a separate call: tracing allocations slows numpy down
    analyze(run)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"analyze: {dt:.2f} s (best of 3: {', '.join(f'{x:.2f}' for x in times)}), peak memory beyond the run "
        f"{peak / 2**20:.0f} MiB (tracemalloc), overall {rep.overall_health}"
    )
    print("  " + rep.summary_text().splitlines()[0])

    small = run.slice(steps=slice(0, a.crate_steps))
    t0 = time.perf_counter()
    analyze(small)
    dv = time.perf_counter() - t0
    t0 = time.perf_counter()
    crate_loop(small)
    dl = time.perf_counter() - t0
    est = dl * a.steps / a.crate_steps
    print(f"\nside by side on {a.layers} layers x {a.crate_steps} steps:")
    print(f"  {'vectorised analyze':<28}{dv:8.3f} s")
    print(f"  {'crate port (Python loops)':<28}{dl:8.3f} s   ratio {dl / dv:.1f}x")
    print(
        f"full size ({a.steps} steps): analyze {dt:.2f} s vs crate port ~{est:.0f} s (extrapolated, linear in steps)"
        f"   ratio ~{est / dt:.0f}x"
    )
    print(
        "(the crate port covers only the grad-norm analyses; analyze also does every metric, the network, "
        "regions, groups and advice)"
    )
    return 0 if dt < 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
