"""The torch Recorder in edge cases: partial optimizers, models whose root forward never runs,
skipped AMP steps, layers first used late, re-created recorders, bad arguments, host copies."""

import numpy as np
import pytest
import torch
from torch import nn

from conftest import as_accelerator

from gradwidget.collect.torch import Recorder


def head_only_setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model[2].parameters(), lr=1e-3)


def step(model, opt, x=None):
    opt.zero_grad()
    x = torch.randn(4, 8) if x is None else x
    model(x).pow(2).mean().backward()
    opt.step()


def test_update_norm_is_nan_for_parameters_the_optimizer_does_not_hold():
    model, opt = head_only_setup()  # the body keeps requires_grad=True but is never stepped
    with Recorder(model, opt, update_every=1) as rec:
        for _ in range(3):
            step(model, opt)
    upd = rec.run.metric("update_norm")
    for name in ("0.weight", "0.bias"):
        assert np.isnan(upd[:, rec.run.layer_index(name)]).all()
    for name in ("2.weight", "2.bias"):
        assert (upd[:, rec.run.layer_index(name)] > 0).all()


class Sometimes(nn.Module):
    """``rare`` joins the forward on even calls only (from the second call on)."""

    def __init__(self):
        super().__init__()
        self.a, self.rare, self.out = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        x = torch.relu(self.a(x))
        if self.calls % 2 == 0:
            x = x + self.rare(x)
        return self.out(x)


def test_update_norm_is_nan_on_steps_a_layer_got_no_gradient():
    torch.manual_seed(0)
    model = Sometimes()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, update_every=1) as rec:
        for _ in range(4):
            opt.zero_grad()
            model(torch.randn(4, 4)).pow(2).mean().backward()
            opt.step()
    j = rec.run.layer_index("rare.weight")
    upd, gn = rec.run.metric("update_norm")[:, j], rec.run.metric("grad_norm")[:, j]
    np.testing.assert_array_equal(np.isnan(upd), np.isnan(gn))
    assert np.isnan(upd[[0, 2]]).all() and (upd[[1, 3]] > 0).all()


def test_graph_capture_ends_at_the_first_step_when_the_root_forward_never_runs():
    model = nn.ModuleDict({"enc": nn.Linear(8, 8), "dec": nn.Linear(8, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt) as rec:
        for _ in range(3):
            opt.zero_grad()
            model["dec"](torch.tanh(model["enc"](torch.randn(4, 8)))).pow(2).mean().backward()
            opt.step()
        # no graph-capture hook is left behind holding grad_fns (and the activations they keep);
        # the NaN-origin tracer's and replay's hooks stay while they watch (they hold no grad_fn)
        owners = {id(rec._nonfinite.tracer), id(rec._nonfinite.replay)}
        for m in model.modules():
            hooks = [getattr(h, "fn", h) for h in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())]
            assert all(id(getattr(getattr(h, "func", h), "__self__", None)) in owners for h in hooks)
    pairs = {(rec.run.layers[a].module, rec.run.layers[b].module) for a, b in rec.run.edges}
    assert pairs == {("enc", "dec")}


def test_a_step_grad_scaler_skips_is_recorded_with_its_nonfinite_counts():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    with Recorder(model, opt, update_every=1) as rec:
        for i in range(4):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(torch.randn(4, 8)).float().pow(2).mean()
            if i == 1:
                loss = loss * float("inf")  # overflow: scaler.step skips optimizer.step()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    run = rec.run
    assert run.steps.tolist() == [0, 1, 2, 3]
    assert (run.metric("nonfinite")[1] > 0).all() and (run.metric("nonfinite")[[0, 2, 3]] == 0).all()
    assert np.isnan(run.metric("update_norm")[1]).all()  # nothing was stepped
    assert np.isfinite(run.metric("update_norm")[[0, 2, 3]]).all()
    assert "zero_grad" not in opt.__dict__  # detach restored the optimizer's own method


def test_a_skipped_last_step_is_recorded_at_detach_and_zero_grad_twice_records_nothing():
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt)
    step(model, opt)
    opt.zero_grad(set_to_none=False)
    opt.zero_grad(set_to_none=False)  # no backward in between: no step to record
    assert rec.run.n_steps == 1
    model(torch.randn(4, 8)).sum().backward()
    model[0].weight.grad[0, 0] = float("nan")  # as if the step were skipped on overflow
    rec.detach()
    assert rec.run.n_steps == 2 and rec.run.metric("nonfinite")[1].sum() == 1


def test_a_layer_first_used_at_a_later_step_becomes_trainable_with_edges(tmp_path):
    from gradwidget.storage import load_run

    torch.manual_seed(0)
    model = Sometimes()  # rare is not in the first forward
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(model, opt, log_dir=tmp_path / "run") as rec:
        opt.zero_grad()
        model(torch.randn(4, 4)).pow(2).mean().backward()
        opt.step()
        assert rec.run.layers[rec.run.layer_index("rare.weight")].status == "unused"
        for _ in range(5):
            opt.zero_grad()
            model(torch.randn(4, 4)).pow(2).mean().backward()
            opt.step()
    for run in (rec.run, load_run(tmp_path / "run")):
        info = {layer.name: layer for layer in run.layers}
        assert info["rare.weight"].status == info["rare.bias"].status == "trainable"
        first = [info[n].backward_index for n in ("a.weight", "a.bias", "out.weight", "out.bias")]
        assert sorted(first) == [0, 1, 2, 3]  # the first backward's order is kept
        assert {info["rare.weight"].backward_index, info["rare.bias"].backward_index} == {4, 5}
        pairs = {(run.layers[a].module, run.layers[b].module) for a, b in run.edges}
        assert pairs == {("a", "rare"), ("a", "out"), ("rare", "out")}
    assert not model.rare._forward_hooks  # the capture for its edges ended


def test_a_new_recorder_on_the_same_model_detaches_the_old_one():
    import gc
    import weakref

    model, opt = head_only_setup()
    old = Recorder(model, opt)
    for _ in range(2):
        step(model, opt)
    with pytest.warns(
        UserWarning, match="previous Recorder on this Sequential was detached; its run keeps the 2 steps it recorded"
    ):
        new = Recorder(model, opt)
    assert not old.attached and new.attached
    for _ in range(3):
        step(model, opt)
    assert old.run.n_steps == 2 and new.run.n_steps == 3
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None  # the registry holds recorders weakly
    new.detach()
    Recorder(model, opt).detach()  # after detach, no warning: nothing was attached


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        ({"log_dir": 123}, TypeError, "log_dir must be a folder path .* not int"),
        ({"memory_budget": "x"}, TypeError, "memory_budget must be a number of bytes .* got str 'x'"),
        ({"memory_budget": 0}, ValueError, "memory_budget must be a positive number of bytes"),
        ({"every": 2.0}, TypeError, "every must be a positive int, got float 2.0"),
        ({"every": True}, TypeError, "every must be a positive int, got bool True"),
        ({"histogram_every": -1}, ValueError, "histogram_every must be a non-negative int, got -1"),
        ({"histogram_every": "10"}, TypeError, "histogram_every must be a non-negative int, got str"),
        ({"update_every": 0}, ValueError, "update_every must be a positive int"),
        ({"noise_every": 0}, ValueError, "noise_every must be a positive int, got 0"),
        ({"noise_every": 2.5}, TypeError, "noise_every must be a positive int, got float 2.5"),
        ({"max_steps": "all"}, TypeError, "max_steps must be 'auto', None or a positive int, got str 'all'"),
        ({"max_steps": -5}, ValueError, "max_steps must be 'auto', None or a positive int, got -5"),
    ],
)
def test_bad_options_fail_at_construction_naming_the_argument(kwargs, err, match):
    model, opt = head_only_setup()
    with pytest.raises(err, match=match):
        Recorder(model, opt, **kwargs)
    assert not opt._optimizer_step_pre_hooks  # nothing was hooked


def test_a_log_dir_holding_a_run_is_refused_at_construction(tmp_path):
    model, opt = head_only_setup()
    with Recorder(model, opt, log_dir=tmp_path / "run"):
        step(model, opt)
    with pytest.raises(FileExistsError, match="already holds a run; pick a new log_dir or pass overwrite=True"):
        Recorder(model, opt, log_dir=tmp_path / "run")
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError, match="exists and is not a directory"):
        Recorder(model, opt, log_dir=tmp_path / "file")
    with Recorder(model, opt, log_dir=tmp_path / "run", overwrite=True, memory_budget=1e9) as rec:
        step(model, opt)
    assert rec.run.n_steps == 1 and rec.memory_budget == 10**9


def test_one_host_copy_per_recorded_step_plus_one_for_update_norms(monkeypatch):
    import sys

    import gradwidget.collect._groups as groups
    import gradwidget.collect._kernels as kernels
    import gradwidget.collect._stats as stats
    import gradwidget.collect._skipped as skipped
    import gradwidget.collect._updates as updates
    import gradwidget.collect.torch as collect

    # the recorder's modules (the packed copy lives in the kernels)
    recorder_files = tuple(m.__file__ for m in (collect, kernels, groups, stats, skipped, updates))
    copies = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def f(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename in recorder_files:  # the recorder's reads only
                copies.append(name)
            return original(self, *args, **kwargs)

        return f

    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    model[2].double()  # a second dtype: two weight and two gradient groups on one device
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    per_step = []
    # the statistics as an accelerator takes them (CPU's own path reads |g|'s smallest entry to
    # skip counting non-zeros, a read of memory there, never taken on a device)
    as_accelerator(monkeypatch)
    with Recorder(model, opt, histogram_every=2, update_every=2) as rec:
        for name in ("cpu", "item", "tolist", "__float__"):
            monkeypatch.setattr(torch.Tensor, name, counting(name))
        for _ in range(4):
            opt.zero_grad()
            loss = model[2](model[1](model[0](torch.randn(4, 8))).double()).pow(2).mean()
            loss.backward()
            rec.log(loss=loss)
            copies.clear()
            opt.step()
            per_step.append(
                copies.count("cpu") + copies.count("item") + copies.count("tolist") + copies.count("__float__")
            )
        monkeypatch.undo()
    # steps 0 and 2: statistics + histograms + loss in one copy, update norms in a second
    assert per_step == [2, 1, 2, 1]
    assert rec.run.hist_steps.tolist() == [0, 2]
    assert np.isfinite(rec.run.scalar("loss")).all()


def test_zero_grad_inside_an_lbfgs_closure_records_no_extra_steps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=5)
    x = torch.randn(16, 8)

    def closure():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    with Recorder(model, opt) as rec:
        for _ in range(3):
            opt.step(closure)
    # one step per step(closure), each with its own closure's gradients (test_closure_steps.py)
    assert rec.run.steps.tolist() == [0, 1, 2]
    assert len(rec.run.edges) == 0 and not model[0]._forward_hooks  # captured in the first closure


def test_lbfgs_on_a_model_whose_root_forward_never_runs_still_gets_its_edges():
    torch.manual_seed(0)
    model = nn.ModuleDict({"enc": nn.Linear(8, 8), "dec": nn.Linear(8, 1)})
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3)
    x = torch.randn(16, 8)

    def closure():
        opt.zero_grad()
        loss = model["dec"](torch.tanh(model["enc"](x))).pow(2).mean()
        loss.backward()
        return loss

    with Recorder(model, opt) as rec:
        for _ in range(3):
            opt.step(closure)
    pairs = {(rec.run.layers[a].module, rec.run.layers[b].module) for a, b in rec.run.edges}
    assert pairs == {("enc", "dec")}


def test_an_exception_in_the_with_block_records_no_extra_step():
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(RuntimeError, match="data loader died"):
        with Recorder(model, opt) as rec:
            step(model, opt)
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            raise RuntimeError("data loader died")
    assert rec.run.n_steps == 1 and not rec.attached


def test_a_zero_grad_wrapped_again_by_someone_else_is_left_in_place_and_records_nothing():
    model = nn.Sequential(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rec = Recorder(model, opt)
    ours = opt.zero_grad

    def theirs(*args, **kwargs):
        return ours(*args, **kwargs)

    opt.zero_grad = theirs
    step(model, opt)
    rec.detach()
    assert opt.zero_grad is theirs  # not unwrapped from under the other wrapper
    for _ in range(2):  # backwards no step consumed, each followed by a zero_grad
        model(torch.randn(4, 8)).sum().backward()
        opt.zero_grad()  # still calls our wrapper: a detached recorder records nothing
    assert rec.run.n_steps == 1 and model[0].weight.grad is None


def test_sharded_statistics_leave_the_update_norm_nan_where_no_rank_had_a_gradient():
    from gradwidget.collect.distributed import _P, PARTIALS, DistContext
    from gradwidget.run import METRICS

    ctx = object.__new__(DistContext)  # statistics() only needs the unsharded element counts
    ctx._numel = np.array([4.0, 4.0])
    stacked = np.zeros((2, 2, len(PARTIALS)))  # 2 ranks, 2 layers
    stacked[:, 0, _P["has_grad"]] = 1.0
    stacked[:, 0, _P["sumsq"]] = stacked[:, 0, _P["update_sumsq"]] = 2.0
    # what the reduces deliver to rank 0: the partials summed over ranks and the largest |g|
    out, _ = ctx.statistics(
        stacked.sum(axis=0), stacked[:, :, _P["max"]].max(axis=0), np.array([0, 1]), measured_update=True
    )
    upd = out[METRICS.index("update_norm")]
    assert upd[0] == pytest.approx(2.0) and np.isnan(upd[1])


def test_sparse_embedding_gradients_equal_the_dense_ones():
    """nn.Embedding(sparse=True) gives sparse COO gradients (with repeated rows): every statistic and
    the histogram equal those of the same model with dense gradients (they were NaN before)."""
    import numpy as np
    from torch import nn

    from gradwidget import METRICS, Recorder

    class Bag(nn.Module):
        def __init__(self, sparse: bool):
            super().__init__()
            torch.manual_seed(0)
            self.emb = nn.Embedding(50, 6, sparse=sparse)
            self.out = nn.Linear(6, 1)

        def forward(self, x):
            return self.out(torch.tanh(self.emb(x))).pow(2).mean()

    runs = []
    for sparse in (True, False):
        model = Bag(sparse)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        rec = Recorder(model, opt, histogram_every=1)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            opt.zero_grad()
            model(torch.randint(0, 10, (16,), generator=gen)).backward()  # rows repeat: duplicates summed
            opt.step()
        rec.detach()
        runs.append(rec.run)
    sparse_run, dense_run = runs
    assert sparse_run.layer_names == dense_run.layer_names
    assert sparse_run.layers[sparse_run.layer_names.index("emb.weight")].status == "trainable"
    for metric in METRICS:
        np.testing.assert_allclose(
            sparse_run.metric(metric), dense_run.metric(metric), rtol=1e-5, atol=1e-9, err_msg=metric
        )
    assert np.isfinite(sparse_run.metric("grad_norm")).all()
    assert (sparse_run.metric("zero_frac")[:, 0] > 0.5).all()  # most embedding rows get no gradient
    assert sparse_run.hist.shape[0] == 4 and sparse_run.hist.sum() > 0
    np.testing.assert_array_equal(sparse_run.hist, dense_run.hist)


def test_tied_weights_are_recorded_once_and_marked():
    """GPT-2 ties lm_head.weight to transformer.wte.weight: one tensor, recorded once under its
    first name, with its other name marked (saved and loaded with the run)."""
    transformers = pytest.importorskip("transformers")
    from gradwidget import load_run

    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with Recorder(model, opt, histogram_every=0) as rec:
        x = torch.randint(0, 32, (2, 8))
        opt.zero_grad()
        model(x, labels=x).loss.backward()
        opt.step()
    run = rec.run
    (wte,) = [info for info in run.layers if info.name == "transformer.wte.weight"]
    assert wte.tied == ("lm_head.weight",) and "lm_head.weight" not in run.layer_names
    assert all(info.tied == () for info in run.layers if info is not wte)
    run.save(tmp := __import__("tempfile").mkdtemp() + "/r")
    loaded = [info for info in load_run(tmp).layers if info.name == "transformer.wte.weight"]
    assert loaded[0].tied == ("lm_head.weight",)
    from gradwidget import analyze

    t = analyze(run).layers.set_index("layer")
    assert t.loc["transformer.wte.weight", "tied"] == "lm_head.weight"
