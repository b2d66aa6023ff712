"""Where the NaN started: the torch Recorder names the first module, step and pass that made a
non-finite value (gradwidget.collect.nonfinite), keeps it through save/load and the report."""

from __future__ import annotations

import json

import nonfinite_cases as nc
import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import analyze, load_run, write_report
from gradwidget.collect.torch import Recorder
from gradwidget.run import NonfiniteOrigin
from gradwidget.storage import RunFormatError, RunReader


@pytest.mark.parametrize("name", list(nc.CASES))
def test_names_the_module_step_and_pass(name):
    case = nc.CASES[name]
    if name.startswith("Hugging Face"):
        pytest.importorskip("transformers")
    origin = nc.train(case)
    assert origin is not None, "no origin found"
    assert (origin.module, origin.step, origin.phase) == case.expected
    # what was seen at the origin: finite in, non-finite out (forward: activations; backward:
    # the gradient received and passed on; loss: the model's outputs and the loss)
    assert origin.inputs_finite is True and origin.output_finite is False
    rec = nc.train.last
    assert origin.module_type == type(rec.model.get_submodule(origin.module)).__name__
    # the step was recorded: the parameter gradients it reached are those the run shows non-finite
    row = int(np.flatnonzero(rec.run.steps == origin.step)[0])
    bad = {rec.run.layers[c].name for c in np.flatnonzero(rec.run.metric("nonfinite")[row] > 0)}
    assert set(origin.params_reached) == bad
    # the tracer is gone once the origin is known: no hook left on any module
    assert rec._nonfinite.tracer is None
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in rec.model.modules())


def test_params_reached_are_the_ones_the_nan_flowed_to():
    fwd = nc.train(nc.CASES["forward, parameter-free"])
    # the head takes the NaN activations; the stem sits behind a ReLU that was all zero (its
    # backward passes 0, not NaN, where the input was negative)
    assert sorted(fwd.params_reached) == ["head.bias", "head.weight"]
    bwd = nc.train(nc.CASES["backward only, sqrt(0)"])
    assert bwd.params_reached == ["stem.weight"]  # the head's gradients stay finite: made below it


def test_module_called_twice_names_the_call():
    origin = nc.train(nc.CASES["module called twice"])
    assert (origin.module, origin.call) == ("norm", 1)


def test_nonfinite_data_is_phase_input():
    case = nc.Case(
        nc.ForwardNet,
        ("", nc.BAD, "input"),
        data=lambda bad: torch.full((8, 4), float("nan")) if bad else torch.rand(8, 4),
    )
    origin = nc.train(case)
    assert (origin.module, origin.step, origin.phase) == ("", nc.BAD, "input")
    assert origin.inputs_finite is False


def test_nan_made_between_children_is_the_parents_code():
    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
            self.bad = False

        def forward(self, x):
            h = self.a(x)
            if self.bad:
                h = h / 0.0 * 0.0  # functional code of this module, not of a child
            return self.b(h)

    model = nn.Sequential(nn.Linear(4, 4), Parent())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    for i in range(4):
        model[1].bad = i == 2
        opt.zero_grad()
        model(torch.rand(8, 4)).pow(2).mean().backward()
        opt.step()
    o = rec.run.nonfinite_origin
    assert (o.module, o.module_type, o.step, o.phase) == ("1", "Parent", 2, "forward")


def test_without_an_optimizer_a_step_is_a_backward():
    torch.manual_seed(0)
    model = nc.BackwardNet()
    rec = Recorder(model)
    for i in range(5):
        model.zero_grad()
        model(torch.zeros(8, 4) if i == 2 else torch.rand(8, 4) + 0.1).pow(2).mean().backward()
    o = rec.run.nonfinite_origin
    assert (o.module, o.step, o.phase) == ("rms", 2, "backward")


def test_a_step_between_recorded_ones_is_found_at_the_next_host_copy():
    """trace_nonfinite=True traces every step, recorded or not (the default replays recorded ones)."""
    origin = nc.train(nc.CASES["forward, parameter-free"], every=2, trace_nonfinite=True)  # records 0, 2, 4
    assert (origin.module, origin.step, origin.phase) == ("block.1", nc.BAD, "forward")
    assert origin.params_reached is None  # step 3 was not recorded


def test_by_default_a_nan_made_between_recorded_steps_is_said_not_guessed():
    """The default replays recorded steps only: step 3's NaN reaches the weights, and step 4 is not
    blamed on the first module that reads them; the run says why there is no origin."""
    origin = nc.train(nc.CASES["forward, parameter-free"], every=2)
    assert origin is None
    run = nc.train.last.run
    assert run.meta["nonfinite_tracing"]["stopped_at_step"] == 4
    assert "weights were already non-finite" in run.meta["nonfinite_tracing"]["reason"]
    assert "every=2" in run.meta["nonfinite_tracing"]["reason"]


@pytest.mark.parametrize("trace", ["auto", True])
def test_healthy_training_has_no_origin_and_keeps_tracing_until_detached(trace):
    torch.manual_seed(0)
    model = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False
    )
    mask = nn.Transformer.generate_square_subsequent_mask(6)  # float mask holding -inf: not a NaN
    assert torch.isinf(mask).any()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    rec = Recorder(model, opt, trace_nonfinite=trace)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 6, 16), mask=mask, is_causal=True).pow(2).mean().backward()
        opt.step()
    assert rec.run.nonfinite_origin is None and analyze(rec.run).nonfinite_origin is None
    part = rec._nonfinite.tracer if trace is True else rec._nonfinite.replay  # the default: one hook on the root module
    assert part is not None and part.attached
    rec.detach()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_trace_nonfinite_false_installs_nothing_and_finds_nothing():
    origin = nc.train(nc.CASES["forward, parameter-free"], trace_nonfinite=False)
    assert origin is None
    rec = nc.train.last
    assert rec.run.nonfinite().any()  # the NaN is there; only its origin is not traced


def test_tracing_does_not_change_the_models_numbers():
    """Inputs reach modules as views of themselves: results must be bit for bit the same,
    including nn.MultiheadAttention, which takes its self-attention path when query is key."""

    def grads(trace):
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(8, 16),
            nn.ReLU(inplace=True),
            nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True),
        )
        opt = torch.optim.SGD(model.parameters(), lr=1e-2)
        rec = Recorder(model, opt, trace_nonfinite=trace)
        x = torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(1))
        for _ in range(2):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        rec.detach()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(grads(True), grads(False)):
        assert torch.equal(a, b)


def test_origin_survives_load_run_and_is_in_the_report(tmp_path):
    origin = nc.train(nc.CASES["backward only, sqrt(0)"], log_dir=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["meta"]["nonfinite_origin"]["module"] == "rms"
    run = load_run(tmp_path / "run")
    assert run.nonfinite_origin == origin
    report = analyze(run)
    assert report.nonfinite_origin == origin
    assert report.to_dict()["nonfinite_origin"]["phase"] == "backward"
    html = write_report(report, tmp_path / "report.html").read_text()
    assert "Where the NaN started" in html and "rms (RMS)" in html
    # a slice, and a copy saved with Run.save, keep it
    assert run.slice(slice(0, 2)).nonfinite_origin == origin
    run.save(tmp_path / "copy")
    assert load_run(tmp_path / "copy").nonfinite_origin == origin


def test_a_reader_following_the_run_sees_the_origin_when_it_is_found(tmp_path):
    torch.manual_seed(0)
    model = nc.ForwardNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt, log_dir=tmp_path / "run")

    def step(bad):
        opt.zero_grad()
        model(-torch.ones(8, 4) if bad else torch.rand(8, 4) + 0.1).pow(2).mean().backward()
        opt.step()

    step(False)
    reader = RunReader(tmp_path / "run")
    assert reader.run.nonfinite_origin is None
    version = reader.run.version
    step(True)
    assert reader.poll()
    assert reader.run.nonfinite_origin.module == "block.1" and reader.run.version > version
    rec.detach()


def test_a_malformed_origin_in_meta_json_is_refused(tmp_path):
    nc.train(nc.CASES["loss, log(0)"], log_dir=tmp_path / "run")
    p = tmp_path / "run" / "meta.json"
    meta = json.loads(p.read_text())
    meta["meta"]["nonfinite_origin"]["phase"] = "sideways"
    p.write_text(json.dumps(meta))
    with pytest.raises(RunFormatError, match="nonfinite_origin"):
        load_run(tmp_path / "run")


def test_origin_dataclass_checks_its_fields():
    o = NonfiniteOrigin(module="a.b", step=3.0, phase="forward", module_type="Linear")
    assert o.step == 3 and NonfiniteOrigin.from_dict(o.to_dict()) == o
    assert "a.b (Linear) made it in the forward pass" in o.describe()
    with pytest.raises(ValueError, match="phase"):
        NonfiniteOrigin(module="a", step=1, phase="sideways")
    with pytest.raises(ValueError, match="module"):
        NonfiniteOrigin(module=None, step=1, phase="loss")
    with pytest.raises(ValueError, match="needs module, step and phase"):
        NonfiniteOrigin.from_dict({"module": "a"})
    from gradwidget.run import Run

    run = Run(["a.weight"])
    with pytest.raises(TypeError, match="NonfiniteOrigin"):
        run.nonfinite_origin = {"module": "a"}
    run.nonfinite_origin = o
    assert run.meta["nonfinite_origin"]["module"] == "a.b" and run.nonfinite_origin == o
    run.nonfinite_origin = None
    assert "nonfinite_origin" not in run.meta and run.nonfinite_origin is None


def test_a_gradient_overflow_amps_grad_scaler_skips_is_no_origin():
    """GradScaler starts with a huge loss scale, so the first backwards overflow and it skips those
    steps: by design, not an origin. A NaN made in the forward later still is one."""
    torch.manual_seed(0)
    model = nc.ForwardNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)
    rec = Recorder(model, opt)
    for i in range(6):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(-torch.ones(8, 4) if i == 5 else torch.rand(8, 4) + 0.1)
        scaler.scale(out.float().pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
        if i == 0:
            assert scaler.get_scale() < 2.0**100  # the first step overflowed and was skipped
            assert rec.run is None or rec.run.nonfinite_origin is None
    opt.zero_grad()
    o = rec.run.nonfinite_origin
    assert (o.module, o.step, o.phase) == ("block.1", 5, "forward")


def test_a_module_that_returns_its_input_is_not_blamed_for_the_gradient_it_received():
    """nn.Identity hands back the very view it was given, so what it receives and what it passes
    on is one tensor: the NaN made by the model's own sqrt after it must not be put on it."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(4, 8, bias=False)
            self.skip = nn.Identity()
            self.head = nn.Linear(1, 1)

        def forward(self, x):
            h = self.skip(self.stem(x))
            return self.head(torch.sqrt((h * h).mean(-1, keepdim=True)))  # NaN gradient at h = 0

    case = nc.Case(Net, ("", nc.BAD, "backward"), data=lambda bad: torch.zeros(8, 4) if bad else torch.rand(8, 4) + 0.1)
    origin = nc.train(case)
    assert (origin.module, origin.step, origin.phase) == case.expected
    assert origin.module_type == "Net"


def test_a_forward_that_raised_leaves_no_open_call_behind():
    class Flaky(nn.Module):
        def forward(self, x):
            if x.shape[0] == 3:
                raise ValueError("bad batch")
            return x

    torch.manual_seed(0)
    model = nc.ForwardNet()
    model.block.insert(0, Flaky())  # block.0 raises on a 3-row batch; Normalize is now block.2
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    for i in range(5):
        opt.zero_grad()
        if i in (1, nc.BAD):  # a forward that raises, before the step's real one
            with pytest.raises(ValueError):
                model(torch.rand(3, 4))
        model(-torch.ones(8, 4) if i == nc.BAD else torch.rand(8, 4) + 0.1).pow(2).mean().backward()
        opt.step()
    o = rec.run.nonfinite_origin
    assert (o.module, o.step, o.phase, o.call) == ("block.2", nc.BAD, "forward", 0)


def test_under_torch_compile_the_hooks_step_aside_and_nothing_is_misnamed():
    """Dynamo traces the hooks as nothing (no graph break at every module): the compiled modules
    are not traced, so no origin is named, not even the logged loss, which is NaN here only
    because the untraced forward made it."""
    torch.manual_seed(0)
    model = nc.ForwardNet()
    compiled = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rec = Recorder(model, opt)
    for i in range(5):
        opt.zero_grad()
        loss = compiled(-torch.ones(8, 4) if i == nc.BAD else torch.rand(8, 4) + 0.1).pow(2).mean()
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    assert rec.run.n_steps == 5 and rec.run.nonfinite().any()
    assert rec.run.nonfinite_origin is None


@pytest.mark.parametrize("bad", ["yes", "AUTO", 1, None])
def test_trace_nonfinite_must_be_true_false_or_auto(bad):
    with pytest.raises(TypeError, match="trace_nonfinite must be True, False or 'auto'"):
        Recorder(nn.Linear(2, 2), trace_nonfinite=bad)


def test_gpt2_at_a_too_high_learning_rate_one_origin_instead_of_52_critical_layers():
    """The issue's case: SGD at lr=50 grows the weights until every layer's gradient is NaN at
    once. The origin is one module, in the forward of the step whose gradients first went NaN:
    the first LayerNorm whose input variance no longer fits in float32."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=50.0)
    rec = Recorder(model, opt)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        x = torch.randint(0, 128, (8, 32), generator=g)
        opt.zero_grad()
        out = model(input_ids=x, labels=x)
        out.loss.backward()
        rec.log(loss=out.loss)
        opt.step()
        if rec.run.nonfinite_origin is not None:
            break
    o = rec.run.nonfinite_origin
    first_bad = int(rec.run.steps[np.flatnonzero(rec.run.nonfinite().any(axis=1))[0]])
    assert o.step == first_bad
    assert (o.phase, o.module_type) == ("forward", "LayerNorm") and o.module.startswith("transformer.")
    assert len(o.params_reached) == rec.run.n_layers == 52
    assert np.isfinite(rec.run.scalar("loss")[:-1]).all()  # the loss was finite until that step


def _trace(events, calls, loss=None, skipped=False):
    """A StepTrace from (call, kind, value) events and (module index, parent call) calls."""
    from gradwidget.collect._origin import StepTrace

    return StepTrace(
        7,
        None,
        np.array([k for _, k, _ in events], np.int8),
        np.array([c for c, _, _ in events]),
        np.array([m for m, _ in calls]),
        np.array([p for _, p in calls]),
        loss,
        host=np.array([v for _, _, v in events], float),
        skipped=skipped,
    )


NAMES, TYPES = ["", "a", "b"], ["Net", "Linear", "Sqrt"]


@pytest.mark.parametrize(
    "events,expected",
    [
        # the first non-finite event decides; later ones (the same NaN spreading) do not matter
        ([(0, 0, 1.0), (1, 0, 1.0), (1, 1, np.inf), (2, 0, np.inf)], ("a", "forward")),
        ([(0, 0, 1.0), (1, 0, 1.0), (1, 1, 1.0), (2, 0, np.nan)], ("", "forward")),  # made between children
        ([(0, 0, np.nan), (1, 0, np.nan)], ("", "input")),  # given to the model
        ([(0, 1, 1.0), (0, 2, 1.0), (2, 2, 1.0), (2, 3, np.nan), (1, 2, np.nan)], ("b", "backward")),
        ([(0, 1, 1.0), (0, 2, 1.0), (2, 2, np.inf)], ("", "backward")),  # the parent's own code
        ([(0, 1, 1.0), (2, 2, np.nan), (0, 2, np.nan)], ("", "loss")),  # arrived from the loss
        ([(0, 1, 1.0), (-1, 4, np.inf)], ("", "loss")),  # the logged loss
    ],
)
def test_find_origin_reads_the_first_nonfinite_event(events, expected):
    from gradwidget.collect._origin import find_origin

    o = find_origin(_trace(events, [(0, -1), (1, 0), (2, 0)]), NAMES, TYPES)
    assert (o.module, o.phase, o.step) == (*expected, 7)
    assert o.module_type == TYPES[NAMES.index(o.module)]


def test_find_origin_without_a_nonfinite_event():
    from gradwidget.collect._origin import find_origin

    calls = [(0, -1), (1, 0), (2, 0)]
    finite = [(0, 0, 1.0), (1, 1, 1.0), (1, 2, 1.0), (1, 3, 1.0)]
    assert find_origin(_trace(finite, calls), NAMES, TYPES) is None
    assert find_origin(_trace(finite, calls, loss=float("inf")), NAMES, TYPES).phase == "loss"
    # non-finite parameter gradients alone: the module of the one nearest the loss, flagged as
    # inferred (nothing it gave out was seen non-finite)
    o = find_origin(_trace(finite, calls), NAMES, TYPES, ["b.weight", "a.weight"], lambda n: n.split(".")[0])
    assert (o.module, o.phase, o.output_finite) == ("b", "backward", True)
    # a step the optimizer skipped (GradScaler) gives no backward or loss origin, a forward one still
    assert find_origin(_trace([(0, 1, 1.0), (0, 2, np.inf)], calls, skipped=True), NAMES, TYPES) is None
    assert find_origin(_trace([(1, 1, np.nan)], calls, skipped=True), NAMES, TYPES).phase == "forward"
    # only a logged loss and nothing of the model traced (torch.compile): nothing to name
    assert find_origin(_trace([(-1, 4, np.nan)], []), NAMES, TYPES) is None


def test_earliest_of_several_ranks():
    from gradwidget.collect._origin import earliest

    def o(step, phase, rank, inferred=False):
        return NonfiniteOrigin(
            module="m", step=step, phase=phase, rank=rank, inputs_finite=True, output_finite=inferred
        )

    seen, inferred = o(4, "backward", 1), o(4, "backward", 0, inferred=True)
    assert earliest([inferred, seen]) is seen  # seen in a module beats inferred
    assert earliest([o(4, "forward", 2), seen]).rank == 2  # the forward runs first
    assert earliest([o(3, "backward", 3), seen]).step == 3  # the earlier step first
    assert earliest([]) is None


def test_weight_growth_tells_a_learning_rate_nan_from_a_module_nan():
    from gradwidget.analysis.nonfinite import weight_growth

    # the sqrt(0) NaN: made by the module, the weights had not grown
    origin = nc.train(nc.CASES["backward only, sqrt(0)"])
    assert 0.9 < weight_growth(nc.train.last.run, origin) < 1.1
    # grown weights (the bf16 case multiplies lin2's by 1e36 before the bad step)
    origin = nc.train(nc.CASES["bf16 autocast, Inf"])
    # 1e36 as the fused kernels read it (squares summed in float64), Inf where the eager kernels'
    # float32 squares overflow
    assert weight_growth(nc.train.last.run, origin) > 1e30
    with pytest.raises(TypeError, match="gradwidget Run"):
        from gradwidget.analysis.nonfinite import nonfinite_origin

        nonfinite_origin(origin)


def test_an_in_place_module_that_makes_a_backward_nan_is_named_by_its_enclosing_module():
    """The documented limit: x.sqrt_() hands back the view it was given, whose hook autograd
    drops, so the NaN it makes in the backward is put on the Sequential around it."""

    class SqrtInPlace(nn.Module):
        def forward(self, x):
            return x.sqrt_()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Linear(4, 8, bias=False)
            self.block = nn.Sequential(nc.Square(), SqrtInPlace())  # |x|: finite forward, NaN backward at 0
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            return self.head(self.block(self.stem(x)))

    case = nc.Case(
        Net, ("block", nc.BAD, "backward"), data=lambda bad: torch.zeros(8, 4) if bad else torch.rand(8, 4) + 0.1
    )
    origin = nc.train(case)
    assert (origin.module, origin.step, origin.phase) == case.expected


def test_the_origin_is_marked_on_the_panel_heatmap_at_its_module_and_step():
    """The panel's meta carries where the first NaN was made: its step and the layer row standing for
    the module (a parameter-free module: the layer sharing the longest module path with it)."""
    from gradwidget.analysis.nonfinite import origin_layer
    from gradwidget.panel.payload import heat_view, origin_mark
    from gradwidget.run import METRICS, LayerInfo, Run

    run = Run(
        [
            LayerInfo("block.0.weight", module="block.0"),
            LayerInfo("block.2.weight", module="block.2"),
            LayerInfo("head.weight", module="head"),
        ]
    )
    assert origin_layer(run, NonfiniteOrigin("block.2", 3, "forward")) == 1  # its own parameter
    assert origin_layer(run, NonfiniteOrigin("block.1", 3, "forward")) == 0  # parameter-free: nearest path
    assert origin_layer(run, NonfiniteOrigin("head.act", 3, "backward")) == 2
    assert origin_layer(run, NonfiniteOrigin("", 3, "loss")) is None  # the loss: no row
    assert origin_mark(run) is None
    rng = np.random.default_rng(0)
    for s in range(6):
        run.append(s, np.abs(rng.standard_normal((len(METRICS), 3))).astype(np.float32))
    run.nonfinite_origin = NonfiniteOrigin("block.1", 4, "forward")
    meta, _ = heat_view(run, "mean_abs", 64)
    assert meta["origin"] == {"step": 4, "row": 0, "module": "block.1", "phase": "forward"}
    table = analyze(run).layers  # and in the health table, on the same row
    assert table["origin"].tolist()[0].startswith("first NaN/Inf made here: block.1 (forward, step 4)")
    assert table["origin"].tolist()[1:] == ["", ""]
