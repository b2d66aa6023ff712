"""What the panel's background analysis costs per refresh: ``panel.table.analyse`` (the health
table and the diagnoses the panel shows) on a snapshot of the bench transformer's run
(``overhead.make_model``, 4 x d256, AdamW), median of interleaved repeats in one process.

    python bench/refresh.py [--steps 200] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))

from overhead import lm_training, make_model  # noqa: E402 (needs the sys.path above)

from gradwidget.collect.torch import Recorder  # noqa: E402
from gradwidget.panel import payload  # noqa: E402
from gradwidget.panel.table import analyse  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    vocab = 2000
    model = make_model(vocab=vocab)
    opt, step = lm_training(model, vocab, batch=4, seq=32)
    rec = Recorder(model, opt)
    for i in range(a.steps):
        step(i, rec)
    snap = payload.snapshot(rec.run)
    analyse(snap)  # warm imports
    times = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        analyse(snap)
        times.append(time.perf_counter() - t0)
    print(
        f"panel background analysis per refresh: bench transformer ({snap.n_layers} tensors x {snap.n_steps} steps): "
        f"median {1e3 * statistics.median(times):.1f} ms (min {1e3 * min(times):.1f}, {a.repeats} repeats; shared machine)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
