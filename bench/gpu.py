"""The Recorder on a CUDA device: its numbers, its NaN origin and its host syncs, checked there.

The test suite runs on CPU; this is the check of the GPU path, run where a GPU is lent:

    python bench/gpu.py [--device cuda]

1. **Exact numbers**: a Hugging Face GPT-2 (tiny config) and a ReLU MLP trained on the device, in
   float32, under float16 autocast with a ``GradScaler``, and with bfloat16 weights; each step's
   gradients as the optimizer sees them (after unscaling) are copied to the host in float64 and
   every recorded statistic is compared with the one computed there (and the update norms with
   the weights' change).
2. **Where the NaN started**: the cases of ``tests/nonfinite_cases.py`` (forward, backward, loss,
   bf16 autocast, GPT-2, checkpointing) trained on the device with ``trace_nonfinite=True`` and at
   the default ("auto"): the origin found against the one expected.
3. **Host syncs**: how many times one recorded step makes the host wait for the GPU (defaults,
   histogram steps, the noise probe under accumulation, a bare step for reference).
4. **The noise probe** (gradient accumulation, ``noise_scale=True``): each row's per-tensor squared
   norms against every micro-batch's gradient computed apart, for GPT-2, the MLP and 24 small
   layers (the stacked path), in the three styles above.

Prints a line per check and ``FAILED`` for any that does not hold; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import host_syncs, lm_training, make_model  # noqa: E402

from gradwidget.collect.torch import Recorder  # noqa: E402

FAILED: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("ok      " if ok else "FAILED  ") + what, flush=True)
    if not ok:
        FAILED.append(what)


STATS = ("grad_norm", "mean_abs", "max_abs", "std", "zero_frac", "weight_norm")


def reference_rows(model: nn.Module) -> dict[str, dict[str, float]]:
    """Every statistic of each parameter's gradient, from a float64 host copy, by name."""
    out = {}
    for n, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.detach().double().cpu().flatten()
        out[n] = {
            "grad_norm": g.norm().item(),
            "mean_abs": g.abs().mean().item(),
            "max_abs": g.abs().max().item(),
            "std": g.std(unbiased=False).item(),  # the population std, as recorded
            "zero_frac": (g == 0).double().mean().item(),
            "weight_norm": p.detach().double().cpu().norm().item(),
        }
    return out


def as_arrays(refs: list[dict], names: list[str]) -> dict[str, np.ndarray]:
    """``(steps, layers)`` arrays of each statistic, layers in the run's order."""
    return {k: np.array([[r[n][k] for n in names] for r in refs]) for k in STATS}


def gpt2(dev):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    return GPT2LMHeadModel(cfg).to(dev)


def mlp(dev):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)


def exact_numbers(dev: torch.device, make, style: str, steps: int = 6) -> None:
    """Train ``steps`` steps; compare each recorded row with the float64 reference."""
    model = make(dev)
    if style == "bfloat16 weights":
        model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type) if style == "float16 autocast + GradScaler" else None
    rec = Recorder(model, opt, histogram_every=1, trace_nonfinite=False)
    g = torch.Generator().manual_seed(0)
    refs, updates = [], []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        if make is gpt2:
            x = torch.randint(0, 128, (4, 24), generator=g).to(dev)
            with torch.autocast(dev.type, dtype=torch.float16, enabled=scaler is not None):
                loss = model(input_ids=x, labels=x).loss
        else:
            x = torch.randn(16, 32, generator=g).to(dev).to(next(model.parameters()).dtype)
            y = torch.randint(0, 10, (16,), generator=g).to(dev)
            with torch.autocast(dev.type, dtype=torch.float16, enabled=scaler is not None):
                loss = nn.functional.cross_entropy(model(x).float(), y)
        before = {n: p.detach().double().cpu().clone() for n, p in model.named_parameters()}
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # what the optimizer sees, and what the Recorder records
            refs.append(reference_rows(model))
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            refs.append(reference_rows(model))
            opt.step()
        rec.log(loss=loss)
        params = dict(model.named_parameters())
        updates.append({n: (p.detach().double().cpu() - before[n]).norm().item() for n, p in params.items()})
    rec.detach()
    run = rec.run
    names = run.layer_names
    ref = as_arrays(refs, names)
    label = f"{make.__name__} ({len(run.layer_names)} tensors), {style}"
    check(run.n_steps == steps, f"{label}: {run.n_steps} of {steps} steps recorded")
    # a step GradScaler skipped (Inf in float16) is recorded with its non-finite counts: compared
    # where the reference is finite
    finite = np.all([np.isfinite(v).all(axis=1) for v in ref.values()], axis=0)
    check(finite.sum() >= steps // 2, f"{label}: {int(finite.sum())} of {steps} steps with finite gradients")
    tol = {"zero_frac": 1e-6}  # a count over numel: exact; the rest float32 sums of float32 or narrower
    for k, want in ref.items():
        got = run.metric(k)[: len(refs)].astype(np.float64)[finite]
        want = want[finite]
        e = float(np.nanmax(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))
        check(e <= tol.get(k, 1e-4), f"{label}: {k} worst relative error {e:.1e}")
    upd = run.metric("update_norm")[: len(updates)].astype(np.float64)
    want = np.array([[u[n] for n in names] for u in updates])
    measured = np.isfinite(upd)
    err = np.abs(upd[measured] - want[measured]) / np.maximum(want[measured], 1e-30)
    worst = float(err.max()) if measured.any() else float("nan")
    check(measured.any() and worst <= 1e-3, f"{label}: update_norm on {int(measured.sum())} cells, worst {worst:.1e}")
    nonfinite = run.metric("nonfinite")[: len(refs)][finite]
    check(int(nonfinite.sum()) == 0, f"{label}: no non-finite count on finite gradients")
    sizes = np.array([params[n].numel() for n in names])
    nonzero = np.rint((1 - ref["zero_frac"]) * sizes[None, :]).astype(np.int64)
    counts = run.hist.sum(axis=-1)[: len(refs)].astype(np.int64)
    check(
        np.array_equal(counts[finite], nonzero[finite]),
        f"{label}: each histogram counts the layer's nonzero entries",
    )


def tiny_layers(dev):
    """Many small tensors of few shapes: the noise probe's stacked path (most without a hook)."""
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(24) for m in (nn.Linear(32, 32), nn.Tanh())], nn.Linear(32, 10)).to(dev)


def noise_numbers(dev: torch.device, make, style: str, steps: int = 3, micro: int = 3) -> None:
    """Gradient accumulation with the noise probe on: each row's per-tensor squared norms (the mean
    over micro-batches, and the accumulated gradient's) against each micro-batch's gradient computed
    apart (``torch.autograd.grad``, which the probe must not count as a micro-batch), in float64."""
    model = make(dev).train(False)  # no dropout: the gradients computed apart are the same ones
    if style == "bfloat16 weights":
        model = model.to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10) if "GradScaler" in style else None
    # every step measured (the default measures one in NOISE_EVERY): each step's row is checked
    rec = Recorder(model, opt, noise_scale=True, noise_every=1, batch_size=8, trace_nonfinite=False)
    params = [p for _, p in model.named_parameters()]
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(0)
    worst, rows, k_ok = 0.0, 0, True
    for _ in range(steps):
        batches = []
        for _ in range(micro):
            if make is gpt2:
                batches.append((torch.randint(0, 128, (8, 24), generator=g).to(dev),))
            else:
                x = torch.randn(8, 32, generator=g).to(dev).to(next(model.parameters()).dtype)
                batches.append((x, torch.randint(0, 10, (8,), generator=g).to(dev)))

        def loss_of(b):
            with torch.autocast(dev.type, dtype=torch.float16, enabled=scaler is not None):
                loss = (
                    model(input_ids=b[0], labels=b[0]).loss
                    if make is gpt2
                    else (nn.functional.cross_entropy(model(b[0]).float(), b[1]))
                )
            loss = loss / micro
            return scaler.scale(loss) if scaler is not None else loss  # the row is in scaled units

        per = [[gr.double() for gr in torch.autograd.grad(loss_of(b), params)] for b in batches]
        opt.zero_grad(set_to_none=True)
        for b in batches:
            loss_of(b).backward()
        # the accumulated gradient as the backwards left it (with bfloat16 weights, summed in
        # bfloat16: its rounding is the optimizer's gradient, not an error of the probe)
        acc = [p.grad.double() for p in params]
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        kept = rec.run.noise.rows if rec.run.noise is not None else ()
        if len(kept) <= rows:  # no new row for this step: a stale one would be checked against it
            continue
        row = kept[-1]
        rows += 1
        k_ok &= int(row["n_small"]) == micro
        col = {n: c for c, n in enumerate(rec.run.layer_names)}
        for j, n in enumerate(names):
            want_small = float(np.mean([float(gs[j].pow(2).sum()) for gs in per]))
            want_big = float(acc[j].pow(2).sum()) / micro**2
            for got, want in ((row["small_sq"][col[n]], want_small), (row["big_sq"][col[n]], want_big)):
                if np.isfinite(want) and want > 0:
                    worst = max(worst, abs(float(got) / want - 1))
    rec.detach()
    label = f"noise probe, {make.__name__} ({len(params)} tensors), {style}, {micro} micro-batches"
    check(rows == steps and k_ok, f"{label}: {rows} of {steps} rows, each of {micro} micro-batches")
    # float32 norms of float32 gradients. With bfloat16 weights the gradient is accumulated in
    # bfloat16: a stacked small tensor's increment is the difference of two such sums, each rounded
    # to bfloat16 (the optimizer's own rounding): each element off by up to eps/2 of the sum, the
    # squared norm by up to about eps times the sum's norm over the increment's (<= micro + 1)
    bound = max(1e-4, (micro + 1) * torch.finfo(params[0].dtype).eps)
    check(worst <= bound, f"{label}: worst relative error of the squared norms {worst:.1e} (bound {bound:.0e})")


def nan_origin(dev: torch.device) -> None:
    """The non-finite cases on the device: the origin named, with tracing on and by default."""
    import nonfinite_cases as nc

    for name, case in nc.CASES.items():
        for kw in ({"trace_nonfinite": True}, {}):
            o = nc.train(case, device=dev, **kw)
            run = nc.train.last.run
            got = (o.module, o.step, o.phase) if o is not None else None
            how = "trace_nonfinite=True" if kw else "defaults"
            # a case can stay finite on another device (its kernels round and accumulate
            # otherwise): then no origin is the right answer
            went = bool(run.metric("nonfinite").sum() > 0 or not np.isfinite(run.scalar("loss")).all())
            want = case.expected if went else None
            check(got == want, f"NaN origin, {name}, {how}: {got} (expected {want}; the run went non-finite: {went})")


def syncs_per_step(dev: torch.device) -> None:
    model = gpt2(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 128, (4, 24)).to(dev)

    def step(rec=None):
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if rec is not None:
            rec.log(loss=loss)
        opt.step()

    for _ in range(3):
        step()
    bare = host_syncs(step)
    rec = Recorder(model, opt, histogram_every=10)
    for _ in range(12):  # past "auto"'s warm-up; the next step is step 12: no histogram
        step(rec)
    plain = host_syncs(lambda: step(rec))
    for _ in range(7):
        step(rec)
    hist = host_syncs(lambda: step(rec))  # step 20: a histogram step
    rec.detach()
    print(f"host syncs per step: bare {bare}, recorded {plain}, recorded with a histogram {hist}", flush=True)
    check(plain - bare <= 1, f"a recorded step adds at most one host sync ({plain - bare})")

    def accumulating(rec=None):  # two half batches a step: the noise probe at work
        opt.zero_grad(set_to_none=True)
        for half in x.chunk(2):
            (model(input_ids=half, labels=half).loss / 2).backward()
        opt.step()

    bare2 = host_syncs(accumulating)
    rec = Recorder(model, opt, noise_scale=True, noise_every=1, histogram_every=0)  # the probe on each step
    for _ in range(12):
        accumulating(rec)
    noisy = host_syncs(lambda: accumulating(rec))
    kept = rec.run.noise is not None and len(rec.run.noise) >= 13  # the step counted measured too
    rec.detach()
    print(f"host syncs per accumulating step: bare {bare2}, recorded with the noise probe {noisy}", flush=True)
    check(kept and noisy - bare2 <= 1, f"the noise probe adds no host sync ({noisy - bare2} with the step's copy)")


def profile(dev: torch.device) -> None:
    """Where a recorded step's extra time goes on the device: the ops the Recorder adds (CPU time
    and calls per step, from torch.profiler, bare step subtracted) and the Python stack of every host
    sync one recorded step makes."""
    import traceback
    import warnings

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = (make_model(d=768, layers=12, vocab=16000) if cuda else make_model(d=64, layers=2, vocab=16000)).to(dev)
    opt, step = lm_training(model, 16000, 8, 256, n_batches=4, device=dev)
    n = 10

    def ops(rec) -> dict:
        for i in range(3):
            step(i, rec)
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=activities) as prof:
            for i in range(n):
                step(i, rec)
            sync()

        def device_us(e) -> float:  # torch renamed self_cuda_time_total to self_device_time_total
            return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))

        return {
            e.key: (e.count / n, e.self_cpu_time_total / n / 1e3, device_us(e) / n / 1e3) for e in prof.key_averages()
        }

    bare = ops(None)
    rec = Recorder(model, opt, trace_nonfinite=False)
    for i in range(12):
        step(i, rec)
    recorded = ops(rec)
    none = (0.0, 0.0, 0.0)
    extra = {k: tuple(a - b for a, b in zip(v, bare.get(k, none))) for k, v in recorded.items()}
    print("ops the Recorder adds per step (calls, self CPU ms, self device ms), largest CPU first:")
    for k, (c, t, d) in sorted(extra.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {k[:60]:60s} {c:8.1f} {t:8.3f} {d:8.3f}")
    if cuda:
        print("  largest device time first:")
        for k, (c, t, d) in sorted(extra.items(), key=lambda kv: -kv[1][2])[:15]:
            print(f"  {k[:60]:60s} {c:8.1f} {t:8.3f} {d:8.3f}")
    total = sum(v[1] for v in extra.values())
    # the kernels and copies alone: not the ops that launch them, nor a user range around them (the
    # optimizer's step is profiled as "Optimizer.step#AdamW.step", its whole device time inside)
    ranges = ("aten::", "autograd", "cuda", "torch::", "Optimizer.", "ProfilerStep", "Activity Buffer")
    device = sum(v[2] for k, v in extra.items() if not k.startswith(ranges))
    launches = sum(v[0] for k, v in extra.items() if k.startswith("cudaLaunchKernel"))
    print(
        f"  total extra self CPU {total:.2f} ms per step; extra kernel time {device:.2f} ms (kernels "
        f"and copies, not the ops that launch them); extra kernel launches {launches:.0f}"
    )
    if not cuda:
        return
    torch.cuda.synchronize()
    stacks = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            stacks.append("".join(traceback.format_stack(limit=12)[:-2]))

    old = warnings.showwarning
    warnings.showwarning = show
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # switching the mode on can itself warn once: not the step's
        torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            step(20, rec)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    warnings.showwarning = old
    rec.detach()
    print(f"host syncs in one recorded step: {len(stacks)}")
    for s in stacks:
        print("---\n" + s)


def kernel_times(dev: torch.device) -> None:
    """Where a recorded step's device time goes: each statistic over the large model's gradients
    (bench/overhead.py's 12 x d768, 147 tensors, 110 M entries), alone, and the alternatives tried;
    milliseconds from a synchronized start to a synchronized end (median of 20), and the host's
    share (the time to queue the work, which a step hides while the GPU is behind)."""
    import statistics
    import time

    from gradwidget.collect._kernels import (
        biased_exponents,
        count_nonzero_abs,
        exponent_counts,
        grad_rows,
        histc_count,
        norms,
        scatter_count,
    )
    from gradwidget.collect import _fused
    from gradwidget.collect._stats import StepStatistics

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    d, layers = (768, 12) if dev.type == "cuda" else (64, 2)  # on CPU a dry run
    model = make_model(d=d, layers=layers, vocab=16000).to(dev)
    opt, step = lm_training(model, 16000, 8, 256, n_batches=4, device=dev)
    for i in range(3):
        step(i)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    stats = StepStatistics(params)
    eager = StepStatistics(params)

    def eager_collect(with_hist):  # the statistics as they were taken before the fused kernel
        _fused.ENABLED = False
        try:
            return eager.collect(with_hist)
        finally:
            _fused.ENABLED = True

    fused = _fused.takes(grads[0].device, grads[0].dtype)
    if fused:  # the fused rows against the eager ones
        fused_rows, _ = _fused.rows(grads + params)
        want = grad_rows(grads)
        n = len(grads)
        # the sum relative to the L1 norm, the scale of its rounding (a sum that cancels to ~0 has none)
        scale = torch.cat([want[:4].abs(), want[1:2]]).clamp_min(1e-30)
        err = ((fused_rows[:, :n] - want).abs() / scale).amax(1).tolist()
        w_norms = norms([p.detach() for p in params])
        w_err = float(((fused_rows[0, n:] - w_norms).abs() / w_norms).max())
        print(
            "fused / eager gradient rows, worst relative difference (L2, L1, max, count; sum / L1):",
            [f"{e:.1e}" for e in err],
            f"weight norms {w_err:.1e}",
        )
    else:
        print(f"no fused kernel here (Triton: {_fused._triton() is not None}, broken: {_fused.broken})")

    cases = {
        "bare step (forward, backward, AdamW)": lambda: step(0),
        "optimizer.step() alone": lambda: opt.step(),
        "L2 norms (_foreach_norm)": lambda: norms(grads, 2),
        "L1 norms (_foreach_norm)": lambda: norms(grads, 1),
        "max |g| (_foreach_norm, inf)": lambda: norms(grads, math.inf),
        "non-zero counts (_foreach_norm, 0)": lambda: norms(grads, 0),
        "non-zero counts (count_nonzero of |g| per tensor)": lambda: [count_nonzero_abs(g.abs()) for g in grads],
        "non-zero counts (count_nonzero of g per tensor)": lambda: [torch.count_nonzero(g) for g in grads],
        "sums (per tensor)": lambda: [g.sum(dtype=torch.float32) for g in grads],
        "the five gradient rows (grad_rows, foreach)": lambda: grad_rows(grads, True),
        "weight norms (_foreach_norm)": lambda: norms(params),
        "exponent counts (scatter_add_)": lambda: [scatter_count(biased_exponents(g), 256) for g in grads],
        "exponent counts (histc)": lambda: [histc_count(biased_exponents(g), 256) for g in grads],
        "exponent counts (as recorded)": lambda: exponent_counts(grads),
        "a step's statistics, no histogram (with the copy)": lambda: stats.collect(False),
        "a step's statistics, with histogram (with the copy)": lambda: stats.collect(True),
        "a step's statistics, eager kernels, no histogram": lambda: eager_collect(False),
        "a step's statistics, eager kernels, with histogram": lambda: eager_collect(True),
        "a 1-element device-to-host copy (the sync)": lambda: grads[0][0, 0].item(),
    }
    if fused:
        t = time.perf_counter()
        _fused.rows(grads + params, n_hist=len(grads))
        sync()
        print(f"the fused kernel's first launch (compiles it, with exponent counts): {time.perf_counter() - t:.2f} s")

        cases["fused rows of gradients and weights (one launch)"] = lambda: _fused.rows(grads + params)
        cases["fused rows, with exponent counts"] = lambda: _fused.rows(grads + params, n_hist=len(grads))
    print(f"{'what':54s} {'ms':>8s} {'host ms':>8s}")
    for what, fn in cases.items():
        for _ in range(3):
            fn()
        sync()
        walls, hosts = [], []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            h = time.perf_counter()
            sync()
            walls.append(time.perf_counter() - t)
            hosts.append(h - t)
        print(f"{what:54s} {statistics.median(walls) * 1e3:8.3f} {statistics.median(hosts) * 1e3:8.3f}", flush=True)


def launch_shapes(dev: torch.device) -> None:
    """The fused kernel's launch shape (collect/_fused.py: entries a program reads per iteration,
    its warps, the programs a tensor is split over), timed on synthetic tensors the sizes of the
    large model's 147 gradients and 147 weights: milliseconds (median of 25, synchronized), the
    bandwidth it reaches, and its rows against the first shape's."""
    import statistics
    import time

    from gradwidget.collect import _fused

    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    shapes = [(16000, 768)] + [(768, 768)] * 48 + [(3072, 768), (768, 3072)] * 12 + [(768,)] * 74
    if dev.type != "cuda":  # a dry run: the same code on a few small tensors (Triton's interpreter)
        shapes = [(40, 30), (7,), (3000,)]
    grads = [torch.randn(s, device=dev) for s in shapes]
    tensors = grads + [torch.randn(s, device=dev) for s in shapes]
    entries = sum(t.numel() for t in tensors)
    first, _ = _fused.rows(tensors)

    def median_ms(n_hist: int) -> float:
        for _ in range(3):
            _fused.rows(tensors, n_hist=n_hist)
        sync()
        times = []
        for _ in range(25):
            t = time.perf_counter()
            _fused.rows(tensors, n_hist=n_hist)
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    print(f"{len(tensors)} tensors, {entries / 1e6:.1f} M entries")
    shipped = (_fused.BLOCK, _fused.NUM_WARPS, _fused.MAX_SPLIT)
    for block, warps, split in [
        shipped,
        (1024, 8, 128),
        (2048, 4, 128),
        (2048, 8, 128),
        (4096, 8, 128),
        (2048, 8, 512),
    ]:
        _fused.BLOCK, _fused.NUM_WARPS, _fused.MAX_SPLIT = block, warps, split
        try:
            plain, counted = median_ms(0), median_ms(len(grads))
            rows, _ = _fused.rows(tensors)
            err = float(((rows - first).abs() / first.abs().clamp_min(1e-30))[:4].max())
            print(
                f"BLOCK {block:5d}, {warps:2d} warps, split <= {split:4d}: {plain:.3f} ms ({entries * 4 / plain / 1e9:.2f} TB/s), "
                f"with exponent counts {counted:.3f} ms; rows against the first {err:.1e}",
                flush=True,
            )
        except Exception as e:
            print(f"BLOCK {block}, {warps} warps, split <= {split}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            _fused.broken = None
    _fused.BLOCK, _fused.NUM_WARPS, _fused.MAX_SPLIT = shipped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--profile", action="store_true", help="only: where a recorded step's time goes")
    ap.add_argument("--kernels", action="store_true", help="only: each statistic's device time, alone")
    ap.add_argument("--launch-shapes", action="store_true", help="only: the fused kernel's launch shapes, timed")
    args = ap.parse_args()
    if args.launch_shapes:
        launch_shapes(torch.device(args.device))
        return
    if args.kernels:
        kernel_times(torch.device(args.device))
        return
    if args.profile:
        profile(torch.device(args.device))
        return
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/gpu.py checks the CUDA path: no CUDA device here (--device cpu: a dry run of the checks)")
    on = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (a dry run: the checks are for CUDA)"
    print(f"torch {torch.__version__} on {on}", flush=True)
    for make in (gpt2, mlp):
        for style in ("float32", "float16 autocast + GradScaler", "bfloat16 weights"):
            exact_numbers(dev, make, style)
    for make in (gpt2, mlp, tiny_layers):
        for style in ("float32", "float16 autocast + GradScaler", "bfloat16 weights"):
            noise_numbers(dev, make, style)
    nan_origin(dev)
    if dev.type == "cuda":
        syncs_per_step(dev)
    print(f"{len(FAILED)} checks failed" if FAILED else "all checks held", flush=True)
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
