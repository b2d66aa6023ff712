"""What many tensors cost: for 100 / 1,000 / 10,000 parameter tensors, in one table,
the recording ratio to a bare training step with the defaults (``trace_nonfinite="auto"``: NaN-origin
tracing, turned off after its cost is measured where it costs more than it is worth), with tracing
forced on (``True``) and without it (``False``) (a stack of tiny Linear layers, the worst case:
Python and launch overhead per tensor and per module call), ``analyze`` time, the HTML report's time, and peak memory of each;
then the live panel: ``GradientPanel(run)``'s build time (its first update; a run of more than
``SYNC_ANALYSIS_CELLS`` cells gets its table from the analysis thread after), one full update's
payload build time and size (heatmap, bars, histograms, meta), and the health table's size.

    python bench/scale.py [--tensors 100 1000 10000] [--steps 40] [--record-steps 20] [--record-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gradwidget.analysis import analyze  # noqa: E402
from gradwidget.report import write_report  # noqa: E402
from gradwidget.run import METRICS, LayerInfo, Run  # noqa: E402


def synthetic_run(n_tensors: int, n_steps: int, seed: int = 0) -> Run:
    """A run of ``n_tensors`` small tensors in modules of 2 (weight, bias), filled directly."""
    rng = np.random.default_rng(seed)
    layers = [
        LayerInfo(
            f"blocks.{i // 8}.lin{(i // 2) % 4}.{'weight' if i % 2 == 0 else 'bias'}",
            module=f"blocks.{i // 8}.lin{(i // 2) % 4}",
            module_type="Linear",
            shape=(2, 2) if i % 2 == 0 else (2,),
            numel=4 if i % 2 == 0 else 2,
            backward_index=n_tensors - 1 - i,
        )
        for i in range(n_tensors)
    ]
    run = Run(layers, edges=[(i, i + 2) for i in range(0, n_tensors - 2, 2)])
    level = 0.1 * np.exp(0.3 * rng.standard_normal((n_steps, n_tensors)))
    for s in range(n_steps):
        v = np.empty((len(METRICS), n_tensors), np.float32)
        g = level[s]
        v[METRICS.index("grad_norm")] = g
        v[METRICS.index("mean_abs")] = g / 2
        v[METRICS.index("max_abs")] = g
        v[METRICS.index("std")] = g / 2
        v[METRICS.index("zero_frac")] = 0
        v[METRICS.index("nonfinite")] = 0
        v[METRICS.index("weight_norm")] = 1
        v[METRICS.index("update_norm")] = 1e-3
        run.append(s, v, {"loss": 2.0 * (1 - s / (2 * n_steps))})
    return run


def timed(fn):
    """(result, seconds, peak MiB): timed on its own, then run again under tracemalloc for its peak
    (tracing slows every allocation, so the two are never measured in the same call)."""
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, dt, peak / 2**20


def recording_ratio(
    n_tensors: int, steps: int, trace: bool | str = "auto", warm: int = 10
) -> tuple[float, float, float]:
    """Median step time bare and with the Recorder (interleaved blocks) on n_tensors/2 x Linear(2,2);
    ``trace``: the Recorder's ``trace_nonfinite`` ("auto", the default: the origin by replay, the
    per-module tracer measured on alternate warm-up steps; True: hooks on every module call; False).
    Each block's new Recorder first runs ``warm`` steps untimed (its set-up, and "auto"'s measuring of
    the tracer: bench/overhead.py --compare times those first steps on their own), as bare blocks do."""
    import torch
    from torch import nn

    from gradwidget.collect.torch import Recorder

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(n_tensors // 2)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(8, 2)

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    bare, rec_t = [], []
    for block in range(4):
        for variant in ("bare", "rec"):
            r = Recorder(model, opt, histogram_every=0, trace_nonfinite=trace) if variant == "rec" else None
            for _ in range(max(1, warm)):
                step()
            ts = []
            for _ in range(steps):
                t = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t)
            (bare if variant == "bare" else rec_t).extend(ts)
            if r is not None:
                r.detach()
    b, r = statistics.median(bare), statistics.median(rec_t)
    return b * 1e3, r * 1e3, r / b


def panel_costs(run: Run) -> tuple[float, float, float, float, float, int]:
    """(GradientPanel(run) seconds to its first update, seconds until its health table is sent too
    (the analysis: at once, or on its thread for big runs), one full update's payload build ms
    (best of 3) and KiB (binary buffers and JSON), the table's KiB, the rows drawn)."""
    from gradwidget import GradientPanel
    from gradwidget.panel.protocol import TRAITS, encode

    t = time.perf_counter()
    panel = GradientPanel(run)
    build = time.perf_counter() - t
    try:
        panel._analysis.wait(timeout=600)
        with_table = time.perf_counter() - t
        times = []
        for _ in range(3):
            t = time.perf_counter()
            values = panel._payload(run, run.version)
            blobs = [encode(k, v) for k, v in values.items() if TRAITS[k].kind == "bytes"]
            text = json.dumps({k: v for k, v in values.items() if TRAITS[k].kind != "bytes"})
            times.append((time.perf_counter() - t) * 1e3)
        size = (sum(map(len, blobs)) + len(text)) / 1024
        return build, with_table, min(times), size, len(json.dumps(panel.table)) / 1024, panel.meta["rows"]
    finally:
        panel.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--steps", type=int, default=40, help="recorded steps of the synthetic runs analysed")
    ap.add_argument("--record-steps", type=int, default=20, help="timed steps per block of the recording ratio")
    ap.add_argument("--record-only", action="store_true", help="only the recording ratios (no analysis, report, panel)")
    ap.add_argument("--warm", type=int, default=10, help="untimed steps under each block's new Recorder first")
    a = ap.parse_args(argv)
    print(
        f"{'tensors':>8} {'bare ms':>8} {'rec ms':>8} {'ratio':>6} {'traced':>6} {'no-trace':>8} {'analyze s':>9} {'MiB':>6} "
        f"{'report s':>8} {'MiB':>6} {'panel s':>7} {'+table s':>8} {'payload ms':>10} {'KiB':>6} {'table KiB':>9} "
        f"{'rows':>5}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.tensors:
            b, r, ratio = recording_ratio(n, a.record_steps, warm=a.warm)
            traced = recording_ratio(n, a.record_steps, trace=True, warm=a.warm)[2]
            plain = recording_ratio(n, a.record_steps, trace=False, warm=a.warm)[2]
            if a.record_only:
                print(f"{n:>8} {b:>8.2f} {r:>8.2f} {ratio:>6.2f} {traced:>6.2f} {plain:>8.2f}", flush=True)
                continue
            run = synthetic_run(n, a.steps)
            rep, t_an, m_an = timed(lambda: analyze(run))
            _, t_rep, m_rep = timed(lambda: write_report(rep, os.path.join(tmp, f"r{n}.html")))
            t_panel, t_table, t_pay, kib, table_kib, rows = panel_costs(run)
            print(
                f"{n:>8} {b:>8.2f} {r:>8.2f} {ratio:>6.2f} {traced:>6.2f} {plain:>8.2f} {t_an:>9.2f} {m_an:>6.0f} {t_rep:>8.2f} {m_rep:>6.0f} "
                f"{t_panel:>7.2f} {t_table:>8.2f} {t_pay:>10.1f} {kib:>6.0f} {table_kib:>9.0f} {rows:>5}",
                flush=True,
            )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"process peak RSS {rss:.0f} MiB (MiB columns: tracemalloc peak of that call beyond what was held)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
