"""The gradient noise scale against ground truth, a batch-size sweep, and what it costs.

1. **Estimate vs exact.** For small models on sklearn's digits (logistic regression, an MLP, a tiny
   CNN; ``--gpt2``: a tiny GPT-2 on character sequences), B_simple = tr(Σ)/|G|² is computed exactly
   at fixed parameters from every example's gradient (``torch.func``: ``vmap`` of ``grad`` over the
   data set; Σ is the covariance of the per-example gradients over the data set, G their mean).
   The Recorder's estimate comes from real hooks on real training steps with gradient accumulation
   (``--micro`` micro-batches of ``--b`` examples drawn with replacement, SGD with lr 0 so the
   parameters stay where the exact value was taken), smoothed as the panel shows it (the estimate of the present,
   its last value after ``--steps`` steps). Relative error, over ``--seeds`` seeds (each a
   different initialisation and batch order), at initialisation and after some training.
2. **Sweep** (``--sweep``): an MLP on digits trained with batch sizes 8..1024 (SGD, the best of a
   few learning rates per batch size) to a target training loss; steps and examples needed per
   batch size, against the B_simple measured at that loss. Steps fall in proportion to the batch
   while it is well below B_simple and stop falling near it (examples per step are then wasted).
3. **The present** (``--present``): four models outside the list above (a GRU reading the 8 rows
   of a digit, a patch-transformer layer on digits, a tabular MLP on breast cancer, an MLP
   regression on diabetes), trained with Adam (lr 1e-3) for ``--steps`` steps of 4 micro-batches
   of 16 under the default Recorder (its cadence: the first 10 steps, then one in 8). At the last
   measured step of each third of the run, the exact B_simple at that step's parameters (every
   example's gradient, ``torch.func``) against the estimate the panel shows there and its 95%
   interval, and against a textbook baseline: the ratio of two 20-row EMAs, one weight per row.
   Beside them, what the data allows: the spread of one row's |G|² estimate over |G|² (exact, from
   Σ and G), and so the rows an average needs for |G|² within a third (9 times its square),
   against the rows the 64-step average holds at the default cadence.
4. **Cost** (``--cost``): a recorded accumulation step (4 micro-batches) with ``noise_scale=False``
   vs True, and a plain step vs ``Recorder.split_backward`` (the opt-in for one batch size),
   interleaved, medians; torch single-threaded.

    python bench/noise_scale.py [--seeds 5] [--steps 200] [--b 64] [--models logreg,mlp,cnn,gpt2] [--sweep] [--cost]
    python bench/noise_scale.py --present [--seeds 3] [--steps 240]

The figures, with the commands that reproduce them, are in docs/noise-scale.md (estimate vs exact,
the sweep, the present) and docs/costs.md (the cost).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from gradwidget.analysis.noise_scale import TAU_STEPS, noise_scale
from gradwidget.collect._noise import NOISE_EVERY
from gradwidget.collect.torch import Recorder
from gradwidget.noise_series import NOISE_MIN_ROWS

F = nn.functional


# --------------------------------------------------------------------------- data and models
def digits(n: int | None = None):
    """sklearn's 8x8 digits, standardised: ``(X (N, 64) float32, y (N,) int64)``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = d.data.astype(np.float32)
    X = (X - X.mean(0)) / (X.std(0) + 1e-3)
    X, y = torch.tensor(X), torch.tensor(d.target, dtype=torch.int64)
    return (X[:n], y[:n]) if n else (X, y)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def markov_text(n: int = 1024, seq: int = 16, vocab: int = 64, seed: int = 0):
    """``n`` token sequences from a fixed random Markov chain (each token has 4 likely successors):
    a language a small LM can learn. ``(X, X)``: the labels are the inputs (shifted inside GPT-2)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, vocab, generator=g) + 4.0 * (torch.rand(vocab, vocab, generator=g) < 4 / vocab)
    probs = logits.softmax(1)
    X = torch.empty(n, seq, dtype=torch.int64)
    X[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(1, seq):
        X[:, t] = torch.multinomial(probs[X[:, t - 1]], 1, generator=g).squeeze(1)
    return X, X


def tiny_gpt2() -> nn.Module:
    import logging

    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    cfg = GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(cfg)


def data_of(kind: str):
    return markov_text() if kind == "gpt2" else digits()


def batch_loss(model, x, y):
    """The loss averaged over a batch (GPT-2: over its tokens, every sequence the same length)."""
    if isinstance(model, nn.Module) and type(model).__name__ == "GPT2LMHeadModel":
        return model(input_ids=x, labels=y).loss
    return F.cross_entropy(model(x), y)


def make(kind: str) -> nn.Module:
    if kind == "gpt2":
        return tiny_gpt2()
    if kind == "logreg":
        return nn.Linear(64, 10)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    if kind == "cnn":
        return TinyCNN()
    raise ValueError(kind)


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


# --------------------------------------------------------------------------- ground truth
def exact_b_simple(model: nn.Module, X: torch.Tensor, Y: torch.Tensor, chunk: int = 512) -> dict:
    """tr(Σ), |G|² and B_simple at the model's parameters, from every example's gradient (tied
    weights once, with the gradient of every use, as the Recorder sees them)."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    gpt2 = type(model).__name__ == "GPT2LMHeadModel"

    def one(p, x, y):
        if gpt2:
            return functional_call(model, p, (x[None],), {"labels": y[None]}).loss
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    per = vmap(grad(one), in_dims=(None, 0, 0))
    s1 = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in params.items()}
    sq = 0.0
    for i in range(0, len(X), chunk):
        g = per(params, X[i : i + chunk], Y[i : i + chunk])
        for k, v in g.items():
            v = v.double()
            s1[k] += v.sum(0)
            sq += float(v.pow(2).sum())
    n = len(X)
    g2 = sum(float((v / n).pow(2).sum()) for v in s1.values())
    tr = sq / n - g2  # mean |g_i|^2 - |G|^2: the population covariance's trace
    return {"g2": g2, "tr": tr, "b_simple": tr / g2}


def estimate(model, X, Y, b: int, micro: int, steps: int, seed: int) -> tuple[tuple, float]:
    """The Recorder's B_simple over ``steps`` accumulation steps of ``micro`` micro-batches of ``b``
    examples, with lr 0 (the parameters stay put): the panel's (the estimate of the present at the last
    step, its interval) and the estimate averaged over every step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    gen = torch.Generator().manual_seed(1000 + seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = Recorder(model, opt, noise_scale=True, histogram_every=0, trace_nonfinite=False, track_updates=False)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(micro):
            idx = torch.randint(0, len(X), (b,), generator=gen)
            (batch_loss(model, X[idx], Y[idx]) / micro).backward()
        opt.step()
    rec.detach()
    ns, whole = noise_scale(rec.run), noise_scale(rec.run, steps)
    assert ns is not None and whole is not None
    return ns.last, whole.last[0]


def train(model, X, Y, steps: int, b: int = 32, lr: float = 0.1, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.randint(0, len(X), (b,), generator=gen)
        opt.zero_grad()
        batch_loss(model, X[idx], Y[idx]).backward()
        opt.step()


def compare(kinds, seeds: int, steps: int, b: int, micro: int, trained: int) -> list[dict]:
    rows = []
    for kind in kinds:
        X, Y = data_of(kind)
        for when in ("init", f"after {trained} steps"):
            errs, exact_v, est_v, covered, long_errs, unmeasured = [], [], [], 0, [], 0
            for seed in range(seeds):
                torch.manual_seed(seed)
                m = make(kind)
                if when != "init":
                    train(m, X, Y, trained, seed=seed)
                ex = exact_b_simple(m, X, Y)["b_simple"]
                (est, lo, hi), long_est = estimate(m, X, Y, b, micro, steps, seed)
                exact_v.append(ex)
                long_errs.append(long_est / ex - 1)
                covered += lo <= ex <= hi
                if not np.isfinite(est):
                    unmeasured += 1  # |G|^2 not above 0 yet: the panel says "not yet measurable"
                    continue
                errs.append(est / ex - 1)
                est_v.append(est)
            rows.append(
                {
                    "model": kind,
                    "when": when,
                    "exact": statistics.median(exact_v),
                    "estimate": statistics.median(est_v) if est_v else float("nan"),
                    "rel_err_median": statistics.median(errs) if errs else float("nan"),
                    "rel_err_abs_mean": float(np.mean(np.abs(errs))) if errs else float("nan"),
                    "rel_err_sd": float(np.std(errs, ddof=1)) if len(errs) > 1 else float("nan"),
                    "covered": f"{covered}/{seeds}",
                    "unmeasured": unmeasured,
                    "long_err_median": statistics.median(long_errs),
                    "long_err_sd": float(np.std(long_errs, ddof=1)) if seeds > 1 else float("nan"),
                }
            )
            r = rows[-1]
            print(
                f"| {kind} | {when} | {r['exact']:.1f} | {r['estimate']:.1f} | {r['rel_err_median']:+.1%} | "
                f"{r['rel_err_abs_mean']:.1%} | {r['rel_err_sd']:.1%} | {r['covered']} | {r['unmeasured']} | "
                f"{r['long_err_median']:+.1%} ± {r['long_err_sd']:.1%} |",
                flush=True,
            )
    return rows


# --------------------------------------------------------------------------- the present
def _standard(a: np.ndarray) -> np.ndarray:
    return (a - a.mean(0)) / (a.std(0) + 1e-6)


def tabular(name: str):
    """sklearn's digits, breast cancer or diabetes (target standardised), features standardised."""
    from sklearn import datasets

    d = {"digits": datasets.load_digits, "cancer": datasets.load_breast_cancer, "diabetes": datasets.load_diabetes}[
        name
    ]()
    X = torch.tensor(_standard(d.data.astype(np.float32)))
    if name == "diabetes":
        return X, torch.tensor(_standard(d.target.astype(np.float32)))
    return X, torch.tensor(d.target, dtype=torch.int64)


class GRURows(nn.Module):
    """A GRU over the 8 rows of a digit (written out: ``vmap`` has a rule for each of its ops)."""

    def __init__(self) -> None:
        super().__init__()
        self.ih, self.hh, self.head = nn.Linear(8, 96), nn.Linear(32, 96), nn.Linear(32, 10)

    def forward(self, x):
        x, h = x.reshape(len(x), 8, 8), x.new_zeros(len(x), 32)
        for t in range(8):
            ir, iz, i_n = self.ih(x[:, t]).chunk(3, -1)
            hr, hz, h_n = self.hh(h).chunk(3, -1)
            r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
            h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
        return self.head(h)


class Patches(nn.Module):
    """A pre-norm transformer layer (2 heads) over the four 4x4 patches of a digit."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.pos = nn.Linear(16, 32), nn.Parameter(torch.zeros(4, 32))
        self.norm1, self.qkv, self.out = nn.LayerNorm(32), nn.Linear(32, 96), nn.Linear(32, 32)
        self.norm2, self.ff = nn.LayerNorm(32), nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        n = len(x)
        h = self.embed(x.reshape(n, 2, 4, 2, 4).permute(0, 1, 3, 2, 4).reshape(n, 4, 16)) + self.pos
        q, k, v = self.qkv(self.norm1(h)).reshape(n, 4, 3, 2, 16).unbind(2)
        a = torch.softmax(torch.einsum("bihd,bjhd->bhij", q, k) / 4.0, -1)
        h = h + self.out(torch.einsum("bhij,bjhd->bihd", a, v).reshape(n, 4, 32))
        return self.head((h + self.ff(self.norm2(h))).mean(1))


def _mlp(d_in: int, d_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, d_out))


#: name: (data set, model, loss)
PRESENT = {
    "gru-digits": ("digits", GRURows, "ce"),
    "patch-digits": ("digits", Patches, "ce"),
    "mlp-cancer": ("cancer", lambda: _mlp(30, 2), "ce"),
    "mlp-diabetes": ("diabetes", lambda: _mlp(10, 1), "mse"),
}


def _loss(kind: str, out, y):
    return F.cross_entropy(out, y) if kind == "ce" else F.mse_loss(out.squeeze(-1), y)


def exact_at(model: nn.Module, X, Y, kind: str, b: int = 16, micro: int = 4) -> tuple[float, float]:
    """``(B_simple, row noise)`` over the data set at the model's parameters (every example's
    gradient): B_simple = tr(Σ)/|G|², and the standard deviation of one measured row's |G|²
    estimate over |G|² itself. A row of ``micro`` micro-batches of ``b`` examples drawn with
    replacement estimates |G|² by the mean of X_iᵀX_j over its pairs of micro-batch gradients (what
    the two-size formula reduces to), a U-statistic whose variance is
    2 tr(C²) / (m (m - 1)) + 4 GᵀCG / m with C = Σ / b and m = ``micro``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def one(p, x, y):
        return _loss(kind, functional_call(model, p, (x[None],)), y[None])

    per = vmap(grad(one), in_dims=(None, 0, 0))(params, X, Y)
    flat = torch.cat([v.reshape(len(X), -1) for v in per.values()], 1).double()
    n = len(flat)
    G = flat.mean(0)
    dev = flat - G
    g2 = float(G.pow(2).sum())
    tr = float(dev.pow(2).sum(1).mean())
    # tr(Σ²) = |Σ|_F², from the smaller of the two Gram matrices
    gram = dev @ dev.T if n <= dev.shape[1] else dev.T @ dev
    tr_sq = float(gram.pow(2).sum()) / n**2
    gsg = float((dev @ G).pow(2).mean())  # GᵀΣG
    var = 2 * tr_sq / b**2 / (micro * (micro - 1)) + 4 * gsg / b / micro
    return tr / g2, math.sqrt(var) / g2


def ema20(rows) -> np.ndarray:
    """A textbook baseline: the ratio of two 20-row EMAs (bias-corrected) of |G|² and tr(Σ), one weight per row."""
    from gradwidget.analysis.noise_scale import two_size_estimates

    g2, tr = two_size_estimates(rows["b_small"], rows["b_big"], rows["small_total"], rows["big_total"])
    a, mg, ms, out = 2 / 21, 0.0, 0.0, []
    for k, (g, t) in enumerate(zip(g2, tr), 1):
        mg, ms = (1 - a) * mg + a * g, (1 - a) * ms + a * t
        out.append(ms / mg if mg > 0 else np.nan)  # the bias corrections cancel in the ratio
    return np.array(out)


def measured_steps(steps: int) -> list[int]:
    """The steps the default Recorder measures: the first ``NOISE_MIN_ROWS``, then one in ``NOISE_EVERY``."""
    return [s for s in range(steps) if s < NOISE_MIN_ROWS or s % NOISE_EVERY == 0]


def present_run(name: str, seed: int, steps: int, b: int = 16, micro: int = 4) -> list[dict]:
    """One run of ``name``: per third, the exact B_simple at its last measured step, the estimate there."""
    data, make_model, kind = PRESENT[name]
    X, Y = tabular(data)
    torch.manual_seed(seed)
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + seed)
    measured = measured_steps(steps)
    at = {max(s for s in measured if s <= k * (steps - 1) // 3) for k in (1, 2, 3)}
    exact = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = Recorder(model, opt, histogram_every=0, trace_nonfinite=False)
    for s in range(steps):
        if s in at:
            exact[s] = exact_at(model, X, Y, kind, b, micro)
        opt.zero_grad()
        for _ in range(micro):
            idx = torch.randint(0, len(X), (b,), generator=gen)
            (_loss(kind, model(X[idx]), Y[idx]) / micro).backward()
        opt.step()
    rec.detach()
    ns = noise_scale(rec.run)
    assert ns is not None
    rows = rec.run.noise.window()
    rows = rows[np.isfinite(rows["b_small"])]
    before = ema20(rows)
    out = []
    for third, s in enumerate(sorted(at), 1):
        k, j = int(np.flatnonzero(ns.steps == s)[0]), int(np.flatnonzero(rows["step"] == s)[0])
        out.append(
            {
                "model": name,
                "seed": seed,
                "third": third,
                "step": s,
                "exact": exact[s][0],
                "row_noise": exact[s][1],
                "estimate": float(ns.b_simple[k]),
                "lo": float(ns.lo[k]),
                "hi": float(ns.hi[k]),
                "before": float(before[j]),
            }
        )
    return out


def present(models, seeds: int, steps: int) -> list[dict]:
    print(f"4 micro-batches of 16 per step, Adam lr 1e-3, {steps} steps, the default Recorder")
    print(
        "| model | seed | third (step) | exact B_simple | estimate | 95% interval | estimate / exact | 20-row EMA / exact "
        "| one row's sd of \\|G\\|² / \\|G\\|² |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for name in models:
        for seed in range(seeds):
            for r in present_run(name, seed, steps):
                rows.append(r)
                hi = f"{r['hi']:,.0f}" if np.isfinite(r["hi"]) else "inf"
                print(
                    f"| {name} | {seed} | {r['third']} ({r['step']}) | {r['exact']:,.0f} | {r['estimate']:,.0f} | "
                    f"{r['lo']:,.0f}–{hi} | {r['estimate'] / r['exact']:.2f} | {r['before'] / r['exact']:.2f} | "
                    f"{r['row_noise']:.2f} |",
                    flush=True,
                )
    # the rows a time constant of the default cadence holds, as independent rows: (1 + r) / (1 - r)
    # for weights falling by r = exp(-every / tau) from one row to the next
    fall = math.exp(-NOISE_EVERY / TAU_STEPS)
    held_rows = (1 + fall) / (1 - fall)
    print(
        "\n| model | third | median estimate / exact | within 1.5x | exact inside the 95% interval "
        f"| median 20-row EMA / exact | rows needed for \\|G\\|² within a third (the average holds {held_rows:.0f}) |"
    )
    print("| --- | --- | ---: | --- | ---: | ---: | ---: |")
    models_ok = 0
    for name in models:
        every = True
        for third in (1, 2, 3):
            sel = [r for r in rows if r["model"] == name and r["third"] == third]
            ratio = float(np.median([np.nan_to_num(r["estimate"] / r["exact"], nan=0.0) for r in sel]))
            old = float(np.median([np.nan_to_num(r["before"] / r["exact"], nan=0.0) for r in sel]))
            held = sum(r["lo"] <= r["exact"] <= r["hi"] for r in sel)
            ok = 1 / 1.5 <= ratio <= 1.5
            every = every and ok
            need = float(np.median([9 * r["row_noise"] ** 2 for r in sel]))
            print(
                f"| {name} | {third} | {ratio:.2f} | {'yes' if ok else 'no'} | {held}/{len(sel)} | {old:.2f} | {need:,.0f} |"
            )
        models_ok += every
    held = sum(r["lo"] <= r["exact"] <= r["hi"] for r in rows)
    print(
        f"\nmedian within 1.5x at every third: {models_ok} of {len(models)} models; the 95% interval held the exact value in {held} of {len(rows)}"
    )
    return rows


# --------------------------------------------------------------------------- the sweep
def steps_to(loss_target, X, Y, b, lr, max_steps, seed=0) -> int | None:
    """Steps an MLP needs to bring the full-data training loss to ``loss_target``, or None."""
    torch.manual_seed(seed)
    m = make("mlp")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    for s in range(1, max_steps + 1):
        idx = torch.randint(0, len(X), (b,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(m(X[idx]), Y[idx]).backward()
        opt.step()
        with torch.no_grad():
            loss = float(F.cross_entropy(m(X), Y))
        if not np.isfinite(loss) or loss > 50:
            return None
        if loss <= loss_target:
            return s
    return None


def tracked(target: float, b: int = 16, micro: int = 2, every: int = 25) -> None:
    """A reference run (``micro`` x ``b`` per step, accumulation, lr 0.3) to ``target``: the
    Recorder's live estimate against the exact B_simple at a few steps along the way."""
    X, Y = digits()
    torch.manual_seed(0)
    m = make("mlp")
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.SGD(m.parameters(), lr=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = Recorder(m, opt, histogram_every=0, trace_nonfinite=False)
    exact, step = [], 0
    while True:
        if step % every == 0:
            exact.append((step, exact_b_simple(m, X, Y)["b_simple"]))
        opt.zero_grad()
        for _ in range(micro):
            idx = torch.randint(0, len(X), (b,), generator=gen)
            (F.cross_entropy(m(X[idx]), Y[idx]) / micro).backward()
        opt.step()
        step += 1
        with torch.no_grad():
            if float(F.cross_entropy(m(X), Y)) <= target or step > 5000:
                break
    rec.detach()
    ns = noise_scale(rec.run)
    assert ns is not None
    print(f"reference run: {micro} x {b} per step, lr 0.3, {step} steps to training loss {target}")
    print("| step | exact B_simple | live estimate | 95% interval |")
    print("| ---: | ---: | ---: | ---: |")
    for s, ex in exact:
        k = int(np.searchsorted(ns.steps, s))
        if k < len(ns.steps):
            hi = f"{ns.hi[k]:.0f}" if np.isfinite(ns.hi[k]) else "inf"
            print(f"| {s} | {ex:.0f} | {ns.b_simple[k]:.0f} | {ns.lo[k]:.0f}-{hi} |")
    ex_all = np.array([e for _, e in exact])
    print(f"exact B_simple over the run: start {ex_all[0]:.0f}, median {np.median(ex_all):.0f}, end {ex_all[-1]:.0f}")


def sweep(target: float, batches, lrs, max_steps: int) -> None:
    """Steps to ``target`` per batch size (best learning rate of ``lrs``), and the critical batch
    size of McCandlish et al.'s model fitted to them: S(B) = S_min (1 + B_crit / B)."""
    X, Y = digits()
    print(f"target training loss {target} (full data); SGD, best learning rate per batch size of {lrs}")
    print("| batch | best lr | steps | examples | steps / steps at the batch before |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    got, prev = [], None
    for b in batches:
        best = None
        for lr in lrs:
            s = steps_to(target, X, Y, b, lr, max_steps if best is None else best[0])
            if s is not None and (best is None or s < best[0]):
                best = (s, lr)
        if best is None:
            print(f"| {b} | - | >{max_steps} | - | - |")
            continue
        s, lr = best
        got.append((b, s))
        ratio = f"{s / prev:.2f}" if prev else "-"
        prev = s
        print(f"| {b} | {lr} | {s} | {s * b} | {ratio} |", flush=True)
    B = np.array([b for b, _ in got], float)
    S = np.array([s for _, s in got], float)
    slope, icpt = np.polyfit(1 / B, S, 1)  # S = S_min + S_min B_crit / B
    print(f"fit S(B) = S_min (1 + B_crit/B): S_min {icpt:.1f} steps, B_crit {slope / icpt:.0f} examples")
    tracked(target)


# --------------------------------------------------------------------------- cost
def _timed(fn, n) -> float:
    """One block: the mean seconds of ``n`` calls of ``fn`` (work done one step in N is in it when
    ``n`` spans its period; a median over single steps would leave it out)."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def cost_rows(kind: str = "mlp", repeats: int = 12, micro: int = 4) -> None:
    """Step times, the median over interleaved blocks of each block's mean step: accumulation with no
    Recorder, with noise_scale off and on; one backward vs split_backward in two (both under a
    Recorder whose "auto" hooks went after the first step). A block is a whole period of what the
    Recorder does one step in N (update norms every 10 steps, the noise scale one in
    ``NOISE_EVERY``), after ``NOISE_MIN_ROWS`` untimed steps of a fresh Recorder (its set-up, and the
    noise scale's first rows, each step measured). ``kind``: "mlp"
    (digits, 64-512-512-10, batch 64) or "transformer" (bench/overhead.py's LM, 4 x d256, batch
    4 x 64 tokens)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if kind == "mlp":
        X, Y = digits()
        model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        b = 64

        def batch():
            idx = torch.randint(0, len(X), (b,), generator=gen)
            return X[idx], Y[idx]

        def loss_of(x, y):
            return F.cross_entropy(model(x), y)

        what = f"MLP 64-512-512-10, batch {b}"
    else:
        from overhead import make_model

        vocab, b, seq = 2000, 4, 64
        model = make_model(vocab=vocab)
        data = torch.randint(0, vocab, (64, seq + 1), generator=gen)

        def batch():
            t = data[torch.randint(0, len(data), (b,), generator=gen)]
            return t[:, :-1], t[:, 1:]

        def loss_of(x, y):
            return F.cross_entropy(model(x).flatten(0, 1), y.flatten())

        what = f"bench transformer (4 x d256), batch {b} x {seq} tokens"
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def accum_step():
        opt.zero_grad()
        for _ in range(micro):
            (loss_of(*batch()) / micro).backward()
        opt.step()

    def plain_step():
        opt.zero_grad()
        loss_of(*batch()).backward()
        opt.step()

    def split_step(rec):
        opt.zero_grad()
        rec.split_backward(loss_of, *batch())
        opt.step()

    kw = dict(histogram_every=0, trace_nonfinite=False, update_every=10)
    period = math.lcm(NOISE_EVERY, kw["update_every"])
    times: dict[str, list[float]] = {k: [] for k in ("bare", "off", "on", "plain", "split")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            times["bare"].append(_timed(accum_step, period))
            rec = Recorder(model, opt, noise_scale=False, **kw)
            for _ in range(NOISE_MIN_ROWS):
                accum_step()
            times["off"].append(_timed(accum_step, period))
            rec.detach()
            rec = Recorder(model, opt, noise_scale=True, **kw)
            for _ in range(NOISE_MIN_ROWS):  # its set-up and its first rows, all measured
                accum_step()
            times["on"].append(_timed(accum_step, period))
            rec.detach()
            rec = Recorder(model, opt, noise_scale="auto", **kw)
            plain_step()  # the first step: "auto" sees one batch size and removes its hooks
            times["plain"].append(_timed(plain_step, period))
            times["split"].append(_timed(lambda: split_step(rec), period))
            rec.detach()
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    n = sum(p.numel() for p in model.parameters())
    print(
        f"{what} ({n:,} parameters, {len(list(model.parameters()))} tensors), 1 thread, "
        f"{repeats} blocks of {period} steps each (the noise scale measured one step in {NOISE_EVERY} after its first {NOISE_MIN_ROWS})"
    )
    print("| step | median ms | ratio |")
    print("| --- | ---: | ---: |")
    print(f"| {micro} micro-batches, no Recorder | {med['bare']:.2f} | 1.00x |")
    print(f"| ... Recorder, noise_scale=False | {med['off']:.2f} | {med['off'] / med['bare']:.3f}x |")
    print(
        f"| ... Recorder, noise_scale=True | {med['on']:.2f} | {med['on'] / med['bare']:.3f}x "
        f"({med['on'] / med['off']:.3f}x the Recorder without it) |"
    )
    print(f"| one backward (Recorder, 'auto' unhooked) | {med['plain']:.2f} | 1.00x |")
    print(f"| split_backward, 2 halves | {med['split']:.2f} | {med['split'] / med['plain']:.3f}x the one backward |")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--b", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--trained", type=int, default=300)
    ap.add_argument("--models", default="logreg,mlp,cnn,gpt2")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--target", type=float, default=0.05)
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--present", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.present:
        models = [m for m in a.models.split(",") if m in PRESENT] or list(PRESENT)
        present(models, a.seeds, a.steps)
        return
    if a.sweep:
        sweep(a.target, [8, 16, 32, 64, 128, 256, 512, 1024, 2048], [0.1, 0.3, 1.0, 3.0, 10.0], 6000)
        return
    if a.cost:
        for kind in ("mlp", "transformer"):
            cost_rows(kind)
        return
    print(f"{a.micro} micro-batches of {a.b} per step ({a.micro * a.b} per step), {a.steps} steps, default cadence")
    print(
        "| model | parameters at | exact B_simple (median) | estimate (median) | rel. error (median) "
        "| mean abs rel. error | sd over seeds | exact within 95% interval | not yet measurable "
        f"| rel. error averaged over all {a.steps} steps (median ± sd) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    compare(a.models.split(","), a.seeds, a.steps, a.b, a.micro, a.trained)


if __name__ == "__main__":
    sys.exit(main())
