"""The Recorder records the model whatever else its optimizer holds: a head
replaced after the optimizer was built records, and the analysis names the new head as
``not_in_optimizer``; a learnable loss temperature or multi-task loss weights in the same
optimizer are legitimate and record without a word beyond ``repr``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gradwidget import analyze
from gradwidget.collect.torch import Recorder

transformers = pytest.importorskip("transformers")


def _distilbert(labels: int = 3):
    torch.manual_seed(0)
    cfg = transformers.DistilBertConfig(
        vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=16, num_labels=labels
    )
    return transformers.DistilBertForSequenceClassification(cfg)


def _batch(step: int, labels: int = 3):
    g = torch.Generator().manual_seed(step % 4)
    return torch.randint(0, 100, (8, 12), generator=g), torch.randint(0, labels, (8,), generator=g)


def test_a_head_replaced_after_the_optimizer_was_built_records_and_is_named():
    model = _distilbert()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.classifier, model.num_labels = nn.Linear(32, 5), 5  # the mistake: the new head is not in opt
    rec = Recorder(model, opt)  # recorded, not refused
    for i in range(24):
        x, y = _batch(i, 5)
        opt.zero_grad()
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    assert "ignoring 2 of the optimizer's" in repr(rec) and "5x32, 5" not in repr(rec)
    assert "3x32, 3" in repr(rec)  # the old head's weight and bias, left in the optimizer
    assert rec.run.meta["optimizer_extra"]["tensors"] == 2
    assert {"classifier.weight", "classifier.bias"} <= set(rec.run.layer_names)
    causes = [r for r in analyze(rec.run).diagnoses if r.cause == "not_in_optimizer"]
    assert causes, analyze(rec.run).diagnoses
    assert set(causes[0].layers) == {"classifier.weight", "classifier.bias"}


class _Contrastive(nn.Module):
    """A CLIP-style learnable temperature lives beside the model, in the same optimizer."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))

    def forward(self, x):
        return nn.functional.normalize(self.enc(x), dim=-1)


@pytest.mark.parametrize("setup", ["temperature", "multi-task weights"])
def test_loss_parameters_in_the_same_optimizer_are_legitimate(setup):
    torch.manual_seed(0)
    if setup == "temperature":
        model = _Contrastive()
        extra = [nn.Parameter(torch.tensor(2.6593))]  # log(1/0.07), as CLIP
    else:
        model = _distilbert()
        extra = [nn.Parameter(torch.zeros(2))]  # log-variances of two task losses (Kendall et al.)
    opt = torch.optim.AdamW([{"params": model.parameters()}, {"params": extra, "weight_decay": 0.0}], lr=1e-3)
    rec = Recorder(model, opt)  # no warning: the tests turn any into an error
    for i in range(12):
        opt.zero_grad()
        if setup == "temperature":
            a, b = model(torch.randn(8, 16)), model(torch.randn(8, 16))
            logits = a @ b.T * extra[0].exp()
            loss = nn.functional.cross_entropy(logits, torch.arange(8))
        else:
            x, y = _batch(i)
            out = model(input_ids=x, labels=y)
            aux = out.logits.pow(2).mean()
            loss = sum(torch.exp(-s) * task + s for s, task in zip(extra[0], (out.loss, aux)))
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    assert rec.run.n_steps == 12 and "ignoring 1 of the optimizer's" in repr(rec)
    assert not [r for r in analyze(rec.run).diagnoses if r.cause == "not_in_optimizer"]


def test_an_optimizer_of_another_model_is_still_refused():
    with pytest.raises(ValueError, match="holds none of this Linear's parameters"):
        Recorder(nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))
