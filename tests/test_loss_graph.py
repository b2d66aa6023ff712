"""The loss's autograd graph (gradwidget.collect.loss_graph): real torch models whose loss is fed
softmax probabilities (or sigmoid outputs) instead of logits are diagnosed ``saturated_output``
from the structure, the same models fed logits are not, and the finding survives a run directory."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gradwidget import Recorder, analyze, load_run
from gradwidget.collect.loss_graph import LossGraph, walk


def classifier(last=None):
    torch.manual_seed(0)
    mods = [nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)]
    return nn.Sequential(*mods, *([last] if last is not None else []))


def batches(n=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(32, 8, generator=g)
        yield x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()


def train(model, criterion, steps=40, log=lambda loss: loss, **rec_kw):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Recorder(model, opt, **rec_kw) as rec:
        for x, y in batches(steps):
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            rec.log(loss=log(loss))
            opt.step()
    return rec


def softmax_ce(out, y):
    return F.cross_entropy(torch.softmax(out, dim=-1), y)


def saturated(rep):
    return [r for r in rep.diagnoses if r.cause == "saturated_output"]


def test_probabilities_into_cross_entropy_is_named_with_the_output_layer():
    rec = train(classifier(), softmax_ce)
    g = LossGraph.of_run(rec.run)
    assert g is not None and g.reached_output
    assert g.ops == ["NllLoss", "LogSoftmax", "Softmax", "Addmm"]  # loss first, down to the output Linear
    assert [m.kind for m in g.mistakes] == ["softmax_cross_entropy"] and not g.mistakes[0].in_model
    rep = analyze(rec.run)
    top = rep.diagnoses[0]
    assert top.cause == "saturated_output" and top.priority == "High"
    assert top.layers == ["2.weight", "2.bias"]  # the output layer, whose logits are squashed
    assert "softmax applied to the logits before cross_entropy" in top.evidence
    assert "log_softmax itself" in top.evidence and top.first_step == 0
    assert "pass the logits" in top.action and rep.overall_health == "Warning"


def test_a_softmax_module_as_the_models_last_module_counts_too():
    rec = train(classifier(nn.Softmax(dim=-1)), nn.CrossEntropyLoss())
    m = LossGraph.of_run(rec.run).mistakes
    assert len(m) == 1 and m[0].in_model and m[0].module == "3"
    top = analyze(rec.run).diagnoses[0]
    assert top.cause == "saturated_output" and top.layers == ["2.weight", "2.bias"]
    assert (
        "the model's last module 3" in top.evidence and "remove the softmax (the model's last module, 3)" in top.action
    )


def test_sigmoid_into_bce_with_logits_and_softmax_into_nll():
    def bce(out, y):
        return F.binary_cross_entropy_with_logits(torch.sigmoid(out), F.one_hot(y, 4).float())

    def nll(out, y):
        return F.nll_loss(torch.softmax(out, dim=-1), y)

    for crit, kind, action in [
        (bce, "sigmoid_bce_with_logits", "remove the sigmoid"),
        (nll, "softmax_nll", "use log_softmax instead of the softmax"),
    ]:
        rec = train(classifier(), crit, steps=5)
        assert [m.kind for m in LossGraph.of_run(rec.run).mistakes] == [kind]
        top = saturated(analyze(rec.run))
        assert top and action in top[0].action


@pytest.mark.parametrize(
    "criterion",
    [
        F.cross_entropy,
        lambda out, y: F.nll_loss(F.log_softmax(out, -1), y),
        lambda out, y: F.cross_entropy(out, y, label_smoothing=0.1),
        lambda out, y: F.binary_cross_entropy(torch.sigmoid(out), F.one_hot(y, 4).float()),
    ],
    ids=["cross_entropy", "log_softmax-nll", "label_smoothing", "sigmoid-bce"],
)
def test_logits_into_the_loss_is_no_alarm(criterion):
    rec = train(classifier(), criterion)
    g = LossGraph.of_run(rec.run)
    assert g is not None and g.reached_output and not g.mistakes
    assert not saturated(analyze(rec.run))


def test_the_finding_survives_a_run_directory(tmp_path):
    rec = train(classifier(), softmax_ce, log_dir=tmp_path / "run")
    back = load_run(tmp_path / "run")
    assert back.meta["loss_graph"] == rec.run.meta["loss_graph"]
    assert LossGraph.of_run(back).mistakes[0].kind == "softmax_cross_entropy"
    assert analyze(back).diagnoses[0].cause == "saturated_output"


def test_a_detached_or_number_loss_leaves_no_graph_and_the_hooks_go():
    model = classifier()
    before = (len(model._forward_hooks), len(model._forward_pre_hooks))
    rec = train(model, softmax_ce, steps=3, log=lambda loss: loss.detach(), trace_nonfinite=False)
    assert "loss_graph" not in rec.run.meta
    assert (len(model._forward_hooks), len(model._forward_pre_hooks)) == before  # detach removed them all
    model = classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, trace_nonfinite=False)
    for x, y in batches(2):
        opt.zero_grad()
        loss = softmax_ce(model(x), y)
        loss.backward()
        rec.log(loss=float(loss.detach()))
        opt.step()
    assert "loss_graph" not in rec.run.meta
    assert (len(model._forward_hooks), len(model._forward_pre_hooks)) == before  # gone after one step
    rec.detach()


def test_a_model_that_returns_its_own_loss():
    """A Hugging Face model given labels computes the loss inside its forward: the walk goes on from
    that loss (itself a model output) to the logits."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Recorder(model, opt) as rec:
        for _ in range(2):
            opt.zero_grad()
            out = model(input_ids=torch.randint(0, 32, (4, 8)), labels=torch.randint(0, 3, (4,)))
            out.loss.backward()
            rec.log(loss=out.loss)
            opt.step()
    g = LossGraph.of_run(rec.run)
    assert g.reached_output and g.ops[:2] == ["NllLoss", "LogSoftmax"] and not g.mistakes


def test_walk_is_bounded_and_reads_nothing_but_the_nodes():
    x = torch.randn(4, 3, requires_grad=True)
    y = x
    for _ in range(50):
        y = y * 1.01
    loss = F.cross_entropy(torch.softmax(y, -1), torch.zeros(4, dtype=torch.long))
    g = walk(loss.grad_fn, {}, max_nodes=10)  # no model output known: the mistake is found near the loss
    assert not g.reached_output and g.ops == [] and g.mistakes[0].ops == ["LogSoftmax", "Softmax"]
    assert LossGraph.from_dict({"mistakes": [{"kind": 1}]}) is None  # an edited meta.json: ignored
    assert LossGraph.from_dict(g.to_dict()) == g


def test_a_cross_entropy_starting_at_twice_chance_is_an_exploding_init():
    """With the graph showing a cross entropy of the model's output, a first loss above 2 x ln(classes)
    (healthy zoo runs: 0.86-1.01) is outputs too large at initialisation."""
    torch.manual_seed(0)
    layers = []
    for i in range(6):
        layers += [nn.Linear(8 if i == 0 else 32, 32), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(32, 4))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight"):
                p.mul_(3.5)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    with Recorder(model, opt) as rec:
        for x, y in batches(30):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    assert LossGraph.of_run(rec.run).cross_entropy
    start = rec.run.scalar("loss")[0] / torch.log(torch.tensor(4.0)).item()
    assert 2 < start < 5  # below the 5x that a loss of unknown kind needs
    top = analyze(rec.run).diagnoses[0]
    assert top.cause == "exploding" and top.layers[0] == "0.weight" and "initialised too large" in top.evidence


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_graph_says_whether_the_loss_is_summed_over_the_batch(reduction):
    """reduction='sum' over a batch of 256 is loss_scale, with the graph as evidence; the same large
    loss averaged (an MSE of outputs far from their targets) is not, whatever its size."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    with Recorder(model, opt) as rec:
        for _ in range(20):
            x = torch.randn(256, 8, generator=g)
            opt.zero_grad()
            loss = F.mse_loss(model(x), torch.full((256, 4), 30.0 if reduction == "mean" else 1.0), reduction=reduction)
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    graph = LossGraph.of_run(rec.run)
    assert (graph.reducer, graph.reduction, graph.summed) == ("MseLoss", reduction, reduction == "sum")
    assert rec.run.scalar("loss")[0] > 40  # both start far above a per-sample loss
    found = {r.cause: r for r in analyze(rec.run).diagnoses}
    assert ("loss_scale" in found) == (reduction == "sum")
    if reduction == "sum":
        assert "MseLoss(reduction='sum')" in found["loss_scale"].evidence


def test_a_division_above_a_summed_loss_is_a_mean_again():
    x = torch.randn(8, 3, requires_grad=True)
    y = torch.zeros(8, dtype=torch.long)
    assert walk(F.cross_entropy(x, y, reduction="sum").grad_fn).summed is True
    assert walk((F.cross_entropy(x, y, reduction="sum") / 8).grad_fn).summed is None  # divided: not a sum
    assert walk(F.cross_entropy(x, y).grad_fn).summed is False
    assert walk((F.cross_entropy(x, y) * 8).grad_fn).summed is None  # scaled: not told either


@pytest.mark.parametrize("criterion", [softmax_ce, F.cross_entropy], ids=["softmax", "logits"])
def test_without_the_graph_no_classes_are_guessed(criterion):
    """A loss logged as a number leaves no graph: nothing says the loss has classes (an output
    width is no class count), so no softmax is guessed from the loss's level either way."""
    model = classifier()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Recorder(model, opt) as rec:
        for x, y in batches(200):
            opt.zero_grad()
            loss = criterion(model(3 * x), y)  # well separated classes: the floor is reached
            loss.backward()
            rec.log(loss=float(loss.detach()))
            opt.step()
    assert "loss_graph" not in rec.run.meta
    rep = analyze(rec.run)
    assert not saturated(rep)
    assert any("logged without its graph" in n for n in rep.notes)
