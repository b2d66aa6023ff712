"""Normalisation layers in eval mode while training: the Recorder reads the training flags of the
model's BatchNorm/InstanceNorm (with running statistics) and dropout modules at each recorded
optimizer step (``collect/_train_mode``, ``run.meta["train_mode"]``), and ``eval_mode`` names
``model.eval()`` left on. A frozen-BatchNorm fine-tune (the model trains, its BatchNorm modules keep
their pretrained statistics in eval mode) is a recipe: information, never an alarm."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradwidget import Recorder, analyze, load_run
from gradwidget.collect._train_mode import TrainModeCheck

SERIOUS = ("Critical", "High", "Medium")
STEPS = 100


def _serious(report) -> list[str]:
    return [f"{d.priority} {d.cause}: {d.evidence}" for d in report.diagnoses if d.priority in SERIOUS]


def _cnn(dropout: bool = True) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        *([nn.Dropout(0.3)] if dropout else []),
        nn.Linear(16 * 4, 4),
    )


def _data():
    g = torch.Generator().manual_seed(0)
    protos = torch.randn(4, 1, 8, 8, generator=g)
    labels = torch.randint(0, 4, (512,), generator=g)
    return protos[labels] + 1.5 * torch.randn(512, 1, 8, 8, generator=g), labels


X, Y = _data()


def _train(model, steps=STEPS, *, record=True, first=0, before=None, evaluate_at=None, **options):
    """The tutorial loop: zero_grad, loss, backward, step on batches of 32; ``before(model)`` once
    before the loop; at step ``evaluate_at`` an evaluation under ``model.eval()`` with no
    ``model.train()`` after it. Returns the run (None unrecorded)."""
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.02, momentum=0.9)
    rec = Recorder(model, opt, **options) if record else None
    if before is not None:
        before(model)
    for i in range(steps):
        if i == evaluate_at:
            model.eval()
            with torch.no_grad():
                (model(X).argmax(1) == Y).float().mean()
        idx = torch.randint(0, 512, (32,), generator=torch.Generator().manual_seed(first + i))
        opt.zero_grad()
        loss = F.cross_entropy(model(X[idx]), Y[idx])
        loss.backward()
        if rec is not None:
            rec.log(loss=loss)
        opt.step()
    if rec is None:
        return None
    rec.detach()
    return rec.run


def _eval_mode(report):
    return next((d for d in report.diagnoses if d.cause == "eval_mode"), None)


@pytest.mark.parametrize("where", ["before the loop", "after an evaluation"])
def test_model_eval_left_on_is_named_with_its_evidence_and_action(tmp_path, where):
    torch.manual_seed(1)
    if where == "before the loop":
        run = _train(_cnn(), before=lambda m: m.eval(), log_dir=tmp_path / "run")
        on, first = STEPS, 0
    else:
        run = _train(_cnn(), evaluate_at=40, log_dir=tmp_path / "run")
        on, first = STEPS - 40, 40
    seen = load_run(tmp_path / "run").meta["train_mode"]  # in the folder's meta.json
    assert seen["steps"] == STEPS and seen["model_eval"] == on and seen["norm_eval"] == on
    assert seen["dropout_eval"] == on and seen["first_step"] == first and seen["eval_norms"] == ["1", "5"]
    d = analyze(run).diagnoses[0]
    assert d.cause == "eval_mode" and d.priority in ("High", "Critical") and d.first_step == first
    assert f"the model was in eval mode (model.eval()) on {on} of {STEPS} recorded optimizer steps" in d.evidence
    assert "dropout module off" in d.evidence
    assert sorted(d.layers) == ["1.bias", "1.weight", "5.bias", "5.weight"]  # the BatchNorm layers
    assert d.action.startswith("call model.train() before the training loop and again after each evaluation")


def test_the_same_cnn_trained_in_training_mode_has_no_finding():
    torch.manual_seed(1)
    run = _train(_cnn())
    seen = run.meta["train_mode"]
    assert seen["norm"] == 2 and seen["dropout"] == 1 and seen["steps"] == STEPS
    assert seen["model_eval"] == seen["norm_eval"] == seen["dropout_eval"] == 0 and seen["first_step"] is None
    rep = analyze(run)
    assert _eval_mode(rep) is None and not _serious(rep), _serious(rep)


def _freeze_bn(affine: bool):
    def freeze(model):
        model.train()
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()  # keep the pretrained statistics
                if affine:
                    m.requires_grad_(False)

    return freeze


@pytest.mark.parametrize("affine", [False, True], ids=["bn-affine-trains", "bn-affine-frozen"])
def test_a_frozen_batchnorm_fine_tune_is_a_recipe_not_an_alarm(affine):
    torch.manual_seed(1)
    model = _cnn()
    _train(model, 30, record=False, first=1000)  # pretraining: the statistics are estimated
    if affine:  # the optimizer of the fine-tune holds only what trains
        _freeze_bn(True)(model)
    run = _train(model, before=_freeze_bn(affine))
    seen = run.meta["train_mode"]
    assert seen["norm_eval"] == STEPS and seen["model_eval"] == seen["dropout_eval"] == 0
    assert seen["never_estimated"] == 0
    rep = analyze(run)
    assert not _serious(rep), _serious(rep)
    d = _eval_mode(rep)
    assert d is not None and d.priority == "Low" and "fine-tuning recipe" in d.evidence


def test_batchnorm_frozen_before_its_statistics_were_estimated_is_named():
    """Only the BatchNorm modules in eval mode, from the first step of a model trained from scratch:
    they normalise with mean 0 and variance 1, which no recipe freezes."""
    torch.manual_seed(1)
    run = _train(_cnn(), before=_freeze_bn(False))
    d = analyze(run).diagnoses[0]
    assert d.cause == "eval_mode" and d.priority in ("High", "Critical")
    assert "2 of them with statistics never estimated from data (num_batches_tracked 0)" in d.evidence
    assert "remove the .eval() calls on the normalisation layers" in d.action


def _dropout_mlp() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))


def test_model_eval_left_on_in_a_model_with_only_dropout_is_medium_and_explains_nothing():
    """No normalisation module: the gradients are right, the dropout is off (Medium, no layer)."""
    torch.manual_seed(1)
    run = _train(_dropout_mlp(), evaluate_at=40)
    seen = run.meta["train_mode"]
    assert seen["norm"] == 0 and seen["dropout"] == 1 and seen["model_eval"] == seen["dropout_eval"] == STEPS - 40
    d = _eval_mode(analyze(run))
    assert d is not None and d.priority == "Medium" and d.first_step == 40 and d.layers == [] and not d.explains
    assert f"on {STEPS - 40} of {STEPS} recorded optimizer steps: its 1 dropout module off" in d.evidence
    assert d.action.startswith("call model.train() before the training loop and again after each evaluation")
    torch.manual_seed(1)
    rep = analyze(_train(_dropout_mlp()))  # trained in training mode
    assert _eval_mode(rep) is None and not _serious(rep), _serious(rep)


def test_dropout_modules_switched_off_one_by_one_while_the_model_trains_are_not_named():
    """``m.eval()`` on each dropout module (the model itself training) turns the regularisation off by
    choice, as ``p=0`` would: no finding."""
    torch.manual_seed(1)

    def off(model):
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.eval()

    run = _train(_dropout_mlp(), before=off)
    assert run.meta["train_mode"]["dropout_eval"] == STEPS and run.meta["train_mode"]["model_eval"] == 0
    assert _eval_mode(analyze(run)) is None


def test_a_model_without_normalisation_or_dropout_gets_no_probe():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 4))
    assert TrainModeCheck.of(model) is None  # nothing to read at any step
    assert TrainModeCheck.of(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.0), nn.LayerNorm(3))) is None
    run = _train(model, 20, before=lambda m: m.eval())
    assert "train_mode" not in run.meta
    assert _eval_mode(analyze(run)) is None


def test_the_check_leaves_training_bit_for_bit_the_same():
    finals = []
    for record in (False, True):
        torch.manual_seed(1)
        model = _cnn()
        _train(model, 30, record=record, evaluate_at=20)  # flags read in both modes
        finals.append(model.state_dict())
    bare, recorded = finals
    assert bare.keys() == recorded.keys()
    for k in bare:
        assert torch.equal(bare[k], recorded[k]), k
    assert int(recorded["1.num_batches_tracked"]) == 20 and np.isfinite(recorded["1.running_var"].numpy()).all()
