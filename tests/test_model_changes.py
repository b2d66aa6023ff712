"""Models and optimizers that change while training: parameters that appear, change or are
re-created are followed, or named in one warning where they cannot be; copies of the model carry no
Recorder; a new optimizer is followed; steps with no gradient at all are said, not silently empty."""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze
from gradwidget._warnings import GradwidgetWarning


class TinyLM(nn.Module):
    """Embedding, a transformer encoder layer, a head: the shape of a model fine-tuned in phases."""

    def __init__(self, vocab: int = 24, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.enc = nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


def _batch(i: int, vocab: int = 24):
    g = torch.Generator().manual_seed(i)
    return torch.randint(0, vocab, (4, 7), generator=g)


def _step(model, opt, i, vocab=24):
    x = _batch(i, vocab)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    opt.step()
    return loss


def test_progressive_unfreezing_is_followed():
    torch.manual_seed(0)
    model = TinyLM()
    for p in model.enc.parameters():
        p.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    rec = Recorder(model, opt, update_every=1, trace_nonfinite=False)
    for i in range(8):
        if i == 4:  # unfreeze the encoder and give it to the optimizer
            for p in model.enc.parameters():
                p.requires_grad_(True)
            opt.add_param_group({"params": list(model.enc.parameters()), "lr": 1e-4})
        _step(model, opt, i)
    rec.detach()
    run = rec.run
    enc = [j for j, name in enumerate(run.layer_names) if name.startswith("enc.")]
    assert all(run.layers[j].status == "trainable" for j in enc)
    assert np.isnan(run.metric("grad_norm")[:4, enc]).all()
    assert np.isfinite(run.metric("grad_norm")[4:, enc]).all()
    assert np.isfinite(run.metric("update_norm")[4:, enc]).all()  # measured once it trains
    assert "frozen" not in {r.cause for r in analyze(run).diagnoses}


def test_a_gradient_left_on_a_frozen_parameter_is_no_unfreezing():
    """peft freezes a trained base without clearing its ``.grad``: those stale gradients are read at
    every step, yet the base stays frozen (not "trainable, not in the optimizer")."""
    torch.manual_seed(0)
    model = TinyLM()
    _step(model, torch.optim.SGD(model.parameters(), lr=0.1), 0)  # every parameter now has a .grad
    model.emb.requires_grad_(False)
    model.enc.requires_grad_(False)
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)  # its zero_grad leaves the others' .grad
    rec = Recorder(model, opt, trace_nonfinite=False)
    for i in range(1, 5):
        _step(model, opt, i)
    rec.detach()
    status = {info.name: info.status for info in rec.run.layers}
    assert status["emb.weight"] == "frozen" and status["head.weight"] == "trainable"
    assert "not_in_optimizer" not in {d.cause for d in analyze(rec.run).diagnoses}


def test_a_layer_recreated_with_its_shape_is_followed_with_the_new_optimizer():
    torch.manual_seed(0)
    model = TinyLM()
    opt = first = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, update_every=1, trace_nonfinite=False)
    grads = []
    for i in range(6):
        if i == 3:  # re-initialise the head and start a new phase with a new optimizer
            model.head = nn.Linear(16, 24)
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
        _step(model, opt, i)
        grads.append(float(model.head.weight.grad.norm()))
    rec.detach()
    run = rec.run
    assert run.steps.tolist() == list(range(6))  # no step lost to the new optimizer
    j = run.layer_index("head.weight")
    np.testing.assert_allclose(run.metric("grad_norm")[:, j], grads, rtol=1e-5)
    assert np.isfinite(run.metric("update_norm")[:, j]).all()
    assert rec.optimizer is opt and not first._optimizer_step_pre_hooks and "zero_grad" not in first.__dict__


def test_layers_that_cannot_be_followed_are_named_once_and_record_nothing_stale():
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, trace_nonfinite=False)
    _step(model, opt, 0)
    model.head = nn.Linear(16, 30)  # a bigger vocabulary: a new shape
    model.extra = nn.Linear(30, 30)  # a new layer
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.warns(
        GradwidgetWarning, match=r"changed while training \(new: extra.weight, extra.bias; reshaped: head"
    ):
        _step(model, opt, 1, vocab=24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(model, opt, 2, vocab=24)  # said once
    rec.detach()
    run = rec.run
    j = run.layer_index("head.weight")
    assert np.isfinite(run.metric("grad_norm")[0, j]) and np.isnan(run.metric("grad_norm")[1:, j]).all()
    assert np.isfinite(run.metric("grad_norm")[1:, run.layer_index("emb.weight")]).all()


def test_lazy_modules_record_once_their_first_forward_shaped_them():
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyConv1d(6, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, update_every=1, trace_nonfinite=False)
    torch.save(model, io.BytesIO())  # before the first step too
    x, y = torch.randn(5, 2, 10), torch.randint(0, 4, (5,))
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    rec.detach()
    run = rec.run
    shapes = {info.name: tuple(info.shape) for info in run.layers}
    assert shapes == {"0.weight": (6, 2, 3), "0.bias": (6,), "3.weight": (4, 48), "3.bias": (4,)}
    assert np.isfinite(run.metric("grad_norm")).all() and np.isfinite(run.metric("update_norm")).all()


def test_a_new_optimizer_says_what_it_holds_beyond_the_model():
    torch.manual_seed(0)
    model = TinyLM()
    temperature = nn.Parameter(torch.ones(()))  # a learnable loss temperature: not the model's
    opt = torch.optim.SGD([*model.parameters(), temperature], lr=0.1)
    rec = Recorder(model, opt, trace_nonfinite=False)
    _step(model, opt, 0)
    assert rec.optimizer_extra is not None and rec.run.meta["optimizer_extra"]["tensors"] == 1
    opt = torch.optim.SGD(model.parameters(), lr=0.05)  # the next phase: the model's parameters only
    for i in range(1, 3):
        _step(model, opt, i)
    rec.detach()
    assert rec.optimizer is opt and rec.optimizer_extra is None and "optimizer_extra" not in rec.run.meta


@pytest.mark.parametrize("mode", [True, "auto"])  # "auto": the replay's hooks on the root module too
def test_copies_of_the_model_carry_no_recorder(mode):
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, trace_nonfinite=mode)
    buf = io.BytesIO()
    torch.save(model, buf)  # before the first step: pickles
    ema = copy.deepcopy(model)  # an EMA copy
    for i in range(4):
        _step(model, opt, i)
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), model.parameters()):
                pe.mul_(0.9).add_(p, alpha=0.1)
        ema_opt = torch.optim.SGD(ema.parameters(), lr=0.0)
        _step(ema, ema_opt, 100 + i)  # the copy trains too: none of it is recorded
    rec.detach()
    assert rec.run.steps.tolist() == [0, 1, 2, 3]
    assert rec.optimizer is opt  # the copy's optimizer holds none of the model's parameters
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    loaded(_batch(0)).sum().backward()  # the loaded model runs, with no hook of ours doing anything
    for m in list(ema.modules()) + list(loaded.modules()):
        for h in list(m._forward_hooks.values()) + list(m._forward_pre_hooks.values()):
            assert getattr(h, "fn", None) is None or h.fn.__name__ == "_nothing"


def test_two_optimizers_over_parts_of_one_model_each_keep_their_part():
    torch.manual_seed(0)
    model = TinyLM()
    matrices = [p for p in model.parameters() if p.ndim >= 2]
    vectors = [p for p in model.parameters() if p.ndim < 2]
    opt_m, opt_v = torch.optim.AdamW(matrices, lr=1e-3), torch.optim.SGD(vectors, lr=1e-2)
    rec = Recorder(model, opt_m, trace_nonfinite=False)
    for i in range(5):
        x = _batch(i)
        opt_m.zero_grad()
        opt_v.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
        opt_m.step()
        opt_v.step()
    rec.detach()
    assert rec.optimizer is opt_m and rec.run.steps.tolist() == [0, 1, 2, 3, 4]


def test_a_recorder_never_detached_lives_no_longer_than_its_model():
    import gc
    import weakref

    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = weakref.ref(Recorder(model, opt, trace_nonfinite=False))
    _step(model, opt, 0)
    del model, opt
    gc.collect()
    assert ref() is None


def test_steps_with_no_gradient_on_the_model_are_said_once():
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, trace_nonfinite=False)
    copies = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    with pytest.warns(GradwidgetWarning, match="none of its parameters has a gradient"):
        for i in range(3):
            x = _batch(i)
            out = torch.func.functional_call(model, copies, (x,))
            nn.functional.cross_entropy(out.flatten(0, 1), x.flatten()).backward()
            opt.step()
    rec.detach()
    assert rec.run is None
