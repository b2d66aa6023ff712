"""trace_nonfinite="auto": the NaN-origin tracer measures its own cost and turns itself off where it
costs more than it is worth (thousands of tiny modules), and stays on where it is cheap (a toy MLP)."""

from __future__ import annotations

import warnings

import nonfinite_cases as nc
import pytest
import torch
from torch import nn

from gradwidget import analyze, load_run
from gradwidget._warnings import GradwidgetWarning
from gradwidget.collect import _trace_cost
from gradwidget.collect._trace_cost import CostMeter, TraceCost
from gradwidget.collect.torch import Recorder


def _tiny_modules(n: int = 200) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(n)])


def _train(model, rec, opt, steps: int, nan_at: int | None = None) -> None:
    for i in range(steps):
        opt.zero_grad()
        x = torch.randn(4, 2)
        if i == nan_at:
            x[0, 0] = float("nan")
        model(x).pow(2).mean().backward()
        opt.step()


def _warnings_of(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, GradwidgetWarning)]


def test_many_tiny_modules_turn_tracing_off_once_with_the_measured_cost(monkeypatch):
    # the floor is the constant that depends on the machine's speed: set to 0 here, the share alone
    # decides (the hooks cost several times a tiny Linear's own work, far above AUTO_SHARE)
    monkeypatch.setattr(_trace_cost, "AUTO_FLOOR_S", 0.0)
    model = _tiny_modules()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    assert rec.trace_nonfinite == "auto" and "NaN tracing on" in repr(rec)
    msgs = _warnings_of(lambda: _train(model, rec, opt, 8))
    off = [m for m in msgs if "NaN-origin tracing turned off" in m]
    assert len(off) == 1, msgs  # said once
    stop = _trace_cost.WARMUP_STEPS + _trace_cost.MEASURED_STEPS - 1  # steps count from 0
    assert f"at step {stop}" in off[0] and "trace_nonfinite=True" in off[0]
    assert "ms per step" in off[0] and "of the step" in off[0]
    assert "201 module calls per step" in off[0]  # the Sequential and its 200 Linears
    assert rec._tracer is None
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())  # hooks removed
    assert rec.run.meta["nonfinite_tracing"]["stopped_at_step"] == stop
    assert f"NaN tracing off since step {stop}" in repr(rec)
    rec.detach()


def test_true_keeps_tracing_whatever_it_costs(monkeypatch):
    monkeypatch.setattr(_trace_cost, "AUTO_FLOOR_S", 0.0)
    monkeypatch.setattr(_trace_cost, "AUTO_SHARE", 0.0)
    model = _tiny_modules(50)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, trace_nonfinite=True)
    msgs = _warnings_of(lambda: _train(model, rec, opt, 6, nan_at=5))
    assert not [m for m in msgs if "tracing turned off" in m]
    assert rec.run.nonfinite_origin is not None and rec.run.nonfinite_origin.step == 5
    assert "nonfinite_tracing" not in rec.run.meta
    rec.detach()


def test_a_toy_mlp_keeps_tracing_under_auto_and_names_the_origin():
    case = nc.CASES["forward, parameter-free"]
    msgs = _warnings_of(lambda: nc.train(case, steps=nc.STEPS + 3))
    assert not [m for m in msgs if "tracing turned off" in m]
    rec = nc.train.last
    o = rec.run.nonfinite_origin
    assert (o.module, o.step, o.phase) == ("block.1", nc.BAD, "forward")
    assert rec._trace_off is None and "nonfinite_tracing" not in rec.run.meta
    assert rec._trace_measured is not None and not rec._trace_measured.too_dear  # measured, and kept


def test_repr_says_tracing_was_measured_and_kept(monkeypatch):
    monkeypatch.setattr(_trace_cost, "AUTO_SHARE", 1.0)  # nothing is too dear
    model = _tiny_modules(10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    assert "measuring its cost" in repr(rec)
    _train(model, rec, opt, 5)
    assert "NaN tracing on (trace_nonfinite='auto': its hooks took" in repr(rec) and "kept" in repr(rec)
    rec.detach()


def test_a_nan_after_tracing_stopped_says_why_its_origin_is_unknown(monkeypatch, tmp_path):
    monkeypatch.setattr(_trace_cost, "AUTO_FLOOR_S", 0.0)
    model = _tiny_modules(100)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, log_dir=tmp_path / "run")
    _warnings_of(lambda: _train(model, rec, opt, 8, nan_at=6))
    rec.detach()
    assert rec.run.nonfinite_origin is None and rec.run.nonfinite().any()
    for run in (rec.run, load_run(tmp_path / "run")):  # saved with the run
        stop = run.meta["nonfinite_tracing"]["stopped_at_step"]
        found = [r for r in analyze(run).diagnoses if getattr(r, "cause", None) == "nonfinite"]
        assert found, analyze(run).diagnoses
        text = found[0].evidence
        assert f"origin not traced: tracing was turned off at step {stop} because its hooks took" in text


@pytest.mark.parametrize("nan_at", [2, 3])  # 3: the step whose end decides
def test_a_nan_before_the_decision_is_still_traced(monkeypatch, nan_at):
    """The steps traced before tracing stops are searched first: a NaN among them keeps its origin."""
    monkeypatch.setattr(_trace_cost, "AUTO_FLOOR_S", 0.0)
    monkeypatch.setattr(_trace_cost, "AUTO_SHARE", 0.0)
    model = _tiny_modules(20)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, every=100)  # records step 0 only: the NaN's step is traced, not recorded
    _warnings_of(lambda: _train(model, rec, opt, 6, nan_at=nan_at))
    o = rec.run.nonfinite_origin
    assert o is not None and (o.module, o.step, o.phase) == ("", nan_at, "input")  # the model was given it
    assert "nonfinite_tracing" not in rec.run.meta
    rec.detach()


def test_the_meter_skips_the_warm_up_and_decides_once():
    now = iter([5.0, 5.1, 5.3, 5.6, 6.0])
    meter = CostMeter(clock=lambda: next(now))
    hooks = [9.0, 0.05, 0.05, 0.05, 0.05]  # the first step's hooks (first forward) are not counted
    got = [meter.end_step(i, h, 10) for i, h in enumerate(hooks)]
    assert got[:3] == [None, None, None] and got[4] is None  # decided once
    cost = got[3]
    assert cost is not None and cost.step == 3
    # a step's wall time runs from the end of the one before: steps 1-3 took 0.1, 0.2 and 0.3 s
    assert cost.step_s == pytest.approx(0.2) and cost.hook_s == pytest.approx(0.05) and cost.calls == 10
    assert cost.share == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("hook_s", "step_s", "dear"),
    [
        (0.25, 0.35, True),  # 5,000 tiny Linears: a large share and many ms
        (0.0003, 0.002, False),  # a toy MLP: a large share of a tiny step, a fraction of a ms
        (0.003, 0.08, False),  # a transformer: some ms, a small share
        (0.02, 1.0, False),  # a big model: many ms, a small share
    ],
)
def test_both_the_share_and_the_floor_must_be_passed(hook_s, step_s, dear):
    assert TraceCost(4, hook_s, step_s, 100).too_dear is dear


def test_false_traces_and_measures_nothing():
    rec = Recorder(nn.Linear(2, 2), trace_nonfinite=False)
    assert rec._trace_meter is None and "NaN tracing off (trace_nonfinite=False)" in repr(rec)


def test_auto_keeps_tracing_on_under_torch_distributed(monkeypatch):
    """Ranks timing their own steps could decide apart: under a process group "auto" measures
    nothing and keeps tracing on (a one-process gloo group here)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already open")
    monkeypatch.setattr(_trace_cost, "AUTO_FLOOR_S", 0.0)
    monkeypatch.setattr(_trace_cost, "AUTO_SHARE", 0.0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _tiny_modules(20)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        rec = Recorder(model, opt)
        msgs = _warnings_of(lambda: _train(model, rec, opt, 6))
        assert rec._trace_meter is None and rec._tracer is not None
        assert not [m for m in msgs if "tracing turned off" in m]
        assert "kept on under torch.distributed" in repr(rec)
        rec.detach()
    finally:
        dist.destroy_process_group()
