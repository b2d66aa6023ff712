"""Many small tensors are stacked by shape and reduced together (collect/_groups.py):
every statistic stays the per-tensor one, and the plan follows gradients that come and go."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator

from gradwidget.collect import _fused
from gradwidget.collect._groups import STACK_NUMEL, Plan, grad_of
from gradwidget.collect.arrays import log_hist
from gradwidget.collect.torch import Recorder


CPU32 = (torch.device("cpu"), torch.float32)


class Mixed(nn.Module):
    """Same-shape tiny layers (stacked), one large layer, a float64 pair, a sparse embedding, and a
    branch used on odd calls only (its gradients come and go)."""

    def __init__(self, n=12):
        super().__init__()
        self.emb = nn.Embedding(20, 3, sparse=True)
        self.tiny = nn.ModuleList(nn.Linear(3, 3) for _ in range(n))
        self.big = nn.Linear(3, 2000)  # 6,000 entries: past STACK_NUMEL, kept per tensor
        self.head = nn.Linear(2000, 3)
        self.dbl = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)).double()
        self.odd = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, idx):
        h = self.emb(idx)
        for m in self.tiny:
            h = torch.tanh(m(h))
        h = self.head(torch.relu(self.big(h)))
        h = h + self.dbl(h.double()).float()
        self.calls += 1
        return self.odd(h) if self.calls % 2 else h


def reference(model):
    return {
        n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).detach().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


@pytest.fixture(params=["stacked", "fused"])
def grouping(request, monkeypatch):
    """Small tensors of a shape stacked (CPU's eager kernels), or read one by one by the fused
    kernel (the accelerator's path, in Triton's interpreter where it runs)."""
    if request.param == "fused":
        as_accelerator(monkeypatch)
    return request.param


def test_every_statistic_equals_the_per_tensor_one_across_stacks_and_the_rest(grouping):
    assert 6000 > STACK_NUMEL >= 9
    torch.manual_seed(0)
    model = Mixed()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    seen, before, after = [], [], []
    with Recorder(model, opt, histogram_every=1, update_every=1) as rec:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randint(0, 20, (5,))).square().mean().backward()
            seen.append(reference(model))
            before.append({n: p.detach().clone() for n, p in model.named_parameters()})
            opt.step()
            after.append({n: p.detach().clone() for n, p in model.named_parameters()})
        stacks = {len(cols): owners[0].dtype for cols, owners in rec._stats._gplan.stacks}
    if grouping == "stacked" or not _fused.takes(*CPU32):
        assert sorted(stacks)[-2:] == [12, 13]  # the tiny weights; their biases with the head's
    else:  # the fused kernel reads every float32 group: only the float64 ones are stacked
        assert set(stacks.values()) == {torch.float64}
    run = rec.run
    for s, grads in enumerate(seen):
        for name in before[s]:
            j = run.layer_index(name)
            if name not in grads:  # odd.* on even calls: no gradient, no statistic, no update
                assert name.startswith("odd.") and s % 2 == 1
                assert np.isnan(run.metric("grad_norm")[s, j]) and np.isnan(run.metric("update_norm")[s, j])
                assert run.hist[s, j].sum() == 0
                continue
            g = grads[name].double()
            assert run.metric("grad_norm")[s, j] == pytest.approx(g.norm().item(), rel=1e-6)
            assert run.metric("max_abs")[s, j] == pytest.approx(g.abs().max().item(), rel=1e-6)
            assert run.metric("mean_abs")[s, j] == pytest.approx(g.abs().mean().item(), rel=1e-5)
            assert run.metric("std")[s, j] == pytest.approx(g.std(unbiased=False).item(), rel=1e-3, abs=1e-9)
            assert run.metric("zero_frac")[s, j] == pytest.approx((g == 0).double().mean().item())
            assert run.metric("nonfinite")[s, j] == 0
            np.testing.assert_array_equal(run.hist[s, j], log_hist(grads[name].float().numpy()))
            w = before[s][name].double()
            assert run.metric("weight_norm")[s, j] == pytest.approx(w.norm().item(), rel=1e-6)
            du = (after[s][name].double() - w).norm().item()
            assert run.metric("update_norm")[s, j] == pytest.approx(du, rel=1e-4, abs=1e-9)
    total = math.sqrt(sum(float(g.double().norm()) ** 2 for g in seen[-1].values()))
    assert run.scalar("global_norm")[-1] == pytest.approx(total, rel=1e-6)


def test_a_nonfinite_entry_in_a_stacked_tensor_is_counted_there_only(grouping):
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(6)])
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(model, opt, histogram_every=1) as rec:
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        model[2].weight.grad[0, :2] = float("nan")
        model[2].weight.grad[3, 3] = float("-inf")
        expect = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    run = rec.run
    j = run.layer_index("2.weight")
    assert run.metric("nonfinite")[0, j] == 3 and run.metric("max_abs")[0, j] == math.inf
    assert run.metric("nonfinite")[0].sum() == 3
    for name, g in expect.items():
        if name != "2.weight":
            assert run.metric("grad_norm")[0, run.layer_index(name)] == pytest.approx(g.norm().item(), rel=1e-6)


def test_half_precision_stacks_accumulate_in_float32():
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(3)]).half()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with Recorder(model, opt, trace_nonfinite=False) as rec:
        opt.zero_grad()
        model(torch.randn(2, 64).half()).float().sum().backward()
        for p in model.parameters():
            p.grad.fill_(300.0)  # a float16 sum of the 4,096 entries would overflow
        opt.step()
    run = rec.run
    j = run.layer_index("1.weight")
    assert run.metric("grad_norm")[0, j] == pytest.approx(300.0 * 64, rel=1e-3)
    assert run.metric("mean_abs")[0, j] == pytest.approx(300.0, rel=1e-3)
    assert run.metric("nonfinite")[0, j] == 0 and run.metric("std")[0, j] == pytest.approx(0, abs=1e-2)


def test_the_plan_follows_gradients_set_to_none_or_moved_between_steps(grouping):
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(8)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with Recorder(model, opt, trace_nonfinite=False) as rec:
        for s in range(4):
            opt.zero_grad()
            model(torch.randn(5, 2)).sum().backward()
            if s == 1:
                model[3].weight.grad = None  # gone from a stack: planned again
            if s == 2:
                model[5].bias.grad = model[5].bias.grad.double().float().clone()  # a new tensor, same kind
            expect = {n: (p.grad.norm().item() if p.grad is not None else None) for n, p in model.named_parameters()}
            opt.step()
            for n, v in expect.items():
                got = rec.run.metric("grad_norm")[s, rec.run.layer_index(n)]
                assert np.isnan(got) if v is None else got == pytest.approx(v, rel=1e-6), (s, n)


def test_a_plan_groups_by_device_dtype_and_shape_and_watches_missing_tensors():
    ps = [nn.Parameter(torch.zeros(2, 2)) for _ in range(3)] + [
        nn.Parameter(torch.zeros(2)),
        nn.Parameter(torch.zeros(2, 2, dtype=torch.float64)),
        nn.Parameter(torch.zeros(STACK_NUMEL + 1)),
        nn.Parameter(torch.zeros(3)),
    ]
    for p in ps[:-1]:
        p.grad = torch.ones_like(p)
    plan = Plan(ps, grad_of)
    assert [cols for cols, _ in plan.stacks] == [[0, 1, 2]]
    assert sorted(cols for cols, _ in plan.rest.values()) == [[3, 5], [4]]
    assert plan.absent == [ps[6]] and plan.current()
    ps[6].grad = torch.ones(3)
    assert not plan.current()


def test_a_plan_leaves_to_a_fused_kernel_the_shape_groups_it_reads():
    """A shape group of small tensors the fused kernel reads (its one launch reads them all) is
    not stacked; the others are."""
    sizes = [((8,), 5), ((4, 2), 3), ((STACK_NUMEL + 1,), 2)]
    ps = [nn.Parameter(torch.zeros(shape)) for shape, m in sizes for _ in range(m)]
    for p in ps:
        p.grad = torch.ones_like(p)
    seen = []

    def fused(dev, dt, members, numel):
        seen.append((dev.type, dt, members, numel))
        return numel == 8 and members == 3  # the kernel takes the 4 x 2 group only

    plan = Plan(ps, grad_of, fused)
    assert [cols for cols, _ in plan.stacks] == [list(range(5))]
    assert list(plan.rest.values())[0][0] == list(range(5, len(ps)))
    assert sorted(seen) == sorted(("cpu", torch.float32, m, math.prod(shape)) for shape, m in sizes[:2])


def test_the_sync_free_count_used_off_cpu_equals_bincount():
    from gradwidget.collect._kernels import count_values, scatter_count

    idx = torch.randint(0, 300, (5000,), dtype=torch.int32)
    np.testing.assert_array_equal(scatter_count(idx, 512).numpy(), torch.bincount(idx, minlength=512).numpy())
    np.testing.assert_array_equal(count_values(idx, 512).numpy(), scatter_count(idx, 512).numpy())


def test_the_histc_count_used_for_a_tensors_exponents_off_cpu_equals_bincount_across_chunks():
    from gradwidget.collect._kernels import histc_count

    idx = torch.cat([torch.randint(0, 256, (5000,)), torch.tensor([0, 255, 255])]).to(torch.int32)
    want = torch.bincount(idx, minlength=256).numpy()
    for chunk in (7, 4096, 1 << 24):  # a part of a chunk, several, one
        np.testing.assert_array_equal(histc_count(idx, 256, chunk).numpy(), want)
    # the most values it counts (a stack of 16 rows' exponents, 256 each): every bin index exact
    idx = torch.cat([torch.arange(4096), torch.randint(0, 4096, (20000,))]).to(torch.int32)
    np.testing.assert_array_equal(histc_count(idx, 4096).numpy(), torch.bincount(idx, minlength=4096).numpy())
