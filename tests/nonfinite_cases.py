"""Models that go non-finite at a known module, step and pass: shared by tests/test_nonfinite.py
and bench/nonfinite.py (which also asks torch.autograd.detect_anomaly where each one started).

Each case trains a few steps with SGD; at step ``BAD`` its data (or weights) make the named module
produce the first NaN/Inf, and ``expected`` is (module path, step, phase).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gradwidget.collect.torch import Recorder

STEPS, BAD = 5, 3


class Normalize(nn.Module):
    """x / sum(x): 0/0 = NaN in the forward when a row is all zeros (no parameters)."""

    def forward(self, x):
        return x / x.sum(-1, keepdim=True)


class RMS(nn.Module):
    """sqrt(mean(x^2)): finite in the forward at an all-zero row (sqrt(0) = 0), NaN in the backward
    (d sqrt(u)/du = inf at 0, times du/dx = 0)."""

    def forward(self, x):
        return torch.sqrt((x * x).mean(-1, keepdim=True))


class Square(nn.Module):
    def forward(self, x):
        return x * x


class ForwardNet(nn.Module):
    """A parameter-free module in the middle makes NaN in the forward."""

    def __init__(self, checkpointed=False, inplace=False):
        super().__init__()
        self.stem = nn.Linear(4, 16)
        self.block = nn.Sequential(nn.ReLU(inplace=inplace), Normalize())
        self.head = nn.Linear(16, 2)
        self.checkpointed = checkpointed
        with torch.no_grad():
            self.stem.weight.uniform_(0.1, 0.5)
            self.stem.bias.zero_()

    def forward(self, x):
        h = self.stem(x)
        h = checkpoint(self.block, h, use_reentrant=False) if self.checkpointed else self.block(h)
        return self.head(h)


class BackwardNet(nn.Module):
    """A parameter-free module whose forward stays finite makes NaN in the backward."""

    def __init__(self, checkpointed=False):
        super().__init__()
        self.stem = nn.Linear(4, 8, bias=False)
        self.rms = RMS()
        self.head = nn.Linear(9, 1)
        self.checkpointed = checkpointed

    def forward(self, x):
        h = self.stem(x)
        r = checkpoint(self.rms, h, use_reentrant=False) if self.checkpointed else self.rms(h)
        return self.head(torch.cat([h, r], -1))


class TwiceNet(nn.Module):
    """One module called twice: only its second call makes the NaN."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.norm = Normalize()
        self.act = nn.ReLU()
        with torch.no_grad():
            for m in (self.a, self.b):
                m.weight.uniform_(0.1, 0.5)
                m.bias.zero_()

    def forward(self, x):
        h = self.norm(self.a(x).abs() + 1)  # always finite
        return self.head(self.norm(self.act(self.b(h) * x[:, :1])))  # zero when x[:, 0] == 0


class BF16Net(nn.Module):
    """Under bf16 autocast, a linear layer whose weights grew overflows to Inf."""

    def __init__(self):
        super().__init__()
        self.lin1, self.lin2, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.head(self.act(self.lin2(self.lin1(x))))


@dataclass
class Case:
    make: Callable[[], nn.Module]
    #: (module, step, phase) the tracer should name
    expected: tuple
    data: Callable[[bool], torch.Tensor] = lambda bad: torch.rand(8, 4) + 0.1
    loss: Callable = lambda out, bad: out.float().pow(2).mean()
    before_bad: Callable | None = None  # change the model just before the bad step
    autocast: bool = False
    lr: float = 1e-3


def _bce_saturated(out, bad):
    """Binary cross entropy written by hand: log(1 - p) = log(0) once the sigmoid saturates to 1.0."""
    p = torch.sigmoid(out + (100.0 if bad else 0.0))
    return -(torch.log(1 - p)).mean()


def _grow(path):
    def f(model):
        with torch.no_grad():
            model.get_submodule(path).weight.mul_(1e36)

    return f


def _hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0
    )
    return GPT2LMHeadModel(cfg)


def _hf_data(bad):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 12), generator=g)


CASES: dict[str, Case] = {
    "forward, parameter-free": Case(
        ForwardNet, ("block.1", BAD, "forward"), data=lambda bad: -torch.ones(8, 4) if bad else torch.rand(8, 4) + 0.1
    ),
    "backward only, sqrt(0)": Case(
        BackwardNet, ("rms", BAD, "backward"), data=lambda bad: torch.zeros(8, 4) if bad else torch.rand(8, 4) + 0.1
    ),
    "loss, log(0)": Case(
        lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
        ("", BAD, "loss"),
        data=lambda bad: torch.rand(8, 4) + 2.0,
        loss=_bce_saturated,
    ),
    "bf16 autocast, Inf": Case(
        BF16Net,
        ("lin2", BAD, "forward"),
        autocast=True,
        before_bad=_grow("lin2"),
        data=lambda bad: torch.rand(8, 4) * (1e4 if bad else 1.0),
    ),
    # c_fc's weights grew 1e36x: the residual stream holds ~1e33, finite, until the final LayerNorm
    # squares it (its variance overflows: inf / inf = NaN)
    "Hugging Face GPT-2": Case(
        _hf_gpt2, ("transformer.ln_f", BAD, "forward"), data=_hf_data, before_bad=_grow("transformer.h.1.mlp.c_fc")
    ),
    "module called twice": Case(
        TwiceNet,
        ("norm", BAD, "forward"),
        data=lambda bad: torch.cat([torch.zeros(8, 1) if bad else torch.ones(8, 1), torch.rand(8, 3)], 1),
    ),
    "in-place ReLU": Case(
        lambda: ForwardNet(inplace=True),
        ("block.1", BAD, "forward"),
        data=lambda bad: -torch.ones(8, 4) if bad else torch.rand(8, 4) + 0.1,
    ),
    "checkpoint, forward": Case(
        lambda: ForwardNet(checkpointed=True),
        ("block.1", BAD, "forward"),
        data=lambda bad: -torch.ones(8, 4) if bad else torch.rand(8, 4) + 0.1,
    ),
    "checkpoint, backward": Case(
        lambda: BackwardNet(checkpointed=True),
        ("rms", BAD, "backward"),
        data=lambda bad: torch.zeros(8, 4) if bad else torch.rand(8, 4) + 0.1,
    ),
}


def _forward_loss(model, case, i, device="cpu"):
    x = case.data(i == BAD).to(device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=case.autocast):
        if isinstance(x, torch.Tensor) and x.dtype == torch.long:  # a language model: loss inside
            return model(input_ids=x, labels=x).loss
        return case.loss(model(x), i == BAD)


def train(case: Case, steps: int = STEPS, device="cpu", **recorder_kw):
    """Train ``case`` for ``steps`` steps under a Recorder on ``device`` (bench/gpu.py: CUDA); its
    run's ``nonfinite_origin``."""
    torch.manual_seed(0)
    model = case.make().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    rec = Recorder(model, opt, **recorder_kw)
    for i in range(steps):
        if i == BAD and case.before_bad is not None:
            case.before_bad(model)
        opt.zero_grad()
        loss = _forward_loss(model, case, i, device)
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    train.last = rec
    return rec.run.nonfinite_origin


def anomaly_module(case: Case) -> str | None:
    """The module torch.autograd.detect_anomaly(check_nan=True) points at: the innermost module
    whose ``forward`` appears in the forward traceback it prints with its error (its path when
    one instance of that class is in the model, else the class name), or None if no error."""
    torch.manual_seed(0)
    model = case.make()
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)
    where = {}
    for path, m in model.named_modules():
        fn = type(m).forward
        try:
            lines, first = inspect.getsourcelines(fn)
        except (OSError, TypeError):
            continue
        key = (inspect.getsourcefile(fn), first, first + len(lines))
        where.setdefault(key, []).append(path)
    for i in range(STEPS):
        if i == BAD and case.before_bad is not None:
            case.before_bad(model)
        opt.zero_grad()
        with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly(check_nan=True):
            warnings.simplefilter("always")
            try:
                _forward_loss(model, case, i).backward()
            except RuntimeError as e:
                if "nan" not in str(e).lower():
                    raise
                trace = "\n".join(str(w.message) for w in caught if "Traceback of forward call" in str(w.message))
                frames = re.findall(r'File "([^"]+)", line (\d+), in forward', trace)
                for file, line in reversed(frames):
                    for (f, lo, hi), paths in where.items():
                        if f == file and lo <= int(line) < hi:
                            return paths[0] if len(paths) == 1 else f"{type(model.get_submodule(paths[0])).__name__}"
                return "(no module: " + str(e).split(".")[0] + ")"
        opt.step()
    return None
