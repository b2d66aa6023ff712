"""The torch Recorder on real models: exact norms, pathologies, frozen/unused layers, accumulation."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator

from gradwidget.collect.torch import Recorder
from gradwidget.run import N_BINS
from gradwidget.outputs import summary


def mlp(depth=8, width=32, act=nn.Sigmoid, d_in=10):
    layers = [nn.Linear(d_in, width), act()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), act()]
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers)


def train(model, opt, rec, steps=5, lr_batch=32, seed=0, x=None, y=None):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        xb = torch.randn(lr_batch, model[0].in_features, generator=g) if x is None else x
        yb = torch.randn(lr_batch, 1, generator=g) if y is None else y
        opt.zero_grad()
        loss = ((model(xb) - yb) ** 2).mean()
        loss.backward()
        rec.log(loss=loss)
        opt.step()


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu-kernels", "accelerator-kernels"])
def test_norms_equal_grad_norm_exactly_for_every_layer(accelerator, monkeypatch):
    as_accelerator(monkeypatch, accelerator)
    torch.manual_seed(0)
    model = mlp(4, act=nn.ReLU)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, histogram_every=1) as rec:
        x, y = torch.randn(16, 10), torch.randn(16, 1)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        expect = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    run = rec.run
    for name, g in expect.items():
        j = run.layer_index(name)
        assert abs(run.metric("grad_norm")[0, j] - g.norm().item()) <= 1e-6 * max(1, g.norm().item())
        assert run.metric("max_abs")[0, j] == pytest.approx(g.abs().max().item(), rel=1e-6)
        assert run.metric("mean_abs")[0, j] == pytest.approx(g.abs().mean().item(), rel=1e-5)
        assert run.metric("std")[0, j] == pytest.approx(g.std(unbiased=False).item(), rel=1e-3, abs=1e-9)
        assert run.metric("zero_frac")[0, j] == pytest.approx((g == 0).float().mean().item())
        assert run.metric("nonfinite")[0, j] == 0
        # the histogram counts every non-zero entry once, in the octave bin of |g|
        from gradwidget.collect.arrays import log_hist

        np.testing.assert_array_equal(run.hist[0, j], log_hist(g.numpy()))
        assert run.hist[0, j].sum() == int((g != 0).sum())
    total = math.sqrt(sum(float(g.norm()) ** 2 for g in expect.values()))
    assert run.scalar("global_norm")[0] == pytest.approx(total, rel=1e-6)


def test_layer_order_follows_the_backward_graph_not_names():
    # names sort as 'layer10' < 'layer2'; registration order differs from data flow order
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer10 = nn.Linear(4, 1)  # used last
            self.layer2 = nn.Linear(4, 4)  # used first
            self.layer3 = nn.Linear(4, 4)

        def forward(self, x):
            return self.layer10(torch.relu(self.layer3(torch.relu(self.layer2(x)))))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt) as rec:
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    mods = [info.module for info in rec.run.layers]
    assert mods.index("layer2") < mods.index("layer3") < mods.index("layer10")
    # edges follow data flow: layer2 -> layer3 -> layer10, never layer2 -> layer10
    pairs = {(rec.run.layers[a].module, rec.run.layers[b].module) for a, b in rec.run.edges}
    assert pairs == {("layer2", "layer3"), ("layer3", "layer10")}


def test_deep_sigmoid_stack_flags_early_layers_vanishing():
    torch.manual_seed(0)
    model = mlp(12, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(model, opt) as rec:
        train(model, opt, rec, steps=5)
    van = rec.run.vanishing().all(axis=0)
    names = rec.run.layer_names
    assert van[names.index("0.weight")]
    assert not van[names.index("22.weight")]
    assert summary(rec.run).layers_with_vanishing_grads[0] == "0.weight"


def test_blown_up_learning_rate_flags_exploding():
    torch.manual_seed(0)
    model = mlp(3, 32, act=nn.ReLU)
    opt = torch.optim.SGD(model.parameters(), lr=5.0)
    x, y = torch.randn(64, 10) * 10, torch.randn(64, 1) * 10
    with Recorder(model, opt) as rec:
        with torch.no_grad():
            for m in model:
                if isinstance(m, nn.Linear):
                    m.weight.mul_(4)
        train(model, opt, rec, steps=6, x=x, y=y)
    assert rec.run.exploding().any()
    s = summary(rec.run)
    # the blow-up ends in NaN: the summary lists the layers the diagnoses name (NaN/Inf here, the
    # exploding symptom folded into its cause), and the damage makes it Critical
    assert s.layers_with_nonfinite_grads or s.layers_with_exploding_grads
    assert s.overall_health.value == "Critical"


def test_frozen_and_unused_parameters_are_listed_and_marked():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 1)
            self.spare = nn.Linear(4, 4)  # never used in forward

        def forward(self, x):
            return self.b(self.a(x))

    model = Net()
    model.a.weight.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    with Recorder(model, opt) as rec:
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    run = rec.run
    status = {info.name: info.status for info in run.layers}
    assert status == {
        "a.weight": "frozen",
        "a.bias": "trainable",
        "b.weight": "trainable",
        "b.bias": "trainable",
        "spare.weight": "unused",
        "spare.bias": "unused",
    }
    j = run.layer_index("a.weight")
    assert np.isnan(run.metric("grad_norm")[:, j]).all()
    assert np.isfinite(run.metric("weight_norm")[:, j]).all()
    assert not run.vanishing()[:, j].any()


def test_accumulated_micro_batches_equal_one_big_batch():
    torch.manual_seed(0)
    big = mlp(4)
    small = mlp(4)
    small.load_state_dict(big.state_dict())
    x, y = torch.randn(32, 10), torch.randn(32, 1)
    o1 = torch.optim.SGD(big.parameters(), lr=0.1)
    o2 = torch.optim.SGD(small.parameters(), lr=0.1)
    with Recorder(big, o1) as r1, Recorder(small, o2) as r2:
        for _ in range(2):
            o1.zero_grad()
            ((big(x) - y) ** 2).mean().backward()
            o1.step()
            o2.zero_grad()
            for xb, yb in zip(x.chunk(4), y.chunk(4)):
                (((small(xb) - yb) ** 2).mean() / 4).backward()
            o2.step()
    assert r1.run.n_steps == r2.run.n_steps == 2
    np.testing.assert_allclose(r1.run.metric("grad_norm"), r2.run.metric("grad_norm"), rtol=1e-5, atol=1e-7)


def test_injected_nan_is_counted_and_flagged_without_crashing():
    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(model, opt) as rec:
        opt.zero_grad()
        model(torch.randn(4, 10)).sum().backward()
        model[2].weight.grad[0, :3] = float("nan")
        model[2].weight.grad[1, 0] = float("inf")
        opt.step()
    run = rec.run
    j = run.layer_index("2.weight")
    assert run.metric("nonfinite")[0, j] == 4
    assert run.nonfinite()[0, j] and run.exploding()[0, j]
    assert run.metric("nonfinite")[0].sum() == 4
    assert not math.isfinite(run.scalar("global_norm")[0])
    assert "2.weight" in summary(run).layers_with_nonfinite_grads


def test_update_norm_is_the_real_parameter_change():
    model = mlp(3)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    with Recorder(model, opt, update_every=2) as rec:
        for i in range(3):
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            opt.zero_grad()
            model(torch.randn(4, 10)).sum().backward()
            opt.step()
    # measured on recorded steps 0 and 2, NaN on step 1
    assert np.isnan(rec.run.metric("update_norm")[1]).all()
    assert np.isfinite(rec.run.metric("update_norm")[[0, 2]]).all()
    for n, p in model.named_parameters():
        j = rec.run.layer_index(n)
        assert rec.run.metric("update_norm")[2, j] == pytest.approx((p.detach() - before[n]).norm().item(), rel=1e-5)
        assert rec.run.metric("weight_norm")[2, j] == pytest.approx(before[n].norm().item(), rel=1e-6)
    assert rec.run.scalar("lr")[0] == pytest.approx(1e-2)


def test_without_optimizer_each_backward_is_a_step():
    model = mlp(3)
    with Recorder(model) as rec:
        for _ in range(3):
            model.zero_grad()
            model(torch.randn(4, 10)).sum().backward()
        with torch.no_grad():  # evaluation records nothing
            model(torch.randn(4, 10))
        model.eval()
        with torch.no_grad():
            model(torch.randn(4, 10))
    assert rec.run.n_steps == 3
    assert np.isnan(rec.run.metric("update_norm")).all()


def test_every_and_user_steps_and_detach():
    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt, every=2)
    for i in range(6):
        opt.zero_grad()
        model(torch.randn(4, 10)).sum().backward()
        rec.log(step=100 + i)
        opt.step()
    assert rec.run.steps.tolist() == [100, 102, 104]
    rec.detach()
    assert not rec.attached
    for p in model.parameters():
        assert not p._post_accumulate_grad_hooks
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert not model._forward_hooks and not model._forward_pre_hooks
    n = rec.run.n_steps
    opt.zero_grad()
    model(torch.randn(4, 10)).sum().backward()
    opt.step()
    assert rec.run.n_steps == n


def test_log_dir_is_written_while_training(tmp_path):
    from gradwidget.storage import load_run

    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt, log_dir=tmp_path / "run", histogram_every=2, update_every=1)
    train(model, opt, rec, steps=3)
    mid = load_run(tmp_path / "run")
    assert mid.n_steps == 3 and mid.hist.shape == (2, 6, N_BINS)
    train(model, opt, rec, steps=2)
    rec.detach()
    done = load_run(tmp_path / "run")
    assert done.n_steps == 5
    np.testing.assert_array_equal(done.metric("update_norm"), rec.run.metric("update_norm"))
    np.testing.assert_array_equal(done.edges, rec.run.edges)
    assert len(done.edges) > 0


def test_transformer_layers_are_recorded_in_graph_order():
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0), 2, enable_nested_tensor=False
    )
    model = nn.Sequential(enc, nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Recorder(model, opt) as rec:
        opt.zero_grad()
        model(torch.randn(2, 5, 16)).sum().backward()
        opt.step()
    names = rec.run.layer_names
    assert names.index("0.layers.0.self_attn.in_proj_weight") < names.index("0.layers.1.self_attn.in_proj_weight")
    assert names[-1].startswith("1.")
    assert len(rec.run.edges) > 0
    assert np.isfinite(rec.run.metric("grad_norm")).all()


@pytest.mark.parametrize(
    "bad,err,match",
    [
        ("notmodule", TypeError, "torch.nn.Module"),
        ("foreign_opt", ValueError, "holds none of this"),
        ("not_opt", TypeError, "torch.optim.Optimizer"),
        ("every", ValueError, "every"),
        ("no_params", ValueError, "no parameters"),
    ],
)
def test_bad_arguments_give_clear_errors(bad, err, match):
    model = mlp(3)
    with pytest.raises(err, match=match):
        if bad == "notmodule":
            Recorder(lambda x: x)
        elif bad == "foreign_opt":
            Recorder(model, torch.optim.SGD(mlp(3).parameters(), lr=0.1))
        elif bad == "not_opt":
            Recorder(model, optimizer="adam")
        elif bad == "every":
            Recorder(model, every=0)
        else:
            Recorder(nn.ReLU())


@pytest.mark.slow
def test_works_with_torch_compile():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt) as rec:
        compiled = torch.compile(model)
        for _ in range(3):
            opt.zero_grad()
            compiled(torch.randn(4, 8)).sum().backward()
            opt.step()
        expect = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    assert rec.run.n_steps == 3
    for n, v in expect.items():
        assert rec.run.metric("grad_norm")[-1, rec.run.layer_index(n)] == pytest.approx(v, rel=1e-6)


def test_default_window_fits_the_memory_budget():
    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, memory_budget=1 << 20, histogram_every=1) as rec:
        train(model, opt, rec, steps=1)
    # 6 layers: 40 B of metrics + 512 B of histogram per layer-step -> ~300 steps fit in 1 MiB
    assert rec.run.max_steps == 1000  # the floor
    with Recorder(model, opt, memory_budget=64 << 20) as rec2:
        train(model, opt, rec2, steps=1)
    per_step = 40 * 6 + 32 + 512 * 6 / 10  # float32 metrics and a float64 non-finite count; uint64 histograms
    assert rec2.run.max_steps == int((64 << 20) / (2 * per_step))
    with pytest.raises(ValueError, match="max_steps"):
        Recorder(model, max_steps=0)


def test_amp_grad_scaler_records_unscaled_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with Recorder(model, opt) as rec:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaled = {n: p.grad.norm().item() for n, p in model.named_parameters()}
        scaler.step(opt)
        scaler.update()
    for n, v in scaled.items():  # the optimizer (and so the recorder) sees gradients / 1024
        assert rec.run.metric("grad_norm")[0, rec.run.layer_index(n)] == pytest.approx(v / 1024, rel=1e-5)
