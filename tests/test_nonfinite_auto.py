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
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)  # whatever it measures is too dear
    model = _tiny_modules()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    assert rec.trace_nonfinite == "auto" and "while its cost is measured" in repr(rec)
    msgs = _gradwidget_warnings(lambda: _train(model, rec, opt, DECIDED + 1))
    assert not msgs  # nothing is lost: no warning
    assert rec._nonfinite.tracer is None and rec._nonfinite.measured is not None
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
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", float("inf"))
    monkeypatch.setattr(_trace_cost, "EARLY_OFF", float("inf"))
    model = _tiny_modules(10)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    _train(model, rec, opt, DECIDED + 1)
    assert rec._nonfinite.tracer is not None and rec._nonfinite.tracer.attached
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
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", share)
    origin = nc.train(case, steps=DECIDED + 2)
    assert origin is not None and (origin.module, origin.step, origin.phase) == case.expected
    assert _no_hooks(nc.train.last.model)


def test_the_hooks_alternate_during_the_warm_up(monkeypatch):
    monkeypatch.setattr(_trace_cost, "EARLY_OFF", float("inf"))  # (a busy machine must not end it early)
    model = _tiny_modules(4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    seen = []
    for _ in range(DECIDED):
        seen.append(rec._nonfinite.tracer.attached)
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
        # the warm-up step is slow (not counted); then a step with the hooks takes 0.12 s, one without 0.1 s
        now[0] += 5.0 if step < _trace_cost.WARMUP_STEPS else (0.12 if meter.tracing else 0.1)
        got.append(meter.end_step(step, 7))
        now[0] += 0.05  # switching the hooks: not in either
        meter.restart()
    cost = got[-1]
    assert got[:-1] == [None] * (DECIDED - 1) and cost is not None and cost.step == DECIDED - 1
    assert cost.on_s == pytest.approx(0.12) and cost.off_s == pytest.approx(0.1) and cost.ratio == pytest.approx(1.2)
    assert cost.cpu_ratio == pytest.approx(1.2) and cost.calls == 7 and cost.too_dear
    assert cost.wall_upper == pytest.approx(1.2) and cost.cpu_upper == pytest.approx(1.2)
    assert cost.pairs == _trace_cost.MEASURED_PAIRS
    assert meter.end_step(DECIDED, 7) is None  # decided once


def _measure(times_on: list[float], times_off: list[float]):
    """A meter fed steps with and without the hooks in turn (after a slow warm-up step)."""
    now = [0.0]
    meter = PairedMeter(clock=lambda: now[0], cpu_clock=lambda: now[0])
    meter.restart()
    on, off = iter(times_on), iter(times_off)
    cost = None
    for step in range(DECIDED):
        now[0] += 5.0 if step < _trace_cost.WARMUP_STEPS else next(on if meter.tracing else off)
        cost = meter.end_step(step, 7) or cost
        meter.restart()
    return cost


def test_a_tracer_is_kept_only_when_every_pair_shows_it_within_its_share():
    """The medians alone say 1.00x, but one pair took 1.10x: the noise does not let the tracer be
    called free (the largest of four paired ratios bounds its cost with 94% confidence)."""
    noisy = _measure([0.100, 0.110, 0.100, 0.100], [0.100, 0.100, 0.100, 0.100])
    assert noisy.ratio == pytest.approx(1.0) and noisy.wall_upper == pytest.approx(1.1)
    assert noisy.too_dear and "at most 1.10x" in noisy.text()
    steady = _measure([0.101, 0.1015, 0.100, 0.1005], [0.100, 0.100, 0.100, 0.100])
    assert steady.wall_upper == pytest.approx(1.015) and not steady.too_dear


def test_a_tracer_far_over_budget_is_taken_off_after_one_pair():
    now = [0.0]
    meter = PairedMeter(clock=lambda: now[0], cpu_clock=lambda: now[0])
    meter.restart()
    got = []
    for step in range(6):
        now[0] += 5.0 if step < _trace_cost.WARMUP_STEPS else (0.3 if meter.tracing else 0.1)
        got.append(meter.end_step(step, 7))
        meter.restart()
    decided = [k for k, c in enumerate(got) if c is not None]
    assert decided == [_trace_cost.WARMUP_STEPS + 1]  # one step without, one with: 3x, off
    assert got[decided[0]].too_dear


@pytest.mark.parametrize(
    ("on", "off", "cpu", "dear"),
    [
        (1.5, 1.0, 1.5, True),
        (1.01, 1.0, 1.0, False),
        (0.99, 1.0, 1.01, False),
        (0.73, 1.0, 1.1, True),
        (0.83, 1.0, 0.83, True),
    ],
)
def test_the_budget_is_the_ratio_of_medians_on_both_clocks(on, off, cpu, dear):
    # (0.73, 1.1): wall time on a shared machine said 0.73x; CPU time says what the hooks cost.
    # (0.83, 0.83): the steps without hooks carried other work (a panel's first updates): unmeasured
    cost = TraceCost(8, on, off, 100, cpu)
    assert cost.too_dear is dear
    assert ("other work measured" in cost.text()) is (min(on / off, cpu) < 2 - _trace_cost.INSTRUMENT_SHARE)


def test_a_nan_made_at_a_step_not_recorded_is_said_not_guessed(monkeypatch, tmp_path):
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)
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
        assert found and "origin not traced at step" in found[0].evidence, analyze(run).diagnoses
        assert "trace_nonfinite=True" in found[0].action  # the one change that finds it next time
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
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)
    origin = nc.train(nc.CASES["backward only, sqrt(0)"], steps=DECIDED + 2)
    # step 3 runs without the tracer's hooks (it is measuring); the forward replay is finite, so the
    # gradients tell where the NaN reached: the stem, the module of the first bad parameter
    assert origin is not None and origin.step == nc.BAD and origin.phase == "backward"
    assert "not replayed" in nc.train.last.run.meta["nonfinite_tracing"]["reason"]


def test_false_traces_and_measures_nothing():
    rec = Recorder(nn.Linear(2, 2), trace_nonfinite=False)
    assert (
        rec._nonfinite.meter is None
        and rec._nonfinite.replay is None
        and "NaN tracing off (trace_nonfinite=False)" in repr(rec)
    )


def test_auto_keeps_tracing_on_under_torch_distributed(monkeypatch):
    """Ranks timing their own steps could decide apart: under a process group "auto" measures
    nothing and keeps tracing on (a one-process gloo group here)."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group already open")
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = _tiny_modules(20)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        rec = Recorder(model, opt)
        _train(model, rec, opt, DECIDED + 1)
        assert rec._nonfinite.meter is None and rec._nonfinite.tracer is not None and rec._nonfinite.replay is None
        assert "kept on under torch.distributed" in repr(rec)
        rec.detach()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("trace", ["auto", True])
def test_gradient_accumulation_names_the_micro_batch_that_made_it(monkeypatch, trace):
    """Two forwards per optimizer step: the replay runs both, in order, as one step's events, so
    the origin names the module's second call of the step, as the tracer on every step does."""
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)  # "auto": the replay, not the tracer
    torch.manual_seed(0)
    model = nc.ForwardNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, trace_nonfinite=trace)
    bad = DECIDED + 1
    for i in range(bad + 2):
        opt.zero_grad()
        for micro in range(2):
            x = -torch.ones(8, 4) if (i == bad and micro == 1) else torch.rand(8, 4) + 0.1
            (model(x).pow(2).mean() / 2).backward()
        opt.step()
    rec.detach()
    o = rec.run.nonfinite_origin
    assert o is not None and (o.module, o.step, o.phase, o.call) == ("block.1", bad, "forward", 1)


class _Head(nn.Module):
    """sqrt(mean(h^2)) and a linear head: NaN in the backward at an all-zero h (nc.RMS)."""

    def __init__(self):
        super().__init__()
        self.rms, self.head = nc.RMS(), nn.Linear(1, 1)

    def forward(self, h):
        return self.head(self.rms(h))


class _CalledApart(nn.Module):
    """The model's stem is called before its root forward, which is given the stem's output."""

    def __init__(self):
        super().__init__()
        self.stem, self.top = nn.Linear(4, 8, bias=False), _Head()

    def forward(self, h):
        return self.top(h)


def _train_apart(rec_kw, steps: int, bad: int):
    torch.manual_seed(0)
    model = _CalledApart()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, **rec_kw)
    for i in range(steps):
        opt.zero_grad()
        h = model.stem(torch.zeros(8, 4) if i == bad else torch.rand(8, 4) + 0.1)  # a graph before the root
        model(h).pow(2).mean().backward()
        opt.step()
    rec.detach()
    return rec


def test_an_input_with_a_graph_behind_it_is_replayed_up_to_the_model(monkeypatch):
    """The training's backward freed the stem's graph; the replay starts from a detached copy of
    the root's input, so its backward stops there instead of failing on the freed graph."""
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)
    rec = _train_apart({}, DECIDED + 3, DECIDED + 1)
    o = rec.run.nonfinite_origin
    assert o is not None and (o.module, o.step, o.phase) == ("top.rms", DECIDED + 1, "backward")


def test_a_replay_that_fails_never_stops_the_training(monkeypatch):
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)

    def broken(self, call, tracer, backward):
        raise RuntimeError("something the replay did not foresee")

    monkeypatch.setattr(_replay.StepReplay, "_run", broken)
    rec = _train_apart({}, DECIDED + 4, DECIDED + 1)
    assert rec.run.n_steps == DECIDED + 4 and rec.run.nonfinite_origin is None
    off = rec.run.meta["nonfinite_tracing"]
    assert off["stopped_at_step"] == DECIDED + 1 and "failed (RuntimeError: something" in off["reason"]
    assert rec._nonfinite.replay is None


def test_a_model_whose_own_forward_never_runs_says_so(monkeypatch):
    monkeypatch.setattr(_trace_cost, "INSTRUMENT_SHARE", 0.0)
    torch.manual_seed(0)
    model = nn.ModuleDict({"enc": nn.Linear(4, 8), "dec": nn.Linear(8, 1)})  # called part by part
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    bad = DECIDED + 1
    for i in range(bad + 3):
        opt.zero_grad()
        x = torch.full((4, 4), float("nan")) if i == bad else torch.rand(4, 4)
        model["dec"](model["enc"](x)).pow(2).mean().backward()
        opt.step()
    rec.detach()
    off = rec.run.meta["nonfinite_tracing"]
    assert off["stopped_at_step"] == bad and "own forward never ran" in off["reason"]


class CarriedRNN(nn.Module):
    """A GRU whose hidden state is carried from batch to batch (truncated backpropagation through
    time), a Python counter of its calls that changes its output, and a list it appends to: a
    forward run twice would change all three, and the training with them."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 1)
        self.h: torch.Tensor | None = None
        self.calls = 0
        self.seen: list[int] = []

    def forward(self, x):
        self.calls += 1
        out, h = self.gru(x, self.h)
        self.h = h.detach()
        self.seen.append(self.calls)
        return self.head(out[:, -1]) * (1.0 + self.calls % 3)


def _amp_training(record: bool, user_hook: bool, steps: int = 8):
    """GradScaler on CPU, its scale grown to 2**127 after every good step: each step after one
    overflows (non-finite gradients, skipped), as the first steps of mixed precision training do."""
    torch.manual_seed(0)
    model = CarriedRNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=2.0**20, growth_factor=2.0**107, backoff_factor=2.0**-107, growth_interval=1
    )
    fired: list[int] = []
    if user_hook:
        model.head.register_forward_hook(lambda m, args, out: fired.append(len(fired)))
    rec = Recorder(model, opt) if record else None
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(3, 5, 4, generator=g), torch.randn(3, 1, generator=g)
        scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
    if rec is not None:
        rec.detach()
    return model, fired, rec


@pytest.mark.parametrize("user_hook", [False, True], ids=["restored", "user-hook"])
def test_the_replay_never_changes_training(monkeypatch, user_hook):
    """The default observer changes nothing: an AMP-style non-finite step of a stateful RNN with a
    counter in its forward leaves the final weights, the carried state, the counter and the
    user's hook calls bit for bit as in a run without a Recorder. Without hooks of the user's the
    step is replayed and everything it touched put back; with one, it is not replayed, and the
    run says why."""
    runs = []
    real_run = _replay.StepReplay._run
    monkeypatch.setattr(_replay.StepReplay, "_run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    model, fired, rec = _amp_training(True, user_hook)
    bare, bare_fired, _ = _amp_training(False, user_hook)
    for (name, p), q in zip(model.named_parameters(), bare.parameters()):
        assert torch.equal(p, q), name
    assert torch.equal(model.h, bare.h) and model.calls == bare.calls == 8 and model.seen == bare.seen
    assert fired == bare_fired
    run = rec.run
    assert run.nonfinite().any(1).sum() >= 3, run.nonfinite().any(1)  # the overflowing steps were seen
    if user_hook:
        assert not runs
        why = run.meta["nonfinite_tracing"]["reason"]
        assert "forward hook of the user's on head (Linear)" in why and "trace_nonfinite=True" in why
    else:
        assert runs  # replayed, and put back
        assert "nonfinite_tracing" not in run.meta or "hook" not in run.meta["nonfinite_tracing"]["reason"]


def test_a_replay_restores_what_a_forward_changed_in_place():
    """A forward that adds to a tensor attribute in place, to a dict and to its input: after the
    replay each holds what the training's own forward left."""
    from gradwidget.collect._replay import _copied, _state_restored

    class Stateful(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.total = torch.zeros(2)
            self.counts: dict[str, int] = {}

        def forward(self, x):
            self.total += x.sum(0)
            self.counts["calls"] = self.counts.get("calls", 0) + 1
            self.extra = 1  # an attribute the replay adds: removed
            x.mul_(2)
            return self.lin(x)

    m = Stateful()
    x = torch.ones(3, 2)
    m(x)
    before = (m.total.clone(), dict(m.counts), x.clone())
    del m.extra
    with _state_restored(m, []):
        m(*_copied((x,)))
    assert torch.equal(m.total, before[0]) and m.counts == before[1] and torch.equal(x, before[2])
    assert not hasattr(m, "extra")
