"""Healthy training patterns of code written by others that a diagnosis must not call mistakes: a
DQN-style target network (trainable, not held by the optimizer, never reached by the loss), a
zero_grad skipped on a rare step, a GAN whose two optimizers take turns over one module, a GAN's
discriminator with a Recorder of its own, an ensemble of two recorded models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze, load_run
from gradwidget.analysis.task import task_of

ALARMS = ("Critical", "High", "Medium")


class QNets(nn.Module):
    """An online Q-network and its target copy, as stable-baselines3's DQN policy holds them."""

    def __init__(self) -> None:
        super().__init__()
        self.q_net = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
        self.q_net_target = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
        self.q_net_target.load_state_dict(self.q_net.state_dict())


def _dqn(optimize_all: bool):
    """Q-learning on random transitions, the target network copied every 5 steps; the optimizer holds
    the online network (as DQN's does) or, with ``optimize_all``, every parameter."""
    torch.manual_seed(0)
    nets = QNets()
    opt = torch.optim.Adam(nets.parameters() if optimize_all else nets.q_net.parameters(), 1e-3)
    with Recorder(nets, opt) as rec:
        for step in range(30):
            s, s2 = torch.randn(16, 4), torch.randn(16, 4)
            a, r = torch.randint(0, 2, (16,)), torch.randn(16)
            with torch.no_grad():
                target = r + 0.99 * nets.q_net_target(s2).max(dim=1).values
            q = nets.q_net(s).gather(1, a[:, None]).squeeze(1)
            loss = nn.functional.smooth_l1_loss(q, target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.log(loss=loss)
            if step % 5 == 4:
                nets.q_net_target.load_state_dict(nets.q_net.state_dict())
    return rec.run


def test_a_target_network_is_information_not_a_mistake():
    run = _dqn(optimize_all=False)
    target = [n for n in run.layer_names if n.startswith("q_net_target.")]
    assert run.meta["not_in_optimizer"] == target and len(target) == 4
    found = {d.cause: d for d in analyze(run).diagnoses}
    assert not [d for d in found.values() if d.priority in ALARMS], found
    d = found["no_gradient"]
    assert d.priority == "Low" and set(d.layers) == set(target)
    assert "optimizer does not hold them" in d.evidence and "target or EMA copy" in d.evidence
    assert "requires_grad_(False)" in d.action
    assert "not_in_optimizer" not in found  # about gradients the optimizer never applies: none here


def test_parameters_the_optimizer_holds_but_no_gradient_reaches_stay_high():
    run = _dqn(optimize_all=True)
    assert run.meta["not_in_optimizer"] == []
    d = analyze(run).diagnoses[0]
    assert d.cause == "no_gradient" and d.priority == "High"
    assert set(d.layers) == {n for n in run.layer_names if n.startswith("q_net_target.")}
    assert "that the optimizer holds" in d.evidence


def _regression(skip: set[int], steps: int = 60):
    """An MLP regression, ``optimizer.zero_grad()`` skipped on the steps in ``skip``; every 10th
    batch's loss is masked out entirely (no gradient reaches any parameter on that step)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(m.parameters(), 0.01)
    with Recorder(m, opt) as rec:
        for step in range(steps):
            x = torch.randn(32, 8)
            y = x.sum(dim=1, keepdim=True)
            if step not in skip:
                opt.zero_grad()
            mask = 0.0 if step % 10 == 9 else 1.0
            loss = (mask * (m(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            rec.log(loss=loss)
    return rec.run


def test_zero_grad_skipped_on_rare_steps_is_not_a_forgotten_zero_grad():
    run = _regression(skip={22, 43})
    seen = run.meta["grad_reset"]
    assert 2 <= seen["carried"] < 0.1 * seen["checked"]
    assert "missing_zero_grad" not in {d.cause for d in analyze(run).diagnoses}


def test_zero_grad_forgotten_on_every_step_is_found_through_steps_without_a_gradient():
    run = _regression(skip=set(range(60)))
    seen = run.meta["grad_reset"]
    assert seen["carried"] >= 0.5 * seen["checked"] >= 20
    top = analyze(run).diagnoses[0]
    assert top.cause == "missing_zero_grad" and top.priority == "High"


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh())
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1), nn.Sigmoid())


def _toggle(gan: GAN, part: nn.Module) -> None:
    """Only ``part`` trains (Lightning's ``toggle_optimizer``)."""
    for p in gan.parameters():
        p.requires_grad_(False)
    for p in part.parameters():
        p.requires_grad_(True)


def _step(opt: torch.optim.Optimizer, loss: torch.Tensor, zero_after: bool) -> None:
    if not zero_after:
        opt.zero_grad()  # the last turn's gradient stays until this one's backward (PyTorch's DCGAN)
    loss.backward()
    opt.step()
    if zero_after:
        opt.zero_grad()  # gone before the other turn (Lightning's manual optimization)


@pytest.mark.parametrize("zero_after", [False, True])
def test_a_gan_trained_by_two_optimizers_in_turn_is_adversarial(zero_after):
    torch.manual_seed(0)
    gan = GAN()
    opt_g = torch.optim.Adam(gan.generator.parameters(), 2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(gan.discriminator.parameters(), 2e-4, betas=(0.5, 0.999))
    bce = nn.BCELoss()
    real_data = torch.randn(512, 16) * 0.5 + 1.0
    with Recorder(gan, opt_g) as rec:
        for step in range(80):
            real = real_data[torch.randint(0, 512, (32,))]
            z = torch.randn(32, 8)
            _toggle(gan, gan.generator)  # the generator's turn
            g_loss = bce(gan.discriminator(gan.generator(z)), torch.ones(32, 1))
            _step(opt_g, g_loss, zero_after)
            rec.log(loss=g_loss)
            _toggle(gan, gan.discriminator)  # the discriminator's turn
            fake = gan.generator(z).detach()
            d_loss = (
                bce(gan.discriminator(real), torch.ones(32, 1)) + bce(gan.discriminator(fake), torch.zeros(32, 1))
            ) / 2
            _step(opt_d, d_loss, zero_after)
            rec.log(loss=d_loss)
    run = rec.run
    task = task_of(run)
    assert task.kind == "adversarial" and not task.judged and "take turns over 2 disjoint parts" in task.assumed
    assert task_of(run, "loss").judged  # the user can say it is one loss to minimise
    assert not [d for d in analyze(run).diagnoses if d.priority in ALARMS]


def _ring(n: int) -> torch.Tensor:
    """Points on a ring of eight Gaussians (a GAN's usual 2-d target)."""
    a = torch.randint(0, 8, (n,)) * (2 * torch.pi / 8)
    return torch.stack([a.cos(), a.sin()], 1) * 2 + 0.05 * torch.randn(n, 2)


def _two_recorder_gan(tmp_path, steps: int, d_recorder_late: bool = False):
    """PyTorch's DCGAN recipe on 2-d points with a Recorder on each network: the discriminator's step
    on real and detached fake points, then the generator's step through the discriminator. With
    ``d_recorder_late`` the discriminator's Recorder is built after the generator's first step."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    D = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    opt_g = torch.optim.Adam(G.parameters(), 1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), 1e-3, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    rec_g, rec_d = Recorder(G, opt_g), None
    for step in range(steps):
        if rec_d is None and (step == 1 or not d_recorder_late):
            rec_d = Recorder(D, opt_d, log_dir=tmp_path / "d")
        real, fake = _ring(128), G(torch.randn(128, 8))
        d_loss = bce(D(real), torch.ones(128, 1)) + bce(D(fake.detach()), torch.zeros(128, 1))
        opt_d.zero_grad()
        d_loss.backward()
        if rec_d is not None:
            rec_d.log(loss=d_loss)
        opt_d.step()
        g_loss = bce(D(fake), torch.ones(128, 1))
        opt_g.zero_grad()
        g_loss.backward()
        rec_g.log(loss=g_loss)
        opt_g.step()
    rec_g.detach()
    rec_d.detach()
    return rec_g.run, rec_d.run


@pytest.mark.parametrize("d_recorder_late", [False, True])
def test_a_discriminator_with_its_own_recorder_is_read_as_one_not_as_a_classifier(tmp_path, d_recorder_late):
    """Its loss rises as the generator learns: not a loss to minimise on its own. The generator's
    loss runs through its parameters, which tells its Recorder, whichever was built first."""
    run_g, run_d = _two_recorder_gan(tmp_path, 400, d_recorder_late)
    assert task_of(run_g).kind == "adversarial"  # its loss reads the discriminator
    for run in (run_d, load_run(tmp_path / "d")):  # the folder says it too
        assert run.meta["read_by"] == "Sequential"
        task = task_of(run)
        assert task.kind == "adversarial" and not task.judged and "discriminator or critic" in task.reading
        assert task_of(run, "loss").judged  # the user can say it is one loss to minimise
        assert not [d for d in analyze(run).diagnoses if d.priority in ALARMS], analyze(run).diagnoses


def test_two_models_trained_side_by_side_do_not_read_each_other():
    """An ensemble: two classifiers on the same batches, a Recorder each; neither loss reads the other."""
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)) for _ in range(2)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    recs = [Recorder(n, o) for n, o in zip(nets, opts)]
    for _ in range(20):
        x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
        for net, opt, rec in zip(nets, opts, recs):
            loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    for rec in recs:
        rec.detach()
        assert "read_by" not in rec.run.meta and task_of(rec.run).kind == "cross_entropy"


def _amp_mlp(growth_interval: int = 2000, steps: int = 200):
    """An MLP under float16 autocast with torch.amp.GradScaler starting at 2**24: its first
    backwards overflow and the scaler skips them, lowering its scale, as mixed precision does.
    ``growth_interval=1`` doubles the scale back after every good step, so about every other step
    overflows."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=growth_interval)
    x_all = torch.randn(1024, 32)
    y_all = (x_all @ torch.randn(32, 10)).argmax(1)
    with Recorder(model, opt) as rec:
        for _ in range(steps):
            idx = torch.randint(0, 1024, (64,))
            with torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
            opt.zero_grad()
            scaler.scale(loss).backward()
            rec.log(loss=loss)
            scaler.step(opt)
            scaler.update()
    return rec.run


def test_steps_a_grad_scaler_skips_are_loss_scaling_not_a_nan():
    run = _amp_mlp()
    overflowed = run.nonfinite().any(1)
    assert 1 <= overflowed.sum() <= 10 and overflowed[0]  # the first steps, at 2**24
    report = analyze(run)
    (nf,) = [d for d in report.diagnoses if d.cause == "nonfinite"]
    assert nf.priority == "Low" and "left out of the weights" in nf.evidence and "init_scale" in nf.action
    assert report.overall_health == "Healthy"
    assert not [d for d in report.diagnoses if d.priority in ALARMS]


def test_a_scaler_that_skips_every_other_step_is_named():
    run = _amp_mlp(growth_interval=1, steps=120)
    assert run.nonfinite().any(1).mean() > 0.2
    (nf,) = [d for d in analyze(run).diagnoses if d.cause == "nonfinite"]
    assert nf.priority == "Medium" and "trace_nonfinite=True" in nf.action
