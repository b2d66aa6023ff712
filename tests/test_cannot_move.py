"""A parameter the loss cannot move (its gradient zero up to float rounding by the model's symmetry)
is measured, not named: marked "Cannot move" everywhere a layer's health shows, never vanishing,
weak or dead, never the default selection; a starved layer is still flagged whatever its name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from gradwidget import Recorder, plots
from gradwidget.analysis import analyze
from gradwidget.fallback import health_table_html
from gradwidget.panel import payload as P
from gradwidget.panel.protocol import FLAG_VANISHING
from gradwidget.panel.table import analyse
from gradwidget.rules import CANNOT_MOVE, CANNOT_MOVE_WHY, EPS, cannot_move, rounding_ratio
from gradwidget.thresholds import Thresholds


def _train(model, batch, loss_fn, steps, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    with Recorder(model, opt) as rec:
        for i in range(steps):
            opt.zero_grad()
            loss = loss_fn(model, batch(i))
            loss.backward()
            rec.log(loss=loss)
            opt.step()
    return rec.run


def _named(rep, health):
    return set(rep.layers.loc[rep.layers["health"] == health, "layer"])


def _diagnosed(rep):
    return {n for d in rep.diagnoses for n in d.layers}


# --------------------------------------------------------------------------- the rule on arrays
def _rule(
    bias_ratio,
    weight=1e-3,
    zero_frac_w=0.0,
    steps=20,
    first_ratio=None,
    dtype="float32",
    zero_frac_b=0.0,
    nonfinite_after=None,
):
    """A module of a weight (mean |g| ``weight``) and a bias at ``bias_ratio`` times it."""
    rng = np.random.default_rng(0)
    w = weight * np.exp(0.3 * rng.standard_normal(steps))
    b = w * bias_ratio * np.exp(0.3 * rng.standard_normal(steps))
    if first_ratio is not None:
        b[0] = w[0] * first_ratio
    ma = np.stack([w, b], axis=1)
    zf = np.zeros_like(ma)
    zf[:, 0] = zero_frac_w
    zf[:, 1] = zero_frac_b
    nf = np.zeros_like(ma)
    if nonfinite_after is not None:  # NaN/Inf gradients from that step on
        ma[nonfinite_after:], nf[nonfinite_after:] = np.nan, 16
    limit = np.full(2, rounding_ratio(dtype))
    return cannot_move(ma, zf, nf, np.zeros(2, np.intp), limit, np.ones(2, bool), Thresholds())


def test_the_rule_reads_rounding_against_its_module_not_a_name_or_an_absolute_level():
    assert rounding_ratio("float32") == pytest.approx(np.sqrt(2.0**-23))
    assert rounding_ratio("bfloat16") == pytest.approx(np.sqrt(EPS["bfloat16"]))
    assert rounding_ratio("int64") == 0  # no float: never
    assert list(_rule(1e-7)) == [False, True]  # float32 rounding next to a healthy weight
    assert list(_rule(1e-7, weight=1e-12)) == [False, False]  # the module itself vanishes: no reference
    assert list(_rule(1e-7, zero_frac_w=1.0)) == [False, False]  # the weight is exact zeros (dead): none
    assert list(_rule(0.0, zero_frac_b=1.0)) == [False, False]  # exact zeros beside a live tensor: dead, not rounding
    assert list(_rule(1e-2)) == [False, False]  # 100x below its weight: small, but signal (e.g. raw inputs)
    assert list(_rule(1e-7, first_ratio=0.5)) == [False, False]  # not from the first step: it became small
    assert list(_rule(1e-3, dtype="bfloat16")) == [False, True]  # bfloat16 rounds 65,000x coarser
    assert list(_rule(1e-3, dtype="float32")) == [False, False]
    # one finite step, then NaN/Inf gradients (a float16 net): no run of rounding to judge by
    assert list(_rule(1e-7, nonfinite_after=1)) == [False, False]


# --------------------------------------------------------------------------- a BERT-style model
@pytest.fixture(scope="module")
def bert_run():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    V, T = 100, 16
    cfg = transformers.BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=T,
        num_labels=2,
    )
    model = transformers.BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(0)

    def batch(i):
        x = torch.randint(2, V, (32, T), generator=g)
        y = torch.randint(0, 2, (32,), generator=g)
        x[:, 3] = y  # the label is a marker token
        return x, y

    return _train(model, batch, lambda m, b: m(input_ids=b[0], labels=b[1]).loss, 60, 1e-3)


def test_a_bert_key_bias_cannot_move_and_is_neither_vanishing_nor_selected(bert_run):
    run = bert_run
    keys = [n for n in run.layer_names if n.endswith("attention.self.key.bias")]
    assert len(keys) == 2
    cols = [run.layer_index(n) for n in keys]
    assert set(np.flatnonzero(run.cannot_move())) == set(cols)  # those, measured, and no other tensor
    assert not run.vanishing()[:, cols].any()  # one rule: the Run's flags leave them out
    rep = analyze(run)
    assert _named(rep, CANNOT_MOVE) == set(keys)
    assert not _diagnosed(rep) & set(keys)
    assert not {f.layer for f in rep.risk_factors} & set(keys)  # no vanishing / weak / dead factor
    assert (rep.health.set_index("layer").loc[keys, "health"] == CANNOT_MOVE).all()  # health.py's per-layer table
    assert "2 cannot move" in rep.summary_parts().graded
    assert run.layer_names[plots.default_layer(run)] not in keys


def test_the_panel_and_the_static_table_mark_it_with_why(bert_run):
    run = bert_run
    keys = {n for n in run.layer_names if n.endswith("attention.self.key.bias")}
    report, rows, _ = analyse(run)  # the panel's path: the ``table`` trait's rows
    marked = {r["layer"]: r for r in rows if r["health"] == CANNOT_MOVE}
    assert set(marked) == keys
    assert all(CANNOT_MOVE_WHY in r["suggestion"] for r in marked.values())
    meta, arrays = P.heat_view(run, "grad_norm", 64)
    flags = arrays["flags"]
    for n in keys:  # no grey "vanishing" cells on its heatmap row
        assert not (flags[run.layer_index(n)] & FLAG_VANISHING).any()
    html = health_table_html(report)  # the static panel's and the report's table
    assert html.count(f">{CANNOT_MOVE}</td>") == 2
    assert html.count(f'title="{CANNOT_MOVE_WHY.replace(chr(39), "&#x27;")}"') == 2


# --------------------------------------------------------------------------- a bias before BatchNorm
def test_a_linear_bias_before_batchnorm_cannot_move():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))
    x, y = torch.randn(256, 20), torch.randint(0, 3, (256,))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    g = torch.Generator().manual_seed(0)

    def batch(i):
        b = torch.randint(0, 256, (64,), generator=g)
        return x[b], y[b]

    run = _train(model, batch, lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), 40, 1e-2)
    assert [run.layer_names[i] for i in np.flatnonzero(run.cannot_move())] == ["0.bias"]
    rep = analyze(run)
    assert _named(rep, CANNOT_MOVE) == {"0.bias"}
    assert not rep.diagnoses, [(d.cause, d.evidence) for d in rep.diagnoses]  # not "unnormalised inputs"


# --------------------------------------------------------------------------- starved layers stay flagged
def _deep_sigmoid(first: str):
    """A 14-layer sigmoid MLP whose gradient vanishes towards its input; its first Linear is
    called ``first``."""
    torch.manual_seed(0)
    layers = [(first, nn.Linear(20, 32)), ("act0", nn.Sigmoid())]
    for i in range(1, 13):
        layers += [(f"fc{i}", nn.Linear(32, 32)), (f"act{i}", nn.Sigmoid())]
    layers.append(("out", nn.Linear(32, 3)))
    from collections import OrderedDict

    model = nn.Sequential(OrderedDict(layers))
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    return _train(model, lambda i: (x, y), lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]), 30, 1e-2)


@pytest.mark.parametrize("first", ["fc0", "key"])
def test_a_vanishing_region_is_vanishing_weight_and_bias_whatever_the_name(first):
    """The early layers of a deep sigmoid net fade weight and bias together: vanishing, never
    "cannot move"; a first layer called ``key`` (its bias ``key.bias``) is no exception."""
    run = _deep_sigmoid(first)
    assert not run.cannot_move().any()
    rep = analyze(run)
    assert not _named(rep, CANNOT_MOVE)
    van = next(d for d in rep.diagnoses if d.cause == "vanishing")
    assert {f"{first}.weight", f"{first}.bias"} <= set(van.layers)
    h = rep.layers.set_index("layer")["health"]
    assert h[f"{first}.bias"] in ("Warning", "Critical")
    assert "vanishing" in rep.layers.set_index("layer").loc[f"{first}.bias", "flags"]
