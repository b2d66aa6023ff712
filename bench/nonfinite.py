"""What NaN-origin tracing costs, and whether torch.autograd.detect_anomaly finds the same module.

1. Step time on the bench transformer (bench/overhead.py's ``make_model``), side by side in one
   run, interleaved step by step: recording without tracing (``trace_nonfinite=False``),
   recording with the default (``"auto"``: the origin by replaying the first non-finite step; the
   per-module tracer measured on alternate warm-up steps, printed with its decision), recording
   with the per-module tracer on every step (``True``), and recording without tracing under
   ``torch.autograd.detect_anomaly(check_nan=True)``. Target: the default <= 1.01x of recording
   without tracing.
2. The test cases of tests/test_nonfinite.py (tests/nonfinite_cases.py): the module, step and
   pass the tracer names, and the module detect_anomaly's error points at (the forward call its
   traceback names, innermost module first).

    python bench/nonfinite.py [--steps 40] [--skip-timing]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import nonfinite_cases
from overhead import make_model  # bench/ is on sys.path when run as a script

from gradwidget.collect.torch import Recorder


def timing(steps: int, batch: int, seq: int, clock=time.perf_counter) -> dict[str, list[float]]:
    """Per-step times (``clock``: wall or this process's CPU time) of three identical models (same weights, data and optimizer), each under its
    own Recorder, stepped in turn (A B C, C B A, ...) so that the load of a shared machine hits
    them alike; step i of each variant is paired with step i of the others."""
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 2000, (batch, seq + 1), generator=g) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    variants = {
        "recording, no tracing": ({"trace_nonfinite": False}, False),
        "recording, default (replay)": ({}, False),  # trace_nonfinite="auto"
        "recording + tracing (True)": ({"trace_nonfinite": True}, False),
        "recording + detect_anomaly": ({"trace_nonfinite": False}, True),
    }
    setups = {}
    for name, (kw, anomaly) in variants.items():
        model = make_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        setups[name] = (model, opt, Recorder(model, opt, histogram_every=0, **kw), anomaly)

    def step(name, i):
        model, opt, rec, anomaly = setups[name]
        b = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autograd.detect_anomaly(check_nan=True) if anomaly else _nothing():
            loss = loss_fn(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
            loss.backward()
        rec.log(loss=loss)
        opt.step()

    times: dict[str, list[float]] = {k: [] for k in variants}
    for i in range(steps + 3):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            t = clock()
            step(name, i)
            if i >= 3:  # the first steps set the recorders up and warm the caches: not timed
                times[name].append(clock() - t)
    auto = setups["recording, default (replay)"][2]
    assert auto._nonfinite.measured is not None, auto.tracing_text()  # "auto" measured the tracer
    print(f"  {auto.tracing_text()}")
    for _, _, rec, _ in setups.values():
        rec.detach()
    return times


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()

    if not args.skip_timing:
        print(
            f"bench transformer (4 x d256), batch {args.batch} x seq {args.seq}, torch threads "
            f"{torch.get_num_threads()}, {args.steps} steps each, interleaved step by step"
        )
        # CPU time of the process (all its threads) is less disturbed than wall time by other
        # processes on a shared machine; both are shown
        for clock_name, clock in (("wall", time.perf_counter), ("process CPU", time.process_time)):
            times = timing(args.steps, args.batch, args.seq, clock)
            base = times["recording, no tracing"]
            med = {k: statistics.median(v) for k, v in times.items()}
            paired = {k: statistics.median([a / b for a, b in zip(v, base)]) for k, v in times.items()}
            print(
                f"{clock_name + ' time':30s} {'median step':>12s} {'ratio of medians':>17s} "
                f"{'median paired ratio':>20s}"
            )
            for k in times:
                print(
                    f"  {k:28s} {med[k] * 1e3:10.1f}ms {med[k] / med['recording, no tracing']:16.3f}x "
                    f"{paired[k]:19.3f}x"
                )
            print(
                f"RATIO ({clock_name}) default/no tracing = {paired['recording, default (replay)']:.3f} "
                f"(median paired ratio; target <= 1.01); True/no tracing = "
                f"{paired['recording + tracing (True)']:.3f}"
            )
            print(f"RATIO ({clock_name}) detect_anomaly/no tracing = {paired['recording + detect_anomaly']:.2f}")

    print("\nwho names the origin (tests/nonfinite_cases.py, the default trace_nonfinite='auto'):")
    print(f"{'case':22s} {'expected':34s} {'gradwidget (default)':34s} {'detect_anomaly':36s}")
    agree = 0
    cases = nonfinite_cases.CASES
    for name, case in cases.items():
        want = case.expected
        got = nonfinite_cases.train(case)
        traced = (got.module, got.step, got.phase) if got is not None else None
        found = nonfinite_cases.anomaly_module(case)
        agree += found == want[0]
        print(f"{name:22s} {want!s:34s} {traced!s:34s} {found!s:36s}")
    print(f"RESULT detect_anomaly names the tracer's module in {agree} of {len(cases)} cases")


if __name__ == "__main__":
    main()
