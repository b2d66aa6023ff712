"""Training-step overhead of recording, measured side by side in one run.

A small transformer (4 layers, d=256) is trained on CPU. Each variant runs in interleaved blocks
(bare, ours stats-only, ours + histograms every 10 steps, naive per-parameter recorder) so drift in
machine load hits all of them alike; we report the median step time and its ratio to bare.

The naive recorder does what wandb.watch-style loggers do: per parameter ``.norm().item()`` (one
host sync each) and ``torch.histc`` per tensor.

    python bench/overhead.py [--blocks 6] [--steps 10] [--trainer] [--compiled] [--large [--device cuda]]

``--paired llama tiny transformer``: the recording's cost resolved on a shared machine (many short
interleaved blocks, ratios in CPU and wall-clock time with bootstrap 95% intervals: ``paired.py``),
at the defaults and for the noise scale under gradient accumulation (and that step recorded without
the noise probe: the probe's own share, apart from the recording's); ``tiny``: 2,000 x Linear(2, 2).
Each ratio is taken over a group of rounds that spans a whole period of what the recorders do one
step in N (histograms, update norms, the noise scale), so that work is in every ratio.

``--trainer``: a Hugging Face ``Trainer`` step (tiny GPT-2, gradient accumulation 2, clipping on)
with and without ``GradwidgetCallback``, interleaved. ``--compiled``: the transformer above under
``torch.compile``, with and without a Recorder, with dynamo's graph and graph-break counts.
``--large``: a ~100M-parameter transformer (12 x d768) on ``--device`` (``cuda`` on a GPU machine),
bare against the Recorder (histograms off, NaN tracing as by default and off, histograms every 10),
with the host syncs of one recorded step counted by ``torch.cuda.set_sync_debug_mode`` (CUDA only).

``--fused-cpu``: on the Llama-style model on a CPU, the Recorder's optimizer-step hooks in the
process's CPU time with its statistics taken by PyTorch's eager kernels, and by one fused pass per
gradient (and per weight) that ``torch.compile`` generates, in interleaved blocks of steps in one
process; and what compiling cost at the first recorded step.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time
import warnings

import torch
from torch import nn

from gradwidget.collect import _fused
from gradwidget.collect.torch import Recorder


def make_model(d=256, layers=4, vocab=2000, seed=0):
    torch.manual_seed(seed)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.encoder = nn.TransformerEncoder(
                nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True),
                layers,
                enable_nested_tensor=False,
            )
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            return self.head(self.encoder(self.embed(x)))

    return LM()


def lm_training(model, vocab: int, batch: int, seq: int, seed: int = 0, n_batches: int = 8, device=None):
    """``(optimizer, step)`` for next-token training of ``model``: AdamW and ``step(i, rec=None)``,
    one step on fixed batch ``i % n_batches``, logging the loss to ``rec`` when it has ``log``
    (the naive recorder does not). Shared by every benchmark that times an LM step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)
    data = [torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device) for _ in range(n_batches)]
    loss_fn = nn.CrossEntropyLoss()

    def step(i, rec=None):
        b = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
        loss.backward()
        if rec is not None and hasattr(rec, "log"):
            rec.log(loss=loss)
        opt.step()

    return opt, step


class NaiveRecorder:
    """Per-parameter statistics with a host sync each, and torch.histc per tensor."""

    def __init__(self, model, optimizer, histogram_every=10):
        self.model, self.n, self.every = model, 0, histogram_every
        self.rows = []
        self.h = optimizer.register_step_pre_hook(self._step)

    def _step(self, *_):
        row = {}
        for name, p in self.model.named_parameters():
            g = p.grad
            if g is None:
                continue
            row[name] = (
                g.norm().item(),
                g.abs().mean().item(),
                g.abs().max().item(),
                g.std().item(),
                (g == 0).float().mean().item(),
                p.norm().item(),
            )
            if self.n % self.every == 0:
                torch.histc(torch.log10(g.abs() + 1e-30), bins=64, min=-12, max=4).cpu()
        self.rows.append(row)
        self.n += 1

    def detach(self):
        self.h.remove()


def hf_trainer_ratio(blocks: int, steps: int) -> float:
    """Median Trainer step (first micro-batch to step end) with / without the callback."""
    import transformers
    from transformers import TrainerCallback

    from gradwidget.integrations.transformers import GradwidgetCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self._t = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t)

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=128, vocab_size=2000, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 2000, (64, 64), generator=g)]
    times: dict[str, list[float]] = {"Trainer bare": [], "Trainer + GradwidgetCallback": []}
    for blk in range(blocks):
        order = list(times) if blk % 2 == 0 else list(reversed(times))
        for name in order:
            timer = StepTimer()
            cbs = [timer] + ([GradwidgetCallback(histogram_every=10)] if "Gradwidget" in name else [])
            args = transformers.TrainingArguments(
                output_dir="/tmp/gw_bench_trainer",
                max_steps=steps + 1,
                per_device_train_batch_size=8,
                gradient_accumulation_steps=2,
                logging_steps=10**6,
                max_grad_norm=1.0,
                report_to=[],
                save_strategy="no",
                use_cpu=True,
                disable_tqdm=True,
                learning_rate=1e-4,
            )
            transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=cbs).train()
            times[name] += timer.times[1:]  # the first step sets the recorder up: not timed
    n = sum(p.numel() for p in model.parameters())
    ratio = _print_pair(
        f"HF Trainer: GPT-2 4 x d128 ({n / 1e6:.1f} M parameters), batch 8 x seq 64, accumulation 2, clipping at 1.0",
        times,
    )
    print(f"RATIO HF Trainer step with/without GradwidgetCallback = {ratio:.3f}")
    return ratio


def _print_pair(title: str, times: dict[str, list[float]]) -> float:
    """Print the median step of each variant against the first; return the second's ratio."""
    med = {k: statistics.median(v) for k, v in times.items()}
    base, other = list(med)
    print(f"{title} (n={len(times[base])} steps each)")
    for k, v in med.items():
        print(f"  {k:32s} {v * 1e3:10.1f}ms {v / med[base]:8.3f}x")
    return med[other] / med[base]


def compiled_ratio(blocks: int, steps: int, batch: int, seq: int, backend: str) -> float:
    """Median step of two identical compiled transformers, one recorded (the Recorder built before
    the first forward, so its hooks are in what dynamo traces), interleaved; dynamo's counters."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 2000, (batch, seq + 1), generator=g) for _ in range(8)]
    loss_fn = nn.CrossEntropyLoss()
    setups = {}
    for name in ("compiled bare", "compiled + Recorder"):
        model = make_model(d=128, layers=2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        rec = Recorder(model, opt, histogram_every=10) if "Recorder" in name else None
        setups[name] = (torch.compile(model, backend=backend), opt, rec)

    def step(name, i):
        compiled, opt, _ = setups[name]
        b = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        loss_fn(compiled(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten()).backward()
        opt.step()

    for name in setups:
        for i in range(2):  # compiles; the first step sets the recorder up: not timed
            step(name, i)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for blk in range(blocks):
        order = list(times) if blk % 2 == 0 else list(reversed(times))
        for name in order:
            for i in range(steps):
                t = time.perf_counter()
                step(name, i)
                times[name].append(time.perf_counter() - t)
    breaks = sum(counters["graph_break"].values())
    graphs = counters["stats"]["unique_graphs"]
    rec = setups["compiled + Recorder"][2]
    rec.detach()
    ratio = _print_pair(
        f"torch.compile (backend {backend}): transformer 2 x d128, batch {batch} x seq {seq}, "
        f"two models; graph breaks {breaks}, graphs compiled {graphs}, recorded layers "
        f"named like {rec.run.layer_names[0]!r}",
        times,
    )
    print(f"RATIO compiled step with/without Recorder = {ratio:.3f}; graph breaks = {breaks}")
    return ratio


def host_syncs(fn) -> int:
    """How many times ``fn()`` made the host wait for the GPU (each synchronizing CUDA call warns
    once under ``set_sync_debug_mode("warn")``)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # switching the mode on can itself warn once (an H100 run counted
        warnings.simplefilter("ignore")  # a bare step's syncs as 0 and as 1): not fn's
        torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def large_ratio(blocks: int, steps: int, device: str, batch: int = 8, seq: int = 256) -> None:
    """The GPU check: a ~100M-parameter transformer, bare vs recorded, interleaved; each
    timed step ends with a device synchronize (in every variant alike) so its time is the GPU's."""
    dev = torch.device(device)
    model = make_model(d=768, layers=12, vocab=16000).to(dev)
    opt, step = lm_training(model, 16000, batch, seq, n_batches=4, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    variants = {
        "bare": lambda: None,
        "Recorder, histograms off": lambda: Recorder(model, opt, histogram_every=0),
        "  same, trace_nonfinite=False": lambda: Recorder(model, opt, histogram_every=0, trace_nonfinite=False),
        "Recorder, histograms every 10": lambda: Recorder(model, opt, histogram_every=10),
    }
    for i in range(3):  # warm-up (kernels, allocator)
        step(i)
    sync()
    times: dict[str, list[float]] = {k: [] for k in variants}
    syncs: dict[str, str] = {}
    for blk in range(blocks):
        order = list(variants) if blk % 2 == 0 else list(reversed(variants))
        for name in order:
            rec = variants[name]()
            step(0, rec)  # the first step under a new recorder sets it up: not timed
            sync()
            if blk == 0:
                syncs[name] = str(host_syncs(lambda: step(1, rec))) if dev.type == "cuda" else "n/a (CPU)"
            for i in range(steps):
                t = time.perf_counter()
                step(i + 1, rec)
                sync()
                times[name].append(time.perf_counter() - t)
            if rec is not None:
                rec.detach()
    n = sum(p.numel() for p in model.parameters())
    med = {k: statistics.median(v) for k, v in times.items()}
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"large: transformer 12 x d768, {n / 1e6:.0f} M parameters, batch {batch} x seq {seq}, on {name}")
    print(f"{'variant':32s} {'median step':>12s} {'vs bare':>8s} {'host syncs/step':>16s}")
    for k, v in med.items():
        print(f"{k:32s} {v * 1e3:10.1f}ms {v / med['bare']:8.3f}x {syncs[k]:>16s}")
    print(
        f"RATIO large, histograms off / bare = {med['Recorder, histograms off'] / med['bare']:.3f} (target <= 1.01 on a GPU)"
    )


# ---------------------------------------------------------------------------------- the comparison
#: the noise scale's row: a Recorder with its probe, on a step of two half batches (accumulation)
NOISE = "gradwidget noise scale, 2 micro-batches"
#: the same accumulating step recorded without the noise probe: the probe's own share of ``NOISE``
NOISE_OFF = "gradwidget, noise_scale=False, 2 micro-batches"
#: what each variant of the comparison runs beside the same training step
COMPARE_VARIANTS = (
    "bare",
    "gradwidget defaults",
    "gradwidget, trace_nonfinite=False",
    "gradwidget panel on screen",
    "wandb.watch(log='all', log_freq=10)",
    "TensorBoard histograms every 10",
    "grad norms only (foreach: the floor)",
    "bare, 2 micro-batches",
    NOISE,
)
#: the variant each one is compared with (bare unless named here): gradient accumulation's own
#: cost is not the noise scale's
BASELINE = {NOISE: "bare, 2 micro-batches", NOISE_OFF: "bare, 2 micro-batches"}
#: the variants whose step accumulates the gradient of two half batches
ACCUMULATING = ("bare, 2 micro-batches", NOISE, NOISE_OFF)


#: the thousands of tiny modules of ``--paired tiny`` (``Linear(2, 2)``: twice as many tensors)
TINY_MODULES = 2000


def llama_model(vocab: int = 2000, seed: int = 0):
    """A Llama-style causal LM (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no
    biases), Hugging Face's ``LlamaForCausalLM`` at a tiny size, randomly initialised."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg)


class Comparison:
    """Identical models (same weights, data and AdamW), one per variant, each with its instrument
    attached once (so "auto" has finished its warm-up before the timed blocks); ``block(variant, n)``
    times n steps of one. Run in-process, or inside a Jupyter kernel whose page shows the panel
    (``compare_in_kernel``)."""

    def __init__(
        self, which: str, batch: int, seq: int, variants=COMPARE_VARIANTS, log_dir: str = "/tmp", device: str = "cpu"
    ) -> None:
        torch.set_num_threads(1)
        self.which, self.batch, self.seq = which, batch, seq
        self.device = torch.device(device)
        #: each timed step ends with a device synchronize (every variant alike), so it is the GPU's time
        self.sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        self.vocab = 16000 if which == "large" else 2000
        g = torch.Generator().manual_seed(0)
        if which == "tiny":  # thousands of tiny modules: SGD, as bench/scale.py
            self.data = [torch.randn(batch, 2, generator=g) for _ in range(8)]
        else:
            self.data = [torch.randint(0, self.vocab, (batch, seq + 1), generator=g) for _ in range(8)]
        self.data = [b.to(self.device) for b in self.data]
        self.loss_fn = nn.CrossEntropyLoss()
        self.log_dir = log_dir
        self.setups = {v: self._setup(v) for v in variants}
        self.calls = dict.fromkeys(variants, 0)

    def model(self):
        if self.which == "tiny":
            torch.manual_seed(0)
            model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(TINY_MODULES)])
        elif self.which == "llama":
            model = llama_model(self.vocab)
        elif self.which == "large":  # the ~100M-parameter transformer of --large
            model = make_model(d=768, layers=12, vocab=self.vocab)
        else:
            model = make_model(vocab=self.vocab)
        return model.to(self.device)

    def optimizer(self, model):
        if self.which == "tiny":
            return torch.optim.SGD(model.parameters(), lr=1e-3)
        return torch.optim.AdamW(model.parameters(), lr=1e-4)

    def _loss(self, model, b):
        if self.which == "tiny":
            return model(b).square().mean()
        if self.which == "llama":
            return model(input_ids=b[:, :-1], labels=b[:, :-1]).loss
        return self.loss_fn(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())

    def _setup(self, variant: str):
        import tempfile

        model = self.model()
        opt = self.optimizer(model)
        inst, log = None, None
        if variant in ("gradwidget defaults", EAGER):
            inst = Recorder(model, opt)
            log = inst.log
        elif variant in ABLATIONS:
            inst = Recorder(model, opt, **ABLATIONS[variant])
            log = inst.log
        elif variant == NOISE:
            inst = Recorder(model, opt, noise_scale=True)
            log = inst.log
        elif variant == NOISE_OFF:
            inst = Recorder(model, opt, noise_scale=False)
            log = inst.log
        elif variant == "gradwidget panel on screen":
            from gradwidget import GradientPanel

            inst = GradientPanel(model, opt)
            log = inst.log
        elif variant.startswith("wandb"):
            import os

            import wandb

            os.environ["WANDB_MODE"] = "offline"
            os.environ["WANDB_SILENT"] = "true"
            run = wandb.init(project="gw-bench", dir=tempfile.mkdtemp(dir=self.log_dir), mode="offline")
            run.watch(model, log="all", log_freq=10)
            inst = run

            def log(loss):
                run.log({"loss": loss.item()})

        elif variant.startswith("TensorBoard"):
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(tempfile.mkdtemp(dir=self.log_dir))
            inst = writer
            state = {"n": 0}

            def log(loss):
                n = state["n"]
                state["n"] += 1
                writer.add_scalar("loss", loss.item(), n)
                if n % 10 == 0:
                    for name, p in model.named_parameters():
                        writer.add_histogram(f"weight/{name}", p, n)
                        if p.grad is not None:
                            writer.add_histogram(f"grad/{name}", p.grad, n)

        elif variant.startswith("grad norms"):
            inst = []

            def log(loss):  # what any per-layer statistic costs at least: fused norms, one host copy
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                inst.append(torch.stack(torch._foreach_norm(grads)).cpu())

        return model, opt, inst, log

    def _step(self, variant: str) -> None:
        _fused.ENABLED = variant != EAGER  # read as each step is planned and queued
        model, opt, _, log = self.setups[variant]
        i = self.calls[variant]
        self.calls[variant] = i + 1
        b = self.data[i % len(self.data)]
        opt.zero_grad(set_to_none=True)
        parts = b.chunk(2) if variant in ACCUMULATING else (b,)
        for part in parts:
            loss = self._loss(model, part) / len(parts)
            loss.backward()
        if log is not None:
            log(loss)
        opt.step()
        self.sync()

    def block(self, variant: str, n: int) -> dict:
        """n steps of ``variant``: each step's seconds and the loop's."""
        times = []
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            t = time.perf_counter()
            self._step(variant)
            times.append(time.perf_counter() - t)
        loop, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"variant": variant, "step_s": times, "loop_s": loop, "cpu_s": cpu}

    def first_steps(self, n: int = 10) -> dict:
        """A fresh model and a fresh ``Recorder`` (defaults), then a fresh model bare: each of the
        first ``n`` steps' seconds (the first sets the Recorder up; "auto" measures its tracer next)."""
        out = {}
        for name in ("fresh Recorder", "fresh bare"):
            model = self.model()
            opt = self.optimizer(model)
            t = time.perf_counter()
            rec = Recorder(model, opt) if name == "fresh Recorder" else None
            build = time.perf_counter() - t
            self.setups[name] = (model, opt, rec, rec.log if rec is not None else None)
            self.calls[name] = 0
            times = []
            for _ in range(n):
                t = time.perf_counter()
                self._step(name)
                times.append(time.perf_counter() - t)
            out[name] = {"build_s": build, "step_s": times}
            if rec is not None:
                out[name]["tracing"] = rec.tracing_text()
                rec.detach()
            del self.setups[name]
        return out

    def describe(self) -> str:
        model = self.setups["bare"][0]
        n = sum(p.numel() for p in model.parameters())
        k = sum(1 for _ in model.parameters())
        on = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "CPU"
        if self.which == "tiny":
            return f"{TINY_MODULES:,} x Linear(2, 2), SGD: {k:,} parameter tensors, batch {self.batch}, on {on}"
        name = {
            "llama": "Llama-style LlamaForCausalLM 4 x d128",
            "large": "transformer 12 x d768",
        }.get(self.which, "bench transformer 4 x d256")
        return (
            f"{name}: {k} parameter tensors, {n / 1e6:.1f} M parameters, batch {self.batch} x seq {self.seq}, on {on}"
        )

    def close(self) -> None:
        for v, (_, _, inst, _) in self.setups.items():
            if v.startswith("gradwidget"):
                inst.close() if hasattr(inst, "close") else inst.detach()
            elif v.startswith("wandb"):
                inst.finish()
            elif v.startswith("TensorBoard"):
                inst.close()


def _interleaved(block, variants, rounds: int, steps: int) -> list[dict]:
    """Rounds of one block per variant, the order rotated each round (a busy machine hits all alike)."""
    out = []
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            out.append(block(v, steps))
    return out


def compare_table(blocks: list[dict], title: str) -> dict:
    """Per variant: median over blocks of the block's mean step (a block holds whole cycles of the
    every-10-steps work of wandb and TensorBoard), its ratio to bare, the spread of the per-round
    ratios, and the median step."""
    variants = list(dict.fromkeys(b["variant"] for b in blocks))
    by = {v: [b for b in blocks if b["variant"] == v] for v in variants}
    mean = {v: [b["loop_s"] / len(b["step_s"]) for b in by[v]] for v in variants}
    cpu = {v: [b["cpu_s"] / len(b["step_s"]) for b in by[v]] for v in variants}
    print(title)
    print(
        f"  {'variant':38s} {'mean step':>10s} {'vs bare':>8s} {'rounds (min-max)':>18s} {'median step':>12s} "
        f"{'CPU vs bare':>12s}"
    )
    res = {}
    for v in variants:
        ref = BASELINE.get(v, "bare")
        base, base_cpu = statistics.median(mean[ref]), statistics.median(cpu[ref])
        m, c = statistics.median(mean[v]), statistics.median(cpu[v])
        per_round = [a / b for a, b in zip(mean[v], mean[ref])]
        med = statistics.median([x for b in by[v] for x in b["step_s"]])
        res[v] = {
            "mean_ms": m * 1e3,
            "ratio": m / base,
            "lo": min(per_round),
            "hi": max(per_round),
            "median_ms": med * 1e3,
            "cpu_ratio": c / base_cpu,
        }
        print(
            f"  {v:38s} {m * 1e3:8.1f}ms {m / base:7.3f}x {min(per_round):8.2f}-{max(per_round):.2f}x "
            f"{med * 1e3:10.1f}ms {c / base_cpu:11.3f}x"
        )
    print(
        "  (mean step: the loop's time over its steps, median over blocks; CPU: this process's CPU time, "
        "all its threads; wandb's service process is not in it; "
        + "; ".join(f"{v} against {b}" for v, b in BASELINE.items() if v in by)
        + ")"
    )
    return res


def print_first_steps(first: dict) -> None:
    rec, bare = first["fresh Recorder"], first["fresh bare"]
    print(f"  first 10 steps of a fresh Recorder ({rec['tracing']}):")
    print(f"    Recorder() built in {rec['build_s'] * 1e3:.1f} ms")
    print("    step   " + " ".join(f"{i:>7d}" for i in range(len(rec["step_s"]))))
    print("    bare   " + " ".join(f"{t * 1e3:6.1f}m" for t in bare["step_s"]))
    print("    fresh  " + " ".join(f"{t * 1e3:6.1f}m" for t in rec["step_s"]))
    extra = sum(rec["step_s"]) + rec["build_s"] - sum(bare["step_s"])
    print(
        f"    the 10 steps took {extra * 1e3:+.0f} ms more than bare ({(sum(rec['step_s']) + rec['build_s']) / sum(bare['step_s']):.2f}x)"
    )


def compare_in_process(which: str, rounds: int, steps: int, batch: int, seq: int) -> dict:
    """The comparison without a kernel (no panel on screen)."""
    variants = tuple(v for v in COMPARE_VARIANTS if "panel" not in v)
    cmp = Comparison(which, batch, seq, variants)
    for v in variants:  # warm-up: "auto" decides about its tracer in its first 9 steps
        cmp.block(v, 12)
    blocks = _interleaved(cmp.block, list(variants), rounds, steps)
    res = compare_table(blocks, f"{cmp.describe()} (in-process, {rounds} rounds of {steps} steps)")
    first = cmp.first_steps()
    print_first_steps(first)
    cmp.close()
    return res


#: a second bare model, timed against the first: the null check of ``--paired``'s estimator (1.000
#: where pairing, alternation and the collections' removal leave no bias between two models)
SECOND_BARE = "bare, a second model (null check)"
#: the variants of ``--paired`` (the recording's own cost, and the noise scale's under accumulation)
PAIRED_VARIANTS = (
    "bare",
    "gradwidget defaults",
    "bare, 2 micro-batches",
    NOISE,
    NOISE_OFF,
    SECOND_BARE,
)


#: ``--ablate``: the defaults with one optional part off at a time, and with all of them off (what
#: each costs of the defaults' ratio; Recorder keyword arguments by variant)
ABLATIONS = {
    "gradwidget, histogram_every=0": {"histogram_every": 0},
    "gradwidget, track_updates=False": {"track_updates": False},
    "gradwidget, trace_nonfinite=False": {"trace_nonfinite": False},
    "gradwidget, noise_scale=False": {"noise_scale": False},
    "gradwidget, all four off": {
        "histogram_every": 0,
        "track_updates": False,
        "trace_nonfinite": False,
        "noise_scale": False,
    },
}
ABLATION_VARIANTS = ("bare", "gradwidget defaults", *ABLATIONS)


#: on a GPU, also: the recording without the NaN tracer, and the floor (fused norms, one host copy)
#: on an accelerator: the defaults with the eager statistics kernels in place of the fused one
#: (collect/_fused.py, where Triton is), side by side
EAGER = "gradwidget defaults, eager kernels"
GPU_PAIRED_VARIANTS = PAIRED_VARIANTS + (
    "gradwidget, trace_nonfinite=False",
    EAGER,
    "grad norms only (foreach: the floor)",
)


def step_host_syncs(cmp: "Comparison", variant: str) -> int:
    """The host syncs one step of ``variant`` makes (CUDA), the step-end synchronize every variant
    has for timing left out."""
    sync, cmp.sync = cmp.sync, (lambda: None)
    try:
        return host_syncs(lambda: cmp._step(variant))
    finally:
        cmp.sync = sync
        sync()


def periodic_steps(inst) -> list[int]:
    """The periods, in steps, of what a Recorder ``inst`` does one recorded step in N (histograms,
    update norms, the noise scale); none for a bare variant or another tool."""
    if not isinstance(inst, Recorder):
        return [1]
    noise = inst.noise_every or 1
    return [inst.every * max(n, 1) for n in (inst.histogram_every, inst.update_every, noise)]


def compare_paired(
    which: str, rounds: int, per_block: int, batch: int, seq: int, device: str = "cpu", variants=None
) -> dict:
    """The recording's cost resolved on a shared machine (``paired``): many short interleaved
    blocks, each variant's per-round ratio to its baseline in CPU and wall-clock time, the median
    with its bootstrap 95% interval and interquartile range. On CUDA each step ends with a
    synchronize (wall-clock is the GPU's time; CPU is the host's work) and each variant's host
    syncs per step are counted.

    Every variant runs in this process, so each pair of blocks shares its memory, threads and
    load; Python's full collections, which land in whichever block is running, are timed and
    taken out of the per-group ratios, and counted (paired.py). Not one process per variant:
    each process has a speed of its own, a spread that rounds cannot average out."""
    from paired import interleaved_rounds, ratio_summary, summary_text, timed

    cuda = torch.device(device).type == "cuda"
    variants = variants or (GPU_PAIRED_VARIANTS if cuda else PAIRED_VARIANTS)
    cmp = Comparison(which, batch, seq, variants, device=device)
    for v in variants:  # warm-up: "auto" decides about its tracer in its first 9 steps
        cmp.block(v, 12)
    syncs = {v: step_host_syncs(cmp, v) for v in variants} if cuda else {}

    # every ratio over a whole period of what its two variants do one step in N (paired.py): the
    # rounds whose steps make whole periods of both (the noise scale's 8 need not coarsen the rest)
    def group(*pair: str) -> int:
        period = math.lcm(*(n for v in pair for n in periodic_steps(cmp.setups[v][2])))
        return period // math.gcd(period, per_block)

    # each ratio printed: a variant against its baseline, and the probe's own share
    baselines = {"bare", *BASELINE.values()}
    pairs = {v: (v, BASELINE.get(v, "bare")) for v in variants if v not in baselines}
    if NOISE in variants and NOISE_OFF in variants:
        pairs["noise probe"] = (NOISE, NOISE_OFF)
    groups = {k: group(*p) for k, p in pairs.items()}
    whole = math.lcm(*groups.values())
    rounds = max(-(-rounds // whole), 2) * whole  # two ratios at least, for an interval
    res = interleaved_rounds({v: timed(functools.partial(cmp._step, v)) for v in variants}, rounds, per_block)
    sizes = ", ".join(str(g) for g in sorted(set(groups.values())))
    print(
        f"{cmp.describe()} (in-process, {rounds} rounds of {per_block} steps per variant; each ratio over "
        f"groups of rounds that make whole periods of its pair's work one step in N: {sizes} rounds)"
    )
    if cuda:
        bare_ms = statistics.median(b[0] for b in res["bare"]) / per_block * 1e3
        print(f"  bare step {bare_ms:.2f} ms (wall, GPU synchronized); host syncs per step: {syncs}")
    out = {}
    for key, (v, ref) in pairs.items():
        out[key] = ratio_summary(res[v], res[ref], groups[key])
        share = " (the probe's own share)" if key == "noise probe" else ""
        print(f"  {v} / {ref}{share}: {summary_text(out[key])}")
    for v, (_, _, inst, _) in cmp.setups.items():
        if v.startswith("gradwidget"):
            print(f"  {v}: {inst!r}")
    cmp.close()
    return out


SETUP_CELL = """
import sys, json
sys.path.insert(0, {bench!r})
import overhead
cmp = overhead.Comparison({which!r}, {batch}, {seq})
panel = cmp.setups["gradwidget panel on screen"][2]
"""


def compare_in_kernel(which: str, rounds: int, steps: int, batch: int, seq: int) -> dict:
    """The comparison inside a Jupyter kernel, the panel displayed in JupyterLab (headless Chromium):
    every variant runs in that kernel, each block as a cell would (bench/live.py's machinery)."""
    import json
    import sys
    import tempfile
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from live import EXEC_JS  # also puts tests/browser on sys.path

    from lab import KERNEL_IDLE_JS, RUN_CELL_JS, notebook_page

    cells = [SETUP_CELL.format(bench=str(here), which=which, batch=batch, seq=seq), "panel"]
    with (
        tempfile.TemporaryDirectory() as tmp,
        notebook_page(Path(tmp), cells, name="compare.ipynb", timeout_ms=900_000) as page,
    ):

        def kexec(code):
            r = page.evaluate(EXEC_JS, code)
            if "ERROR" in r["out"]:
                raise RuntimeError(r["out"])
            return r["out"]

        for i in range(2):
            page.evaluate(RUN_CELL_JS, i)
            page.wait_for_timeout(300)
            page.wait_for_function(KERNEL_IDLE_JS)
        page.wait_for_function(
            "() => { const r = document.querySelector('.gw-root'); return r && r.parentElement.gradwidget; }"
        )

        def block(v, n):
            out = json.loads(kexec(f"print(json.dumps(cmp.block({v!r}, {n})))"))
            page.wait_for_timeout(300)  # the panel's trailing updates, as between cells
            return out

        for v in COMPARE_VARIANTS:
            block(v, 12)
        blocks = _interleaved(block, list(COMPARE_VARIANTS), rounds, steps)
        desc = kexec("print(cmp.describe())").strip()
        res = compare_table(blocks, f"{desc} (in a Jupyter kernel, panel on screen; {rounds} rounds of {steps} steps)")
        first = json.loads(kexec("print(json.dumps(cmp.first_steps()))"))
        print_first_steps(first)
        kexec("cmp.close()")
    return res


def fused_cpu(blocks: int, steps: int, batch: int, seq: int) -> None:
    """``--fused-cpu``: the recording's in-step CPU time with the eager statistics and with a fused
    pass generated by ``torch.compile`` (same five rows and weight norms), in interleaved blocks."""
    import statistics as st

    import gradwidget.collect._stats as S
    from gradwidget.collect import torch as T

    def rows(grads, weights):
        out = []
        for g in grads:
            f = g.reshape(-1)
            a = f.abs()
            out.append(torch.stack([(f * f).sum().sqrt(), a.sum(), a.amax(), (f != 0).sum().to(f.dtype), f.sum()]))
        wn = [(w.reshape(-1) * w.reshape(-1)).sum().sqrt() for w in weights]
        return torch.stack(out, 1).double(), torch.stack(wn).double()

    compiled = torch.compile(rows, dynamic=False, fullgraph=True)
    eager_group, mode = S.queue_group, {"fused": False}

    def queue_group(pack, grads, weights, with_hist):
        fits = grads and weights and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in grads + weights)
        if not (mode["fused"] and fits):
            return eager_group(pack, grads, weights, with_hist)
        r, w = compiled(grads, weights)
        hist = pack.add(S.exponent_counts(grads)) if with_hist else None
        return pack.add(r), pack.add(w), hist, False

    S.queue_group = queue_group
    spent = [0.0]
    pre = T.Recorder._pre_step

    def timed(self, *a, **k):
        t = time.process_time()
        try:
            return pre(self, *a, **k)
        finally:
            spent[0] += time.process_time() - t

    T.Recorder._pre_step = timed
    try:
        model = llama_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(0)
        data = [torch.randint(0, 2000, (batch, seq), generator=g) for _ in range(4)]

        def step(i, rec):
            out = model(input_ids=data[i % 4], labels=data[i % 4])
            out.loss.backward()
            rec.log(loss=out.loss)
            opt.step()
            opt.zero_grad()

        rec = Recorder(model, opt)
        for i in range(10):
            step(i, rec)
        mode["fused"] = True
        c0, w0 = time.process_time(), time.perf_counter()
        step(10, rec)  # compiles the fused pass for this model's gradients
        print(
            f"compiling the fused pass at the first recorded step: {time.process_time() - c0:.1f} s CPU, "
            f"{time.perf_counter() - w0:.1f} s wall",
            flush=True,
        )
        res: dict[str, list[tuple[float, float]]] = {"eager": [], "fused": []}
        for blk in range(2 * blocks):
            name = ("eager", "fused")[blk % 2]
            mode["fused"] = name == "fused"
            for i in range(5):
                step(i, rec)
            spent[0], c = 0.0, time.process_time()
            for i in range(steps):
                step(i, rec)
            res[name].append((spent[0] / steps * 1e3, (time.process_time() - c) / steps * 1e3))
        rec.detach()
    finally:
        S.queue_group, T.Recorder._pre_step = eager_group, pre
    print(f"Llama-style model, batch {batch} x seq {seq}, blocks of {steps} steps; recording hooks in CPU ms a step")
    print("| statistics | hooks, median | each block | step, median |")
    print("| --- | ---: | --- | ---: |")
    for name, v in res.items():
        each = " ".join(f"{a:.2f}" for a, _ in v)
        print(f"| {name} | {st.median(a for a, _ in v):.2f} | {each} | {st.median(b for _, b in v):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10, help="steps per block")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--trainer", action="store_true", help="also: the HF Trainer step with/without the callback")
    ap.add_argument("--compiled", action="store_true", help="also: a torch.compile'd model with/without a Recorder")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--large", action="store_true", help="also: a ~100M-parameter model on --device")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--only", action="store_true", help="run only the sections asked for with --trainer/--compiled/--large"
    )
    ap.add_argument(
        "--compare",
        nargs="*",
        choices=["transformer", "llama"],
        help="the comparison (bare, gradwidget, the panel, wandb, TensorBoard, the floor) on these models",
    )
    ap.add_argument(
        "--paired",
        nargs="*",
        choices=["transformer", "llama", "tiny", "large"],
        help="the recording's cost on these models in many short interleaved blocks (CPU and wall-clock "
        "ratios with their 95%% intervals; tiny: 2,000 x Linear(2, 2); large: 12 x d768) on --device",
    )
    ap.add_argument(
        "--ablate",
        nargs="*",
        choices=["transformer", "llama", "tiny", "large"],
        help="--paired's rounds of the defaults with each optional part off, one at a time and all together",
    )
    ap.add_argument(
        "--rounds", type=int, default=120, help="--paired: rounds of one block per variant (a multiple of a period's)"
    )
    ap.add_argument("--runs", type=int, default=3, help="--compare, --paired: runs of each model")
    ap.add_argument("--no-kernel", action="store_true", help="--compare in this process, without the panel")
    ap.add_argument(
        "--fused-cpu", action="store_true", help="the eager statistics against a torch.compile'd fused pass"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.fused_cpu:
        fused_cpu(args.blocks, 30 if args.steps == 10 else args.steps, args.batch, 32 if args.seq == 64 else args.seq)
        return
    for which in args.compare or ():
        for r in range(args.runs):
            print(f"--- {which}, run {r + 1} of {args.runs}", flush=True)
            run = compare_in_process if args.no_kernel else compare_in_kernel
            run(which, args.blocks, args.steps, args.batch, args.seq)
    for models, variants in ((args.paired, None), (args.ablate, ABLATION_VARIANTS)):
        for which in models or ():
            for r in range(args.runs):
                print(f"--- {which}, run {r + 1} of {args.runs}", flush=True)
                batch = 8 if which == "tiny" else args.batch
                compare_paired(which, args.rounds, 2, batch, args.seq, args.device, variants)
    if args.compare is not None or args.paired is not None or args.ablate is not None:
        return
    if args.large:
        large_ratio(args.blocks, args.steps, args.device)
    if args.trainer:
        hf_trainer_ratio(args.blocks, args.steps)
    if args.compiled:
        compiled_ratio(args.blocks, args.steps, args.batch, args.seq, args.compile_backend)
    if args.only:
        return

    model = make_model()
    opt, step = lm_training(model, 2000, args.batch, args.seq)
    n_params = sum(p.numel() for p in model.parameters())
    n_tensors = sum(1 for _ in model.parameters())

    variants = {
        "bare": lambda: None,
        "ours: stats every step": lambda: Recorder(model, opt, histogram_every=0),
        "ours: + histograms every 10": lambda: Recorder(model, opt, histogram_every=10),
        "naive per-parameter": lambda: NaiveRecorder(model, opt),
    }
    times = {k: [] for k in variants}
    for i in range(3):  # warm-up
        step(i)
    for blk in range(args.blocks):
        order = list(variants) if blk % 2 == 0 else list(reversed(variants))
        for name in order:
            rec = variants[name]()
            step(0, rec)  # first step under a new recorder sets it up: not timed
            for i in range(args.steps):
                t = time.perf_counter()
                step(i + 1, rec)
                times[name].append(time.perf_counter() - t)
            if isinstance(rec, Recorder) and blk == 0:  # trace_nonfinite="auto" keeps tracing on here
                print(f"{name}: {rec.tracing_text()}")
            if rec is not None:
                rec.detach()

    # the recording work alone, on the same gradients, interleaved (less noisy than step deltas)
    step(0)
    # one Recorder (a second one on the same model would detach the first): histograms on or off
    # per call through histogram_every
    ours = Recorder(model, opt, histogram_every=0)
    step(1, ours)
    naive = NaiveRecorder(model, opt, histogram_every=1)
    naive.h.remove()

    def ours_work(rec, hist=False):
        rec.histogram_every = 1 if hist else 0
        rec._on_step(before_update=True)
        rec._post_step(opt, (), {})

    work = {"ours: stats": [], "ours: stats + histogram": [], "naive: stats + histc": []}
    for _ in range(args.blocks * args.steps):
        for name, fn in (
            ("ours: stats", lambda: ours_work(ours)),
            ("ours: stats + histogram", lambda: ours_work(ours, hist=True)),
            ("naive: stats + histc", lambda: naive._step()),
        ):
            t = time.perf_counter()
            fn()
            work[name].append(time.perf_counter() - t)

    def wandb_like():  # what wandb.watch(log="gradients") does at every logged step, per tensor
        for _, p in model.named_parameters():
            g = p.grad.detach().reshape(-1)
            g.norm().item()
            lo, hi = g.min().item(), g.max().item()
            torch.histc(g, bins=64, min=lo, max=hi).cpu()

    work["wandb.watch-like: norm + histc"] = []
    for _ in range(args.blocks * args.steps):
        t = time.perf_counter()
        wandb_like()
        work["wandb.watch-like: norm + histc"].append(time.perf_counter() - t)
    work["ours: stats, no update norms"] = []
    ours.track_updates = False
    ours._updates.close()  # no more update norms from here on
    for _ in range(args.blocks * args.steps):
        t = time.perf_counter()
        ours_work(ours)
        work["ours: stats, no update norms"].append(time.perf_counter() - t)
    ours.detach()
    naive.every = 10**9  # no histograms from here on
    work["naive: stats only"] = []
    for _ in range(args.blocks * args.steps):
        t = time.perf_counter()
        naive._step()
        work["naive: stats only"].append(time.perf_counter() - t)

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"model: transformer 4 x d256, {n_tensors} parameter tensors, {n_params / 1e6:.1f} M parameters; "
        f"batch {args.batch} x seq {args.seq}; torch threads {torch.get_num_threads()}"
    )
    print(f"{'variant':32s} {'median step':>12s} {'vs bare':>8s}  (n={args.blocks * args.steps} steps each)")
    for k, v in med.items():
        print(f"{k:32s} {v * 1e3:10.1f}ms {v / med['bare']:8.3f}x")
    wm = {k: statistics.median(v) for k, v in work.items()}
    print("recording work per step, same gradients (median):")
    for k, v in wm.items():
        print(f"  {k:30s} {v * 1e3:8.2f} ms")
    print(f"RATIO stats-only/bare (step time) = {med['ours: stats every step'] / med['bare']:.3f} (target <= 1.05)")
    print(f"RATIO recording work / bare step = {wm['ours: stats'] / med['bare']:.3f} (stats incl. update norms)")
    ours10 = wm["ours: stats"] + (wm["ours: stats + histogram"] - wm["ours: stats"]) / 10
    naive10 = wm["naive: stats only"] + (wm["naive: stats + histc"] - wm["naive: stats only"]) / 10
    print(f"RATIO naive/ours, stats every step + histograms every 10 (amortised) = {naive10 / ours10:.1f}x")
    print(
        f"RATIO wandb.watch-like every step / ours stats every step + histograms every 10 = "
        f"{wm['wandb.watch-like: norm + histc'] / ours10:.1f}x"
    )
    print(
        f"RATIO naive/ours, same statistics (no update norms) = "
        f"{wm['naive: stats only'] / wm['ours: stats, no update norms']:.1f}x; "
        f"naive/ours incl. our update norms = {wm['naive: stats only'] / wm['ours: stats']:.1f}x; "
        f"with histograms = {wm['naive: stats + histc'] / wm['ours: stats + histogram']:.1f}x (target >= 3)"
    )


if __name__ == "__main__":
    main()
