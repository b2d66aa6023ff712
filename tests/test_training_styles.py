"""Training styles outside the zoo, as a new user writes them (found by trying them): a GAN's two
optimizers, ``zero_grad()`` inside a gradient-accumulation loop, pure bfloat16 weights, an epoch's
short last accumulation. Each reads right: no finding that is not so, no step that is not one."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gradwidget import Recorder, analyze
from gradwidget.analysis.noise_scale import smoothed


def _gan(one_recorder: bool, steps: int = 150):
    """A small GAN on sklearn's digits: the generator's backward runs through the discriminator
    after the discriminator's step (the standard loop), each network with its own Adam."""
    from sklearn.datasets import load_digits

    data = torch.tensor(load_digits().data, dtype=torch.float32) / 16 * 2 - 1
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh())
    D = nn.Sequential(nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    oG = torch.optim.Adam(G.parameters(), 2e-4, betas=(0.5, 0.999))
    oD = torch.optim.Adam(D.parameters(), 2e-4, betas=(0.5, 0.999))
    recs = [Recorder(nn.ModuleDict({"G": G, "D": D}), oD)] if one_recorder else [Recorder(G, oG), Recorder(D, oD)]
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    for _ in range(steps):
        real, fake = data[torch.randint(0, len(data), (64,))], G(torch.randn(64, 16))
        oD.zero_grad()
        lD = F.binary_cross_entropy_with_logits(D(real), ones) + F.binary_cross_entropy_with_logits(
            D(fake.detach()), zeros
        )
        lD.backward()
        recs[-1].log(loss=lD)
        oD.step()
        oG.zero_grad()
        F.binary_cross_entropy_with_logits(D(fake), ones).backward()
        oG.step()
    for r in recs:
        r.detach()
    return [r.run for r in recs]


def test_a_gan_discriminator_is_not_called_unreset():
    """The generator's backward adds to the discriminator's gradients after its step; its
    ``zero_grad`` then clears them: the zero_grad check saw that sum as carried over (22 of 149
    steps here, High) before it restarted at a reset gradient."""
    _, d_run = _gan(one_recorder=False)
    seen = d_run.meta["grad_reset"]
    assert seen["checked"] >= 100 and seen["carried"] == 0, seen
    assert "missing_zero_grad" not in {d.cause for d in analyze(d_run).diagnoses}


def test_parameters_another_optimizer_steps_are_not_missing_from_the_optimizer():
    """One Recorder on both networks given the discriminator's optimizer: the generator's weights
    move (its own Adam steps them), so they are not parameters the user forgot to add."""
    (run,) = _gan(one_recorder=True)
    causes = {d.cause: d for d in analyze(run).diagnoses}
    assert "not_in_optimizer" not in causes, causes["not_in_optimizer"].evidence
    g_weight = run.metric("weight_norm")[:, run.layer_index("G.0.weight")]
    assert np.nanmax(g_weight) > np.nanmin(g_weight)  # they did move: the premise holds


def _sign_step(m: nn.Module, opt, rec: Recorder, micro: int = 1, zero_each: bool = False) -> None:
    """One optimizer step of a small sign classification over ``micro`` micro-batches of 16,
    ``zero_grad`` before the first (or, the mistake, before each: ``zero_each``)."""
    opt.zero_grad()
    for _ in range(micro):
        if zero_each:
            opt.zero_grad()
        x = torch.randn(16, 10)
        loss = F.cross_entropy(m(x), (x[:, 0] > 0).long())
        loss.backward()
    rec.log(loss=loss)
    opt.step()


def test_a_head_added_after_the_optimizer_is_still_found():
    """The cause the rule is for: a new head the optimizer does not hold, whose weights stay put."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.AdamW(m.parameters(), 1e-2)
    m[2] = nn.Linear(32, 3)
    rec = Recorder(m, opt)
    for _ in range(40):
        _sign_step(m, opt, rec)
    rec.detach()
    found = {d.cause: d for d in analyze(rec.run).diagnoses}
    assert "not_in_optimizer" in found and set(found["not_in_optimizer"].layers) == {"2.weight", "2.bias"}


def test_pure_bfloat16_weights_are_told_to_keep_float32_not_to_join_the_optimizer():
    """bfloat16 weights round away updates far below them: the optimizer holds them and never
    moves them. Not "add these parameters to the optimizer"; the learning-rate advice names the
    weights' precision."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(torch.bfloat16)
    opt = torch.optim.SGD(m.parameters(), lr=1e-5)
    rec = Recorder(m, opt)
    for _ in range(60):
        opt.zero_grad()
        x = torch.randn(32, 16, dtype=torch.bfloat16)
        loss = F.cross_entropy(m(x).float(), (x[:, 0] > 0).long() * 2)
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    report = analyze(rec.run)
    causes = [d.cause for d in report.diagnoses]
    assert "not_in_optimizer" not in causes
    assert causes and causes[0] == "lr_too_low", causes
    assert "bfloat16" in report.diagnoses[0].action and "float32" in report.diagnoses[0].action


def test_zero_grad_inside_an_accumulation_loop_records_one_step_per_optimizer_step():
    """``zero_grad()`` inside the micro-batch loop drops each micro-batch but the last: finite
    gradients no step used. They are counted, not recorded as steps (before: four steps a step,
    three of them without a loss or update norms)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    rec = Recorder(m, opt)
    for _ in range(20):
        _sign_step(m, opt, rec, micro=4, zero_each=True)
    rec.detach()
    run = rec.run
    assert run.n_steps == 20
    assert run.meta["discarded_backwards"] == 20 * 3
    assert np.isfinite(run.scalar("loss")).all()
    assert np.isfinite(run.metric("update_norm")[:: rec.update_every]).all()  # every step it measures


def test_a_skipped_amp_step_is_still_recorded():
    """What the zero_grad flush is for: GradScaler skips ``optimizer.step()`` on Inf gradients,
    and the zero_grad after it records that step (non-finite: never counted as discarded)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rec = Recorder(m, opt)
    for i in range(6):
        opt.zero_grad()
        loss = m(torch.randn(8, 4)).square().mean() * (float("inf") if i == 3 else 1.0)
        loss.backward()
        rec.log(loss=loss)
        if i != 3:  # what GradScaler does with Inf gradients
            opt.step()
    opt.zero_grad()
    rec.detach()
    assert rec.run.n_steps == 6
    assert "discarded_backwards" not in rec.run.meta
    assert not np.isfinite(rec.run.metric("grad_norm")[3]).all()


def test_a_short_last_accumulation_does_not_end_the_noise_scale():
    """An epoch whose last step has one micro-batch: "auto" keeps measuring (it removed its hooks
    at the first one-size step even after two sizes were seen, and the run said "only one batch
    size was seen")."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    rec = Recorder(m, opt, noise_every=1)
    for step in range(24):
        _sign_step(m, opt, rec, micro=1 if step % 8 == 7 else 2)  # 8 steps an "epoch", its last one short
    rec.detach()
    assert "one_size" not in rec.run.meta["noise_scale"]
    # a row for every two-size step after the first (whose micro-batches are counted from the
    # next step on), not only the first 6
    assert len(rec.run.noise) == 24 - 3 - 1


def test_a_negative_trace_estimate_gives_no_batch_size():
    """tr(Σ) is a sum of variances: a smoothed estimate below 0 (a big gradient holding past steps'
    gradients, or too few rows) is no noise scale, never a negative batch size."""
    g2 = np.full(30, 2.0)
    tr = np.full(30, -5.0) + np.linspace(0, 0.1, 30)
    steps, size = np.arange(30), np.full(30, 3.0)
    b, lo, hi = smoothed(steps, g2, tr, size)
    assert np.isnan(b[-1]) and np.isnan(hi[-1]) and lo[-1] == 0.0
    b, lo, hi = smoothed(steps, g2, -tr, size)
    assert b[-1] > 0 and 0 <= lo[-1] <= b[-1] <= hi[-1]


def test_lbfgs_trained_to_convergence_is_healthy():
    """Full-batch LBFGS with a line search takes the digits' loss from 2.3 to ~1e-7 in a few steps:
    its first steps are as long as the line search makes them (no learning rate set too high), and
    its gradients are small because the loss is (no vanishing, no plateau, no rate too low)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X, y = torch.tensor(d.data[:512], dtype=torch.float32) / 16, torch.tensor(d.target[:512])
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    opt = torch.optim.LBFGS(m.parameters(), lr=1, max_iter=5, history_size=10, line_search_fn="strong_wolfe")
    rec = Recorder(m, opt)

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(m(X), y)
        loss.backward()
        return loss

    for _ in range(40):
        rec.log(loss=opt.step(closure))
    rec.detach()
    loss = rec.run.scalar("loss")
    assert loss[-1] < 1e-4 * loss[0]  # the premise: it converged
    found = [(d.cause, d.priority) for d in analyze(rec.run).diagnoses]
    assert not [f for f in found if f[1] in ("Critical", "High", "Medium")], found


def test_a_forgotten_optimizer_step_is_said_once_not_left_as_an_empty_run():
    """backward() and zero_grad() but never optimizer.step(): the model does not train and nothing
    is recorded; the Recorder says so once, at the NO_STEP_BACKWARDS-th dropped backward."""
    import pytest

    from gradwidget.collect.torch import NO_STEP_BACKWARDS

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = Recorder(m, opt)

    def iteration():
        x = torch.randn(8, 10)
        loss = F.cross_entropy(m(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        rec.log(loss=loss)

    for _ in range(NO_STEP_BACKWARDS):  # the first zero_grad drops nothing: NO_STEP_BACKWARDS - 1 so far
        iteration()
    with pytest.warns(UserWarning, match=r"SGD\.step\(\) has not run once.*call optimizer\.step\(\)"):
        iteration()
    for _ in range(5):
        iteration()  # said once
    rec.detach()
    assert rec.run is None


def _scheduled_mlp(make_scheduler, steps: int = 300):
    """An MLP on a separable 5-class task with Adam (lr 3e-3) and a scheduler stepped after every
    optimizer step."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    sched = make_scheduler(opt)
    x_all = torch.randn(2048, 20)
    y_all = (x_all[:, :5] + 0.5 * torch.randn(2048, 5)).argmax(1)
    with Recorder(m, opt) as rec:
        for _ in range(steps):
            idx = torch.randint(0, 2048, (64,))
            loss = F.cross_entropy(m(x_all[idx]), y_all[idx])
            opt.zero_grad()
            loss.backward()
            rec.log(loss=loss)
            opt.step()
            sched.step()
    return analyze(rec.run)


def test_a_scheduler_written_for_epochs_stepped_every_batch_is_a_learning_rate_gone_too_low():
    """StepLR(step_size=30, gamma=0.1) meant for epochs, stepped once per batch: the learning rate is
    1e-9 of its peak by step 270 and the loss stops falling early. Named, with the fix."""
    report = _scheduled_mlp(lambda opt: torch.optim.lr_scheduler.StepLR(opt, 30, 0.1))
    top = report.diagnoses[0]
    assert top.cause == "lr_too_low" and top.priority in ("Medium", "High"), report.diagnoses
    assert "the learning rate fell to" in top.evidence and "once per epoch" in top.action


def test_schedules_that_end_at_zero_are_not_a_learning_rate_too_low():
    """Cosine and linear decays to zero over the run spend only its last steps near zero."""
    for make in (
        lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 300),
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 300)),
    ):
        report = _scheduled_mlp(make)
        assert "lr_too_low" not in [d.cause for d in report.diagnoses], report.diagnoses
        assert not [d for d in report.diagnoses if d.priority in ("Critical", "High", "Medium")]
