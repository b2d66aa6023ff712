"""A finding's priority from what it rests on: an observation (a fact the Recorder saw) keeps its
rule's priority; a symptom (a statistical pattern) is Low unless the objective shows measured
damage. The objective is read off the loss's own graph. Healthy training written the way others
write it (weights that grow, a generator's rising loss, a converged LSTM, a start-up spike, a
VAE's summed loss, a batch of 8) trains for real here and gets no Medium or higher finding."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradwidget import Recorder, analyze
from gradwidget.analysis.task import task_of
from test_analysis_stats import synth

T = 120
SERIOUS = ("Critical", "High", "Medium")


def _serious(report) -> list[str]:
    return [f"{d.priority} {d.cause}: {d.evidence}" for d in report.diagnoses if d.priority in SERIOUS]


# --------------------------------------------------------------------------- the engine's rule
def test_a_symptom_without_damage_is_low_and_with_damage_keeps_its_priority():
    steps = np.arange(T)
    weight = np.outer(1 + 0.2 * steps, np.ones(2))  # every layer's weight norm grows 25x
    falling = 2.0 * np.exp(-steps / 40)  # while the loss falls: learning
    calm = analyze(synth(np.full((T, 2), 0.1), loss=falling, weight=weight))
    (d,) = [d for d in calm.diagnoses if d.cause == "lr_too_high"]
    assert d.priority == "Low" and "grew" in d.evidence and "no damage" in d.evidence
    assert calm.overall_health == "Healthy"
    rising = 2.0 * np.exp(steps / 60)  # the same growth while the loss climbs: damage
    hurt = analyze(synth(np.full((T, 2), 0.1), loss=rising, weight=weight))
    top = hurt.diagnoses[0]
    assert top.cause == "lr_too_high" and top.priority in ("High", "Critical")
    assert "the loss" in top.evidence.split("grew")[-1]  # the damage is named in the evidence


def test_an_observation_keeps_its_priority_without_damage():
    steps = np.arange(T)
    falling = 2.0 * np.exp(-steps / 40)
    run = synth(np.full((T, 2), 0.1), loss=falling, status=["trainable", "unused"])
    run.metric("grad_norm")[:, 1] = np.nan
    d = next(d for d in analyze(run).diagnoses if d.cause == "no_gradient")
    assert d.priority == "High"


def test_a_pattern_on_an_objective_that_is_not_judged_stays_information():
    steps = np.arange(T)
    rising = 2.0 * np.exp(steps / 60)
    weight = np.outer(1 + 0.2 * steps, np.ones(2))
    run = synth(np.full((T, 2), 0.1), loss=rising, weight=weight)
    rep = analyze(run, objective="adversarial")
    assert not _serious(rep) and any("objective='adversarial'" in n for n in rep.notes)
    assert _serious(analyze(run, objective="loss"))
    with pytest.raises(ValueError, match="objective must be one of"):
        analyze(run, objective="minimise")


# --------------------------------------------------------------------------- the task from the graph
def _record(model, loss_fn, steps=3, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt) as rec:
        for _ in range(steps):
            opt.zero_grad()
            loss = loss_fn()
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    return rec.run


def test_the_task_is_read_from_the_losss_graph():
    torch.manual_seed(0)
    x = torch.randn(16, 4)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 5))
    ce = task_of(_record(net, lambda: F.cross_entropy(net(x), torch.randint(0, 5, (16,)))))
    assert (ce.kind, ce.classes, ce.summed) == ("cross_entropy", 5, False)
    assert ce.chance == pytest.approx(math.log(5))
    bce = task_of(_record(net, lambda: F.binary_cross_entropy_with_logits(net(x), torch.rand(16, 5))))
    assert bce.kind == "bce" and bce.chance == pytest.approx(math.log(2))
    mse = task_of(_record(net, lambda: F.mse_loss(net(x), torch.zeros(16, 5), reduction="sum")))
    assert (mse.kind, mse.summed, mse.batch, mse.chance) == ("mse", True, 16, None)
    assert mse.per_example(32.0) == 2.0
    # an output 5 wide read by an MSE has no classes: no chance level from the width
    assert task_of(_record(net, lambda: F.l1_loss(net(x), torch.zeros(16, 5)))).chance is None


def test_a_vae_loss_is_a_sum_with_a_second_term_and_no_chance_level():
    torch.manual_seed(0)
    enc, dec = nn.Linear(12, 8), nn.Linear(4, 12)
    model = nn.ModuleDict({"enc": enc, "dec": dec})
    x = (torch.rand(16, 12) > 0.5).float()

    def elbo():
        h = enc(x)
        mu, logvar = h[:, :4], h[:, 4:]
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        rec = F.binary_cross_entropy_with_logits(dec(z), x, reduction="sum")
        return rec - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    task = task_of(_record(model, elbo))
    assert task.summed and task.terms == 2 and task.chance is None and task.judged


def test_a_generator_loss_through_another_network_is_adversarial_and_reinforce_is_not_judged():
    torch.manual_seed(0)
    G, D = nn.Linear(2, 3), nn.Linear(3, 1)
    z = torch.randn(8, 2)
    gan = task_of(_record(G, lambda: F.binary_cross_entropy_with_logits(D(G(z)), torch.ones(8, 1))))
    assert gan.kind == "adversarial" and not gan.judged and "outside the recorded model" in gan.assumed
    policy = nn.Linear(4, 2)
    s = torch.randn(8, 4)

    def reinforce():
        dist = torch.distributions.Categorical(logits=policy(s))
        a = dist.sample()
        return -(dist.log_prob(a) * torch.randn(8)).sum()

    pg = task_of(_record(policy, reinforce))
    assert pg.kind == "custom" and not pg.judged


# --------------------------------------------------------------------------- healthy, as others write it
def _train(model, opt, batches, loss_fn, steps, *, after=None, closure=False):
    """The tutorial loop under a Recorder: zero_grad, loss, backward, log, step, then ``after(step,
    loss)`` (a scheduler); returns the run."""
    with Recorder(model, opt) as rec:
        for i in range(steps):
            b = batches(i)
            if closure:

                def run_once(b=b):
                    opt.zero_grad()
                    loss = loss_fn(b)
                    loss.backward()
                    return loss

                opt.step(run_once)
                continue
            opt.zero_grad()
            loss = loss_fn(b)
            loss.backward()
            rec.log(loss=loss, lr=opt.param_groups[0]["lr"])
            opt.step()
            if after is not None:
                after(i, loss.item())
    return rec.run


def test_weights_that_grow_while_the_loss_falls_are_learning():
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 64)[:, None]
    feats = torch.cat([x, x**2, x**3], 1)
    y = 40 * x**3 - 25 * x + 5  # targets far larger than the initial weights
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    run = _train(model, opt, lambda i: None, lambda b: F.mse_loss(model(feats), y), 300)
    loss = run.scalar("loss")
    grew = float(np.nanmax(run.metric("weight_norm")[:, 0]) / run.metric("weight_norm")[0, 0])
    assert loss[-1] < 0.05 * loss[0] and grew > 10  # the case: large growth, falling loss
    assert not _serious(analyze(run))


def test_a_gan_generators_rising_loss_is_not_a_divergence():
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 2e-3), torch.optim.Adam(D.parameters(), 2e-3)
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)

    def g_loss(b):
        real = torch.randn(32, 2) * 0.3 + 3.0  # the discriminator's step, then the generator's
        fake = G(torch.randn(32, 2))
        opt_d.zero_grad()
        d = F.binary_cross_entropy_with_logits(D(real), ones) + F.binary_cross_entropy_with_logits(
            D(fake.detach()), zeros
        )
        d.backward()
        opt_d.step()
        return F.binary_cross_entropy_with_logits(D(fake), ones)

    run = _train(G, opt_g, lambda i: None, g_loss, 150)
    rep = analyze(run)
    assert not _serious(rep), _serious(rep)
    assert any("outside the recorded model" in n for n in rep.notes)


def test_a_converged_lstm_has_small_gradients_not_vanishing_ones():
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm1 = nn.LSTM(1, 12, batch_first=True)
            self.out = nn.Linear(12, 1)

        def forward(self, x):
            return self.out(self.lstm1(x)[0])

    t = torch.linspace(0, 4 * math.pi, 41)
    wave = torch.sin(t)[None, :, None]
    x, y = wave[:, :-1], wave[:, 1:]
    model = Net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.8, history_size=20, max_iter=20)
    run = _train(model, opt, lambda i: None, lambda b: F.mse_loss(model(x), y), 25, closure=True)
    loss = run.scalar("loss")
    assert loss[-1] < 1e-3 * loss[0]  # the case: it converged
    assert not _serious(analyze(run))


def test_a_start_up_spike_then_training_is_not_a_learning_rate_too_high():
    torch.manual_seed(0)
    centers = torch.randn(4, 10) * 2
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    warm = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 30.0 if i < 3 else 1.0)  # three huge first steps

    def batch(i):
        g = torch.Generator().manual_seed(i)
        lab = torch.randint(0, 4, (32,), generator=g)
        return centers[lab] + torch.randn(32, 10, generator=g), lab

    run = _train(model, opt, batch, lambda b: F.cross_entropy(model(b[0]), b[1]), 150, after=lambda i, v: warm.step())
    loss = run.scalar("loss")
    assert loss[1:4].max() > 2 * loss[0] and np.median(loss[-10:]) < 0.5 * loss[0]  # spike, then it trains
    assert not _serious(analyze(run))


def test_a_vaes_summed_loss_is_not_read_as_a_classifiers():
    torch.manual_seed(0)

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.mu, self.logvar = nn.Linear(64, 32), nn.Linear(32, 4), nn.Linear(32, 4)
            self.dec1, self.dec2 = nn.Linear(4, 32), nn.Linear(32, 64)

        def forward(self, x):
            h = F.relu(self.enc(x))
            mu, logvar = self.mu(h), self.logvar(h)
            z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
            return self.dec2(F.relu(self.dec1(z))), mu, logvar

    protos = (torch.rand(4, 64) > 0.5).float()
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def elbo(b):
        x = protos[torch.randint(0, 4, (32,))]
        logits, mu, logvar = model(x)
        bce = F.binary_cross_entropy_with_logits(logits, x, reduction="sum")
        return bce - 0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    run = _train(model, opt, lambda i: None, elbo, 150)
    rep = analyze(run)
    assert not _serious(rep), _serious(rep)
    assert not any(d.cause == "exploding" for d in rep.diagnoses)  # 64 outputs are no 64 classes


def test_a_batch_of_eight_is_noise_not_a_rebound():
    torch.manual_seed(0)
    X = torch.randn(512, 8)
    y = (X @ torch.randn(8, 1)) + 0.5 * torch.randn(512, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=2)
    epoch: list[float] = []

    def batch(i):
        idx = torch.randint(0, 512, (8,), generator=torch.Generator().manual_seed(i))
        return X[idx], y[idx]

    def after(i, value):  # ReduceLROnPlateau on each epoch's mean loss (64 batches of 8)
        epoch.append(value)
        if len(epoch) == 64:
            sched.step(float(np.mean(epoch)))
            epoch.clear()

    run = _train(model, opt, batch, lambda b: F.mse_loss(model(b[0]), b[1]), 300, after=after)
    with torch.no_grad():
        assert F.mse_loss(model(X), y) < 0.05 * y.var()  # the case: it learned the whole data set
    assert not _serious(analyze(run))


# --------------------------------------------------------------------------- mistakes seen, not guessed
def test_zero_grad_between_backward_and_step_is_seen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 6), torch.randint(0, 3, (64,))
    with pytest.warns(UserWarning, match="zero_grad"), Recorder(model, opt) as rec:
        for _ in range(30):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            opt.zero_grad()  # the bug: the step below finds no gradient
            opt.step()
    top = analyze(rec.run).diagnoses[0]
    assert top.cause == "cleared_before_step" and top.priority in ("High", "Critical")
    assert "before loss.backward()" in top.action


def test_float16_weights_trained_with_adam_are_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).half()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 6).half(), torch.randint(0, 3, (64,))
    run = _train(model, opt, lambda i: None, lambda b: F.cross_entropy(model(x).float(), y), 20)
    top = analyze(run).diagnoses[0]
    assert top.cause == "half_weights" and top.priority in ("High", "Critical")
    assert "float16" in top.evidence and "GradScaler" in top.action


def test_labels_shuffled_apart_from_their_inputs_learn_nothing():
    torch.manual_seed(0)
    centers = torch.randn(4, 10) * 3
    labels = torch.arange(512) % 4
    inputs = centers[labels] + torch.randn(512, 10)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batch(i):  # the bug: two permutations, one for the inputs and one for the labels
        g = torch.Generator().manual_seed(i)
        return inputs[torch.randperm(512, generator=g)[:64]], labels[torch.randperm(512, generator=g)[:64]]

    run = _train(model, opt, batch, lambda b: F.cross_entropy(model(b[0]), b[1]), 120)
    top = analyze(run).diagnoses[0]
    assert top.cause == "learns_nothing" and top.priority in ("High", "Critical", "Medium")
    assert "chance level" in top.evidence and "labels" in top.action


def test_a_normalize_meant_for_unit_pixels_on_0_255_pixels_is_input_scale():
    torch.manual_seed(0)
    labels = torch.randint(0, 4, (512,))
    pixels = (torch.rand(512, 1, 8, 8) * 60 + labels[:, None, None, None] * 45).round()  # 0-255
    x = (pixels - 0.5) / 0.5  # transforms.Normalize((0.5,), (0.5,)), written for ToTensor's [0, 1]
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def batch(i):
        idx = torch.randint(0, 512, (32,), generator=torch.Generator().manual_seed(i))
        return x[idx], labels[idx]

    run = _train(model, opt, batch, lambda b: F.cross_entropy(model(b[0]), b[1]), 60)
    top = analyze(run).diagnoses[0]
    assert top.cause == "input_scale" and "normalise the inputs" in top.action


# --------------------------------------------------------------------------- the objective stated when recording
def _gan_generator(steps=150):
    """A GAN as tutorials write it: the discriminator (three Adam steps at a larger learning rate)
    is frozen with ``requires_grad_(False)`` for the generator's step, so the generator loss's graph
    holds no tensor another optimizer trains and reads as a plain BCE; as the discriminator learns,
    the generator's loss rises. Returns (generator, its optimizer, a function training ``steps``
    steps that calls ``log(loss)`` at each)."""
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    D = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), 2e-3), torch.optim.Adam(D.parameters(), 1e-2)
    ones, zeros = torch.ones(32, 1), torch.zeros(32, 1)

    def train(log):
        for _ in range(steps):
            real = torch.randn(32, 2) * 0.3 + 3.0
            fake = G(torch.randn(32, 2))
            D.requires_grad_(True)
            for _ in range(3):
                opt_d.zero_grad()
                d = F.binary_cross_entropy_with_logits(D(real), ones)
                d = d + F.binary_cross_entropy_with_logits(D(fake.detach()), zeros)
                d.backward()
                opt_d.step()
            D.requires_grad_(False)
            opt_g.zero_grad()
            loss = F.binary_cross_entropy_with_logits(D(fake), ones)
            loss.backward()
            log(loss)
            opt_g.step()

    return G, opt_g, train


def _record_gan(log_dir, **options):
    G, opt, train = _gan_generator()
    with Recorder(G, opt, log_dir=log_dir, **options) as rec:
        train(lambda loss: rec.log(loss=loss))
    return rec.run


def test_an_objective_stated_to_the_recorder_reaches_the_folder_the_report_and_compare(tmp_path):
    import html

    from gradwidget import compare, load_run
    from gradwidget.cli import main

    unstated = _record_gan(tmp_path / "auto")
    stated = _record_gan(tmp_path / "gan", objective="adversarial")
    assert "objective" not in unstated.meta and stated.meta["objective"] == "adversarial"
    # the same training: read as a loss to minimise, its rising loss is a divergence
    top = analyze(load_run(tmp_path / "auto")).diagnoses[0]
    assert top.cause == "lr_too_high" and top.priority == "Critical" and "diverged" in top.evidence
    # stated: read back from the folder's meta.json, no claim on the loss's trajectory
    run = load_run(tmp_path / "gan")
    assert run.meta["objective"] == "adversarial"
    rep = analyze(run)
    assert not _serious(rep) and rep.overall_health == "Healthy"
    assert not any("diverged" in d.evidence for d in rep.diagnoses)
    assert all("information only: objective='adversarial'" in d.evidence for d in rep.diagnoses)
    assert "objective: objective='adversarial': the loss's trajectory is not judged" in rep.notes
    # an explicit objective overrides the stated one
    assert analyze(run, objective="loss").diagnoses[0].priority == "Critical"
    # gradwidget report DIR reads it too
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "gan"), "-o", str(out)]) == 0
    page = html.unescape(out.read_text())
    assert "objective='adversarial'" in page and "Critical" not in page.split("<details")[0]
    # and compare on the folders: the alarm disappeared once the objective was stated
    cmp = compare(tmp_path / "auto", tmp_path / "gan", labels=["auto", "stated"])
    assert cmp.reports[0].overall_health == "Critical" and cmp.reports[1].overall_health == "Healthy"


def test_an_objective_given_to_the_panel_is_used_by_its_analysis():
    from gradwidget import GradientPanel

    G, opt, train = _gan_generator()
    panel = GradientPanel(G, opt, objective="adversarial")
    try:
        train(lambda loss: panel.recorder.log(loss=loss))
        panel.flush()
        rep = panel.report
        assert panel.run.meta["objective"] == "adversarial"
        assert not _serious(rep) and any("objective='adversarial'" in n for n in rep.notes)
        # the panel says what it assumed, beside its verdict
        assert panel.verdict.endswith("the loss read as objective='adversarial', its trajectory not judged"), (
            panel.verdict
        )
    finally:
        panel.close()


def test_a_wrong_objective_is_refused_where_it_is_given():
    from gradwidget import GradientPanel
    from gradwidget.integrations.base import TrainerRecording

    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    message = r"objective must be one of 'auto', 'loss', 'adversarial', 'policy_gradient', 'other' .* not 'gan'"
    for make in (
        lambda: Recorder(model, opt, objective="gan"),
        lambda: GradientPanel(model, opt, objective="gan"),
        lambda: TrainerRecording(objective="gan"),
    ):
        with pytest.raises(ValueError, match=message):
            make()
    # refused before anything was attached: a Recorder built now is the only one on the model
    assert not model._forward_hooks and not model._forward_pre_hooks
    with Recorder(model, opt, objective="policy_gradient") as rec:
        model(torch.randn(4, 3)).sum().backward()
        opt.step()
    assert rec.run.meta["objective"] == "policy_gradient"
