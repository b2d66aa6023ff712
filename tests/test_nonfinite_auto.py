"""trace_nonfinite="auto" (the default): the NaN origin by replaying the first non-finite step (one
hook on the root module on finite steps); the per-module tracer runs on alternate warm-up steps,
its whole cost measured as wall-clock steps with and without its hooks, and stays only where it
is free. The budget is a module constant, set by the tests: no assertion here depends on timing."""

from __future__ import annotations

import warnings

import nonfinite_cases as nc
import pytest
import torch
from torch import nn

from gradwidget import analyze, load_run
from gradwidget._warnings import GradwidgetWarning
from gradwidget.collect import _replay, _trace_cost
from gradwidget.collect._trace_cost import PairedMeter, TraceCost
from gradwidget.collect.torch import Recorder

#: steps until "auto" has decided: the warm-up, then the pairs
DECIDED = _trace_cost.WARMUP_STEPS + 2 * _trace_cost.MEASURED_PAIRS


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


def _no_hooks(model) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def _gradwidget_warnings(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in caught if issubclass(w.category, GradwidgetWarning)]


def test_a_dear_tracer_is_taken_off_and_the_replay_still_names_the_origin(monkeypatch):
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", 0.0)  # whatever it measures is too dear
    model = _tiny_modules()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    assert rec.trace_nonfinite == "auto" and "while its cost is measured" in repr(rec)
    msgs = _gradwidget_warnings(lambda: _train(model, rec, opt, DECIDED + 1))
    assert not msgs  # nothing is lost: no warning
    assert rec._tracer is None and rec._trace_measured is not None
    assert "NaN origin by replaying the first non-finite step" in repr(rec)
    assert "per-module tracing off: steps took" in repr(rec) and "201 module calls per step" in repr(rec)
    # only the replay's two hooks on the root module are left
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in list(model.modules())[1:])
    assert len(model._forward_pre_hooks) == 1 and len(model._forward_hooks) == 1
    _train(model, rec, opt, 3, nan_at=1)
    o = rec.run.nonfinite_origin
    assert (o.module, o.step, o.phase) == ("", DECIDED + 2, "input")  # the model was given it
    assert _no_hooks(model)  # found: every hook is gone
    assert "nonfinite_tracing" not in rec.run.meta
    rec.detach()


def test_a_free_tracer_is_kept(monkeypatch):
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", float("inf"))
    model = _tiny_modules(10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    _train(model, rec, opt, DECIDED + 1)
    assert rec._tracer is not None and rec._tracer.attached
    assert "NaN tracing on (trace_nonfinite='auto': steps took" in repr(rec) and "kept" in repr(rec)
    rec.detach()
    assert _no_hooks(model)


@pytest.mark.parametrize("share", [0.0, float("inf")])
@pytest.mark.parametrize("name", list(nc.CASES))
def test_every_case_is_named_whether_the_tracer_stays_or_not(monkeypatch, name, share):
    """The nonfinite cases go bad at step 3, while "auto" is still measuring (the tracer on
    alternate steps): step 3 runs without its hooks, so the replay names it."""
    case = nc.CASES[name]
    if name.startswith("Hugging Face"):
        pytest.importorskip("transformers")
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", share)
    origin = nc.train(case, steps=DECIDED + 2)
    assert origin is not None and (origin.module, origin.step, origin.phase) == case.expected
    assert _no_hooks(nc.train.last.model)


def test_the_hooks_alternate_during_the_warm_up():
    model = _tiny_modules(4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    seen = []
    for _ in range(DECIDED):
        seen.append(rec._tracer.attached)
        _train(model, rec, opt, 1)
    assert seen[: _trace_cost.WARMUP_STEPS] == [True] * _trace_cost.WARMUP_STEPS
    measured = seen[_trace_cost.WARMUP_STEPS :]
    assert measured.count(True) == measured.count(False) == _trace_cost.MEASURED_PAIRS
    assert all(a != b for a, b in zip(measured, measured[1:]))  # paired: on and off in turn
    rec.detach()


def test_the_meter_pairs_steps_and_compares_medians():
    now = [0.0]
    meter = PairedMeter(clock=lambda: now[0], cpu_clock=lambda: now[0] / 2)
    meter.restart()  # the Recorder starts the clock after switching the hooks
    got, kinds = [], []
    for step in range(DECIDED):
        kinds.append(meter.tracing)
        # the warm-up step is slow (not counted); then a step with the hooks takes 0.2 s, one without 0.1 s
        now[0] += 5.0 if step < _trace_cost.WARMUP_STEPS else (0.2 if meter.tracing else 0.1)
        got.append(meter.end_step(step, 7))
        now[0] += 0.05  # switching the hooks: not in either
        meter.restart()
    cost = got[-1]
    assert got[:-1] == [None] * (DECIDED - 1) and cost is not None and cost.step == DECIDED - 1
    assert cost.on_s == pytest.approx(0.2) and cost.off_s == pytest.approx(0.1) and cost.ratio == pytest.approx(2)
    assert cost.cpu_ratio == pytest.approx(2) and cost.calls == 7 and cost.too_dear
    assert meter.end_step(DECIDED, 7) is None  # decided once


@pytest.mark.parametrize(
    ("on", "off", "cpu", "dear"),
    [(1.5, 1.0, 1.5, True), (1.01, 1.0, 1.0, False), (0.99, 1.0, 1.01, False), (0.73, 1.0, 1.1, True)],
)
def test_the_budget_is_the_ratio_of_medians_on_both_clocks(on, off, cpu, dear):
    # the last: wall time on a shared machine said 0.73x; CPU time says what the hooks cost
    assert TraceCost(8, on, off, 100, cpu).too_dear is dear


def test_a_nan_made_at_a_step_not_recorded_is_said_not_guessed(monkeypatch, tmp_path):
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", 0.0)
    model = _tiny_modules(20)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, every=2, log_dir=tmp_path / "run")
    bad = DECIDED + 2 + (DECIDED % 2 == 0)  # an odd step: not recorded; the next one is
    _train(model, rec, opt, bad + 3, nan_at=bad)
    rec.detach()
    assert rec.run.nonfinite_origin is None and rec.run.nonfinite().any()
    for run in (rec.run, load_run(tmp_path / "run")):  # saved with the run
        off = run.meta["nonfinite_tracing"]
        assert off["stopped_at_step"] == bad + 1 and "weights were already non-finite" in off["reason"]
        found = [r for r in analyze(run).diagnoses if getattr(r, "cause", None) == "nonfinite"]
        assert found and "origin not traced" in found[0].evidence, analyze(run).diagnoses
    assert "NaN origin not found" in repr(rec)


def test_the_replay_leaves_buffers_and_random_numbers_as_they_were():
    """A BatchNorm's running statistics and the random stream go on exactly as without a replay."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn, self.drop = nc.ForwardNet().stem, nn.BatchNorm1d(16), nn.Dropout(0.5)
            self.act, self.norm, self.head = nn.ReLU(), nc.Normalize(), nn.Linear(16, 2)

        def forward(self, x):
            h = self.stem(x)  # positive weights, no bias: all negative for x = -1
            return self.head(self.norm(self.act(h)) + self.drop(self.bn(h)))  # 0/0 in norm then

    def run(trace):
        torch.manual_seed(0)
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        rec = Recorder(model, opt, trace_nonfinite=trace)
        for i in range(2):  # step 1 runs without the tracer's hooks ("auto" alternates them): replayed
            opt.zero_grad()
            model(-torch.ones(8, 4) if i == 1 else torch.rand(8, 4)).pow(2).mean().backward()
            opt.step()
        rec.detach()
        return rec.run.nonfinite_origin, [b.clone() for b in model.bn.buffers()], torch.rand(3)

    origin, bufs, rand = run("auto")
    _, bufs0, rand0 = run(False)
    assert origin is not None and (origin.module, origin.step, origin.phase) == ("norm", 1, "forward")
    for a, b in zip(bufs, bufs0):  # the running statistics were updated once, not twice
        assert torch.equal(a, b)
    assert torch.equal(rand, rand0)  # dropout's random numbers were drawn again in the replay, and put back


def test_a_big_output_gradient_is_not_held(monkeypatch):
    """Beyond KEEP_GRAD_BYTES the output's gradient is not kept: the backward cannot be replayed,
    and the run says the origin was put on the first layer the NaN reached instead."""
    monkeypatch.setattr(_replay, "KEEP_GRAD_BYTES", 0)
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", 0.0)
    origin = nc.train(nc.CASES["backward only, sqrt(0)"], steps=DECIDED + 2)
    # step 3 runs without the tracer's hooks (it is measuring); the forward replay is finite, so the
    # gradients tell where the NaN reached: the stem, the module of the first bad parameter
    assert origin is not None and origin.step == nc.BAD and origin.phase == "backward"
    assert "not replayed" in nc.train.last.run.meta["nonfinite_tracing"]["reason"]


def test_false_traces_and_measures_nothing():
    rec = Recorder(nn.Linear(2, 2), trace_nonfinite=False)
    assert rec._trace_meter is None and rec._replay is None and "NaN tracing off (trace_nonfinite=False)" in repr(rec)


def test_auto_keeps_tracing_on_under_torch_distributed(monkeypatch):
    """Ranks timing their own steps could decide apart: under a process group "auto" measures
    nothing and keeps tracing on (a one-process gloo group here)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already open")
    monkeypatch.setattr(_trace_cost, "TRACER_SHARE", 0.0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _tiny_modules(20)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        rec = Recorder(model, opt)
        _train(model, rec, opt, DECIDED + 1)
        assert rec._trace_meter is None and rec._tracer is not None and rec._replay is None
        assert "kept on under torch.distributed" in repr(rec)
        rec.detach()
    finally:
        dist.destroy_process_group()
