"""The Recorder's direct zero_grad check (``collect/_grad_reset``): the gradient an optimizer step
uses is fitted as the last step's plus this step's backwards. Forgotten ``zero_grad`` is found
whatever the optimizer, clipping or model; every way of resetting (and accumulating on purpose)
reads as reset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, analyze, load_run
from gradwidget.collect._grad_reset import carried


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.LayerNorm(64), nn.Linear(64, 5))


def _train(mode: str, optimizer: str = "adamw", steps: int = 12, **rec_kw):
    """Train an MLP ``steps`` steps, resetting its gradients the way ``mode`` says (or not)."""
    torch.manual_seed(0)
    m = _mlp()
    opt = (
        torch.optim.AdamW(m.parameters(), 1e-3)
        if optimizer == "adamw"
        else torch.optim.SGD(m.parameters(), 0.05, momentum=0.9)
    )
    rec = Recorder(m, opt, **rec_kw)
    reset = mode.removesuffix("_clip")
    for _ in range(steps):
        x, y = torch.randn(15, 20), torch.randint(0, 5, (15,))
        if reset == "optimizer":
            opt.zero_grad()
        elif reset == "model":
            m.zero_grad()
        elif reset == "in_place":
            opt.zero_grad(set_to_none=False)
        elif reset == "by_hand":
            for p in m.parameters():
                p.grad = None
        if reset == "accumulate":  # three micro-batches a step, zeroed once per step
            opt.zero_grad()
            for k in range(3):
                nn.functional.cross_entropy(m(x[5 * k : 5 * k + 5]), y[5 * k : 5 * k + 5]).backward()
        else:
            nn.functional.cross_entropy(m(x), y).backward()
        if mode.endswith("_clip"):
            nn.utils.clip_grad_norm_(m.parameters(), 0.01)
        opt.step()
        if mode == "log_backward":  # a backward after the step, for logging; zeroed before the next one
            nn.functional.cross_entropy(m(x), y).backward()
            opt.zero_grad()
    rec.detach()
    return rec.run


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize(
    "mode", ["optimizer", "model", "in_place", "by_hand", "accumulate", "optimizer_clip", "log_backward"]
)
def test_every_reset_reads_as_reset(mode, optimizer):
    run = _train(mode, optimizer)
    seen = run.meta["grad_reset"]
    assert seen["checked"] == 11 and seen["carried"] == 0 and seen["first_step"] is None
    assert "missing_zero_grad" not in [d.cause for d in analyze(run).diagnoses]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("mode", ["none", "none_clip"])
def test_forgotten_zero_grad_is_found_from_the_second_step(mode, optimizer):
    run = _train(mode, optimizer)
    assert run.meta["grad_reset"] == {
        "layer": "0.bias",
        "checked": 11,
        "carried": 11,
        "first_step": 1,
        "steps": 12,
        "cleared": 0,  # carried, never cleared before the step
    }
    top = analyze(run).diagnoses[0]
    assert top.cause == "missing_zero_grad" and top.priority == "High" and top.first_step == 1
    assert "11 of 11 steps" in top.evidence and "0.bias" in top.evidence
    assert set(top.layers) == set(run.layer_names)


def test_recorded_every_third_step_checks_those_only():
    seen = _train("none", every=3)
    assert seen.meta["grad_reset"]["checked"] == 3 and seen.meta["grad_reset"]["carried"] == 3  # steps 3, 6, 9


def test_the_counts_are_in_the_run_directory(tmp_path):
    run = _train("none", log_dir=tmp_path / "run")
    assert load_run(tmp_path / "run").meta["grad_reset"] == run.meta["grad_reset"]


def test_a_real_transformer_without_zero_grad():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    with Recorder(model, opt) as rec:
        for _ in range(6):
            ids = torch.randint(0, 50, (4, 16))
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    seen = rec.run.meta["grad_reset"]
    assert seen["carried"] == seen["checked"] == 5
    assert analyze(rec.run).diagnoses[0].cause == "missing_zero_grad"


def test_a_replaced_parameter_keeps_the_counts():
    torch.manual_seed(0)
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), 0.01)
    rec = Recorder(m, opt)
    for step in range(8):
        if step == 4:  # a new first layer, given to the optimizer too
            m[0] = nn.Linear(20, 64)
            opt.add_param_group({"params": m[0].parameters()})
        nn.functional.cross_entropy(m(torch.randn(8, 20)), torch.randint(0, 5, (8,))).backward()
        opt.step()
    rec.detach()
    seen = rec.run.meta["grad_reset"]
    assert seen["carried"] >= 5 and seen["first_step"] == 1


def test_the_fit():
    rng = np.random.default_rng(0)
    last, fresh = rng.normal(size=64), rng.normal(size=64)

    def dots(g, f=fresh):
        return last @ last, f @ f, last @ f, g @ last, g @ f, g @ g

    assert carried(*dots(fresh)) is False  # reset: this step's backwards only
    assert carried(*dots(last + fresh)) is True  # not reset
    assert carried(*dots(0.01 * (last + fresh))) is True  # not reset, then clipped in place
    assert carried(*dots(0.5 * fresh)) is False  # reset, then clipped
    assert carried(*dots(last, np.zeros(64))) is True  # no backward reached it, the last gradient is still there
    assert carried(*dots(rng.normal(size=64))) is False  # something the fit does not explain
    assert carried(*dots(2 * last, 2 * last)) is None  # two gradients along one line: cannot tell
    assert carried(0.0, 1.0, 0.0, 0.0, 1.0, 1.0) is None  # the last gradient was zero
    assert carried(float("nan"), 1.0, 0.0, 0.0, 1.0, 1.0) is None


@pytest.mark.parametrize("zero", [True, False], ids=["reset", "not_reset"])
def test_amp_grad_scaler_unscaling_and_clipping_in_place(zero):
    """GradScaler's unscale_ divides the whole gradient in place (and clipping rescales it): the fit
    reads the common factor, so reset and not reset stay apart."""
    torch.manual_seed(0)
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), 0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    with Recorder(m, opt) as rec:
        for _ in range(10):
            x, y = torch.randn(16, 20), torch.randint(0, 5, (16,))
            if zero:
                opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(m(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
    seen = rec.run.meta["grad_reset"]
    assert seen["checked"] == 9 and seen["carried"] == (0 if zero else 9)


def test_a_live_folder_gives_the_recorders_causes_within_one_flush_interval(tmp_path, monkeypatch):
    """While the Recorder is attached (a notebook panel never closes it), the run folder's
    meta.json follows the zero_grad check's counts within one flush interval (``collect/_meta``):
    ``load_run`` of the live folder gives the cause the Recorder's own run gives, with the counts
    of at most one interval ago, and all of them once detached."""
    from gradwidget.collect import _meta

    now = [0.0]
    monkeypatch.setattr(_meta, "_clock", lambda: now[0])
    steps_per_interval = 10
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 5))  # not the check's own MLP
    opt = torch.optim.SGD(m.parameters(), 0.01)
    rec = Recorder(m, opt, log_dir=tmp_path / "run")
    for step in range(45):
        x, y = torch.randn(15, 20), torch.randint(0, 5, (15,))
        nn.functional.cross_entropy(m(x), y).backward()  # no zero_grad
        opt.step()
        now[0] += _meta.FLUSH_SECONDS / steps_per_interval
    live, seen = load_run(tmp_path / "run"), rec.run.meta["grad_reset"]
    assert seen["checked"] == seen["carried"] == 44
    assert seen["checked"] - steps_per_interval <= live.meta["grad_reset"]["checked"] < seen["checked"]
    causes = [d.cause for d in analyze(live).diagnoses]
    assert causes[0] == "missing_zero_grad" == analyze(rec.run).diagnoses[0].cause
    rec.detach()
    assert load_run(tmp_path / "run").meta["grad_reset"] == seen
