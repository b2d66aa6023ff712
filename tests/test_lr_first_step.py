"""A learning rate far too high for an adaptive optimizer, seen at its first step: AdamW's first
update moves each weight by about the learning rate, so on a small random-init BERT-style classifier
trained by the Hugging Face Trainer at 50x a rate that works, the first step moves the typical layer
by more than its whole weight norm; the loss then sits at chance. The panel must name the learning
rate (with the grey collapse that followed), not the data; the run at the rate that works stays
without a finding."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs"))
from screenshots import BERT_LR, BERT_LR_HIGH, train_bert  # noqa: E402  (the docs' pictures train the same)

from gradwidget import analyze  # noqa: E402
from gradwidget.storage import load_run  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for key, lr in (("good", BERT_LR), ("high", BERT_LR_HIGH)):
        d = tmp_path_factory.mktemp(key) / "run"
        out[key] = (train_bert(d, lr), analyze(load_run(d)))
    return out


def test_the_rate_that_works_trains_and_is_left_alone(runs):
    trained, report = runs["good"]
    assert trained["accuracy"] >= 0.95, trained
    assert report.diagnoses == [], [(d.priority, d.cause) for d in report.diagnoses]


def test_a_rate_50x_too_high_is_named_from_the_first_step_not_as_data_that_teaches_nothing(runs):
    trained, report = runs["high"]
    assert trained["accuracy"] <= 0.65, trained
    top = report.diagnoses[0]
    assert top.cause == "lr_too_high" and top.priority in ("Critical", "High"), [
        (d.priority, d.cause) for d in report.diagnoses
    ]
    assert "learns_nothing" not in [d.cause for d in report.diagnoses]
    assert top.first_step == 1  # the Trainer's first step (its steps count from 1)
    assert "of its weight norm at step 1" in top.evidence and "first step moves each weight" in top.evidence
    assert "grey in the heatmap" in top.evidence, top.evidence
    assert "from 0.025 (the schedule's peak" in top.action and "to 0.0025" in top.action, top.action
