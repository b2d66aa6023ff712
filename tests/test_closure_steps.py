"""Steps of closure optimizers: with ``optimizer.step(closure)`` (LBFGS, or SGD given a
closure) the gradient is made inside step(), after its pre-hook. Each recorded step carries the
gradient its own closure made at the parameters the step starts from, step 0 included, and the
closure's loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder


class SmallConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


def _train(make_opt, steps, by_keyword=False, log_inside=False):
    """Train; per step, the gradient norms and loss of its closure's first call, and how far the
    whole step moved each parameter."""
    torch.manual_seed(0)
    model = SmallConv()
    opt = make_opt(model.parameters())
    rec = Recorder(model, opt, update_every=1, trace_nonfinite=False)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 1, 6, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    starts, losses, moves, first = [], [], [], [True]

    def closure():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if first[0]:
            first[0] = False
            starts.append({n: float(p.grad.norm()) for n, p in model.named_parameters()})
            losses.append(float(loss.detach()))
            if log_inside:
                rec.log(loss=7.0)
        return loss

    for _ in range(steps):
        first[0] = True
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        if by_keyword:
            opt.step(closure=closure)
        else:
            opt.step(closure)
        moves.append({n: float((p.detach() - before[n]).norm()) for n, p in model.named_parameters()})
    rec.detach()
    return rec.run, starts, moves, losses


@pytest.mark.parametrize(
    "make_opt,by_keyword",
    [
        (lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4), False),
        (lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=4, line_search_fn="strong_wolfe"), True),
        (lambda ps: torch.optim.SGD(ps, lr=0.1), False),
    ],
)
def test_each_step_carries_the_gradient_its_own_closure_made(make_opt, by_keyword):
    run, starts, moves, losses = _train(make_opt, 5, by_keyword)
    assert run.steps.tolist() == [0, 1, 2, 3, 4]  # step 0 is not dropped
    for row, grads in enumerate(starts):
        for name, norm in grads.items():
            assert run.metric("grad_norm")[row, run.layer_index(name)] == pytest.approx(norm, rel=1e-5)
    np.testing.assert_allclose(run.scalar("loss"), losses, rtol=1e-6)  # the closure's loss
    for row, moved in enumerate(moves):  # the update norm is the whole step's change
        for name, m in moved.items():
            assert run.metric("update_norm")[row, run.layer_index(name)] == pytest.approx(m, rel=1e-4, abs=1e-7)


def test_a_loss_logged_inside_the_closure_is_kept():
    run, *_ = _train(lambda ps: torch.optim.LBFGS(ps, lr=0.5, max_iter=3), 3, log_inside=True)
    assert run.scalar("loss").tolist() == [7.0, 7.0, 7.0]


def _fit(model, opt, steps, before_step=lambda: None):
    x, y = torch.randn(8, 1, 6, 6), torch.randint(0, 3, (8,))
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        before_step()
        opt.step()


class ClippedAdam(torch.optim.Adam):
    """An optimizer subclass whose step() calls super().step(): both calls run the step hooks."""

    def step(self, closure=None):
        for group in self.param_groups:
            torch.nn.utils.clip_grad_norm_(group["params"], 1.0)
        return super().step(closure)


def test_an_optimizer_subclass_calling_super_step_is_one_step_per_call():
    torch.manual_seed(0)
    torch.optim.Adam(nn.Linear(1, 1).parameters())  # Adam.step itself hooked too, as in any session
    model = SmallConv()
    opt = ClippedAdam(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, update_every=1, trace_nonfinite=False)
    _fit(model, opt, 4)
    rec.detach()
    assert rec.run.steps.tolist() == [0, 1, 2, 3]
    assert not np.isnan(rec.run.metric("update_norm")).any()  # measured after the whole step


def test_record_step_still_measures_the_update_at_the_optimizer_post_hook():
    torch.manual_seed(0)
    model = SmallConv()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, update_every=1, step_hooks=False, trace_nonfinite=False)
    _fit(model, opt, 3, before_step=rec.record_step)
    rec.detach()
    assert rec.run.steps.tolist() == [0, 1, 2] and not np.isnan(rec.run.metric("update_norm")).any()
