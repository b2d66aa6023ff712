"""Trainer integrations with the real libraries and tiny configs: the Hugging Face Trainer and
Lightning callbacks record one step per optimizer update (after accumulation, AMP and, for the
Trainer, clipping) with the trainer's loss, learning rate and pre-clip norm; accelerate works with
the plain Recorder; a compiled model records without graph breaks; GradientPanel follows a callback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, load_run
from gradwidget.collect._noise import NOISE_EVERY
from gradwidget.noise_series import NOISE_MIN_ROWS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning")


def layer_global_norm(run) -> np.ndarray:
    return np.sqrt(np.nansum(run.metric("grad_norm").astype(np.float64) ** 2, axis=1))


# ---------------------------------------------------------------------- Recorder(step_hooks=False)
def test_record_step_marks_steps_and_the_optimizer_post_hook_measures_the_update(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, step_hooks=False, update_every=1, log_dir=tmp_path / "run")
    for step in range(3):
        opt.zero_grad()
        for _ in range(2):  # two micro-batches: one step
            model(torch.randn(8, 4)).pow(2).mean().backward()
        expected = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        rec.log(global_norm=expected * 10 if step == 2 else None)
        rec.record_step()
        if step != 1:
            opt.step()  # step 1: the update is skipped (as AMP skips it)
    assert rec.run.n_steps == 3
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    rec.record_step()  # no optimizer.step() follows: detach finishes (writes) it
    rec.detach()
    run = load_run(tmp_path / "run")
    assert run.n_steps == 4
    upd = run.metric("update_norm")
    assert np.isfinite(upd[0]).all() and np.isfinite(upd[2]).all()
    assert np.isnan(upd[1]).all()  # no update happened at step 1: no false norm
    assert run.scalar("global_norm")[2] == pytest.approx(expected * 10, rel=1e-6)  # the norm given to log()


def test_optimizer_step_alone_records_nothing_without_step_hooks():
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt, step_hooks=False)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    assert rec.run is None
    rec.detach()


# ---------------------------------------------------------------------- Hugging Face Trainer
def hf_train(
    tmp_path, max_steps=4, max_grad_norm=1e9, bf16=False, cb=None, training_args=None, record=True, **cb_options
):
    transformers = pytest.importorskip("transformers")
    from gradwidget.integrations.transformers import GradwidgetCallback

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": torch.randint(0, 64, (16,), generator=g), "labels": torch.randint(0, 64, (16,), generator=g)}
        for _ in range(64)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=1,
        max_grad_norm=max_grad_norm,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        learning_rate=5e-2,
        disable_tqdm=True,
        bf16=bf16,
        **(training_args or {}),
    )
    cb = (cb or GradwidgetCallback(**cb_options)) if record else None
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[cb] if cb else [])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    return cb, logged


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_hf_trainer_records_each_update_with_its_logged_norm_loss_and_lr(tmp_path, bf16):
    cb, logged = hf_train(tmp_path, bf16=bf16, log_dir=tmp_path / "run")
    run = cb.run
    assert run.n_steps == 4 and list(run.steps) == [1, 2, 3, 4]  # accumulation 2: 8 backwards, 4 steps
    assert len(logged) == 4
    np.testing.assert_allclose(run.scalar("global_norm"), [h["grad_norm"] for h in logged], rtol=1e-5)
    np.testing.assert_allclose(layer_global_norm(run), [h["grad_norm"] for h in logged], rtol=1e-4)
    np.testing.assert_allclose(run.scalar("loss"), [h["loss"] for h in logged], rtol=1e-5)
    np.testing.assert_allclose(run.scalar("lr"), [h["learning_rate"] for h in logged], rtol=1e-6)
    assert not cb.attached and not cb.recorder.attached  # training ended: hooks removed
    graph = run.meta["loss_graph"]  # read off the loss GPT-2 returns: logits go into log_softmax, no mistake
    assert graph["mistakes"] == []  # (bf16: accelerate casts the outputs, so the walk meets no output node)
    assert bf16 or (graph["reached_output"] and "LogSoftmax" in graph["ops"])
    disk = load_run(tmp_path / "run")
    assert disk.n_steps == 4 and disk.meta["clipped_at"] == 1e9
    np.testing.assert_allclose(disk.scalar("global_norm"), run.scalar("global_norm"))


@pytest.mark.slow
def test_hf_trainer_clipped_run_keeps_the_pre_clip_norm(tmp_path):
    cb, logged = hf_train(tmp_path, max_grad_norm=0.5)
    run = cb.run
    trainer_norms = np.array([h["grad_norm"] for h in logged])
    assert (trainer_norms > 0.5).all()  # every step was clipped
    np.testing.assert_allclose(run.scalar("global_norm"), trainer_norms, rtol=1e-5)
    np.testing.assert_allclose(layer_global_norm(run), 0.5, rtol=1e-4)  # what the optimizer saw
    assert run.meta["clipped_at"] == 0.5


HF_DDP_WORKER = """
import os, sys, torch, transformers
from gradwidget.integrations.transformers import GradwidgetCallback
torch.manual_seed(0)
cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
g = torch.Generator().manual_seed(1)
data = [{"input_ids": t, "labels": t} for t in torch.randint(0, 64, (64, 16), generator=g)]
args = transformers.TrainingArguments(output_dir=sys.argv[1] + "/out", max_steps=3, per_device_train_batch_size=4,
    gradient_accumulation_steps=2, logging_steps=1, max_grad_norm=0.5, report_to=[], save_strategy="no",
    use_cpu=True, learning_rate=5e-2, disable_tqdm=True, ddp_backend="gloo")
cb = GradwidgetCallback(log_dir=sys.argv[1] + "/run")
trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(cfg), args=args, train_dataset=data, callbacks=[cb])
trainer.train()
logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
# each rank writes its own file: two processes printing to one pipe can interleave their lines
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".txt"), "w") as f:
    f.write(repr((cb.run is not None, logged)))
# torch 2.13's gloo teardown aborts now and then at interpreter exit ("terminate called without an
# active exception", with or without gradwidget): the work is done and written, leave at once
os._exit(0)
"""


@pytest.mark.slow
def test_hf_trainer_under_ddp_records_on_rank_0_with_the_averaged_pre_clip_norm(tmp_path):
    """Two CPU processes (torchrun, gloo): rank 0 alone records and writes; its pre-clip norm is
    the Trainer's logged grad_norm, taken after DDP averaged the gradients."""
    pytest.importorskip("transformers")
    import ast
    import os

    (tmp_path / "worker.py").write_text(HF_DDP_WORKER)
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    )
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "worker.py", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (held0, logged), (held1, _) = (ast.literal_eval((tmp_path / f"rank{r}.txt").read_text()) for r in (0, 1))
    assert held0 and not held1  # only rank 0 holds a run
    run = load_run(tmp_path / "run")
    assert run.n_steps == 3 and run.meta["distributed"]["world_size"] == 2
    np.testing.assert_allclose(run.scalar("global_norm"), logged, rtol=1e-5)


@pytest.mark.slow
def test_hf_trainer_torch_compile_adds_no_graph_break(tmp_path):
    """``TrainingArguments(torch_compile=True)``: the callback's hooks add no graph break to the
    ones transformers' own code causes, and the run is exact."""
    from torch._dynamo.utils import counters

    compile_args = {"torch_compile": True, "torch_compile_backend": "aot_eager"}
    breaks = []
    for with_cb in (False, True):
        torch._dynamo.reset()
        counters.clear()
        cb, logged = hf_train(tmp_path, max_steps=2, max_grad_norm=0.5, training_args=compile_args, record=with_cb)
        breaks.append(dict(counters["graph_break"]))
    assert breaks[1] == breaks[0], breaks
    assert cb.run.n_steps == 2 and not any("_orig_mod" in n for n in cb.run.layer_names)
    np.testing.assert_allclose(cb.run.scalar("global_norm"), [h["grad_norm"] for h in logged], rtol=1e-5)


def measured_steps(steps, first: int = 0) -> list[int]:
    """The step labels the noise probe measures at its default cadence, of a run's ``steps`` from
    the ``first`` it can (NaN tracing off: while "auto" times its tracer, every step is measured)."""
    return [int(s) for i, s in enumerate(steps) if i >= first and (i < first + NOISE_MIN_ROWS or i % NOISE_EVERY == 0)]


@pytest.mark.slow
def test_hf_trainer_accumulation_gives_the_noise_scale(tmp_path):
    """Accumulation over 2 micro-batches of 4: the Recorder sees the gradient at batch 4 and 8 (the
    model's forward tells the size and counts the micro-batches, from the second step on) and ``analyze`` estimates
    B_simple from them. At the default cadence (the first ``NOISE_MIN_ROWS`` steps, then one in
    ``NOISE_EVERY``) through the Trainer's own step marks, and at every step."""
    from gradwidget import analyze

    cb, _ = hf_train(tmp_path / "default", max_steps=2 * NOISE_EVERY + 1, trace_nonfinite=False)
    assert list(cb.run.noise.rows["step"]) == measured_steps(cb.run.steps, first=1)
    cb, _ = hf_train(tmp_path, max_steps=12, noise_every=1)
    rows = cb.run.noise.rows
    assert len(rows) == 11 and (rows["n_small"] == 2).all()
    assert (rows["b_small"] == 4).all() and (rows["b_big"] == 8).all()
    est = analyze(cb.run).noise_scale
    assert est is not None and est.b_small == 4 and est.b_big == 8 and "accumulation" in est.how
    assert np.isfinite(est.b_simple).any()


def test_callbacks_reject_unknown_options():
    pytest.importorskip("transformers")
    from gradwidget.integrations.transformers import GradwidgetCallback

    with pytest.raises(TypeError, match="unknown Recorder option.*evry"):
        GradwidgetCallback(evry=2)
    with pytest.raises(TypeError, match="unknown Recorder option.*step_hooks"):
        GradwidgetCallback(step_hooks=True)


# ---------------------------------------------------------------------- Lightning
def lit_fit(precision="32-true", clip=None, max_steps=3, package="lightning.pytorch", cb=None, **cb_options):
    L = pytest.importorskip(package)
    from torch.utils.data import DataLoader, TensorDataset

    from gradwidget.integrations.lightning import GradwidgetCallback

    torch.manual_seed(0)

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.mse_loss(self.net(x).float(), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Spy(L.Callback):
        """What Lightning shows a callback at on_before_optimizer_step."""

        def __init__(self):
            self.norms, self.losses = [], []

        def on_before_backward(self, trainer, module, loss):
            self.losses.append(float(loss))

        def on_before_optimizer_step(self, trainer, module, optimizer):
            self.norms.append({n: float(p.grad.float().norm()) for n, p in module.named_parameters()})

    x, y = torch.randn(64, 8), torch.randn(64, 1)
    cb, spy = cb or GradwidgetCallback(**cb_options), Spy()
    trainer = L.Trainer(
        max_steps=max_steps,
        accumulate_grad_batches=2,
        callbacks=[spy, cb],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        precision=precision,
        gradient_clip_val=clip,
    )
    trainer.fit(Module(), DataLoader(TensorDataset(x, y), batch_size=8))
    return cb, spy


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_records_each_update_as_on_before_optimizer_step_sees_it(tmp_path, precision):
    cb, spy = lit_fit(precision, log_dir=tmp_path / "run")
    run = cb.run
    assert run.n_steps == 3 and list(run.steps) == [1, 2, 3]  # accumulation 2: 6 backwards, 3 steps
    assert len(spy.norms) == 3
    for k, seen in enumerate(spy.norms):
        recorded = {n: run.metric("grad_norm")[k, run.layer_index(n)] for n in seen}
        np.testing.assert_allclose(list(recorded.values()), list(seen.values()), rtol=1e-5)
    step_loss = np.array(spy.losses).reshape(3, 2).sum(axis=1)  # normalised micro-batch losses
    np.testing.assert_allclose(run.scalar("loss"), step_loss, rtol=1e-5)
    np.testing.assert_allclose(run.scalar("lr"), 0.1)
    assert np.isfinite(run.metric("update_norm")[0]).all()  # the post-step hook measured the update
    assert not cb.attached
    assert "MseLoss" in run.meta["loss_graph"]["ops"] or run.meta["loss_graph"]["mistakes"] == []
    assert load_run(tmp_path / "run").n_steps == 3


@pytest.mark.slow
def test_lightning_clipped_run_keeps_the_pre_clip_norm():
    cb, spy = lit_fit("bf16-mixed", clip=0.01)
    run = cb.run
    pre = [np.sqrt(sum(v * v for v in seen.values())) for seen in spy.norms]
    assert min(pre) > 0.01  # clipping changed every step
    np.testing.assert_allclose(run.scalar("global_norm"), pre, rtol=1e-4)
    assert run.meta["clipped_at"] == 0.01
    # the update is the clipped one: lr 0.1 x a gradient of norm 0.01
    assert np.sqrt(np.nansum(run.metric("update_norm")[0] ** 2)) == pytest.approx(1e-3, rel=1e-2)


@pytest.mark.slow
def test_lightning_callback_works_under_the_pytorch_lightning_name():
    pl = pytest.importorskip("pytorch_lightning")
    from gradwidget.integrations.lightning import GradwidgetCallback

    assert isinstance(GradwidgetCallback(), pl.Callback)
    cb, spy = lit_fit(package="pytorch_lightning", max_steps=2)
    assert cb.run.n_steps == 2 and len(spy.norms) == 2


# ---------------------------------------------------------------------- accelerate
@pytest.mark.slow
def test_accelerate_prepare_backward_and_accumulation_with_the_plain_recorder():
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    acc = accelerate.Accelerator(gradient_accumulation_steps=2, cpu=True)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    rec = Recorder(model, opt)  # the AcceleratedOptimizer: its inner optimizer's hooks run
    seen = []
    for i in range(8):
        with acc.accumulate(model):
            loss = model(torch.randn(16, 4)).pow(2).mean()
            acc.backward(loss)
            if acc.sync_gradients:
                seen.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))))
            opt.step()
            opt.zero_grad()
    rec.detach()
    assert rec.run.n_steps == 4  # 8 micro-batches, accumulation 2
    np.testing.assert_allclose(rec.run.scalar("global_norm"), seen, rtol=1e-5)
    assert sorted(rec.run.layer_names) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    # accelerate's zero_grad is a no-op between micro-batches: its accumulation is no forgotten zero_grad
    assert rec.run.meta["grad_reset"] == {
        "layer": "0.weight",
        "checked": 3,
        "carried": 0,
        "first_step": None,
        "cleared": 0,
        "steps": 4,
    }


# ---------------------------------------------------------------------- torch.compile
def test_compiled_model_records_without_graph_breaks():
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cnt = CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    rec = Recorder(compiled, opt)
    for _ in range(3):
        opt.zero_grad()
        compiled(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    rec.detach()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert cnt.frame_count == 1  # one forward graph, reused
    assert rec.run.n_steps == 3
    assert rec.run.layer_names and not any("_orig_mod" in n for n in rec.run.layer_names)
    assert rec.run.layer_names == [n for n, _ in model.named_parameters()]  # the model's order


def test_recording_before_compiling_and_a_compiled_submodule_strip_orig_mod():
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    model[0] = torch.compile(model[0], backend=CompileCounter())
    rec = Recorder(model)  # no optimizer: one step per backward
    cnt = CompileCounter()
    compiled = torch.compile(model, backend=cnt)
    compiled(torch.randn(2, 4)).sum().backward()
    rec.detach()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert sorted(rec.run.layer_names) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert {layer.module_type for layer in rec.run.layers} == {"Linear"}


# ---------------------------------------------------------------------- the panel
@pytest.mark.slow
def test_gradient_panel_follows_a_callback_before_during_and_after_training():
    pytest.importorskip("lightning.pytorch")
    from gradwidget.integrations.lightning import GradwidgetCallback
    from gradwidget import GradientPanel

    cb = GradwidgetCallback()
    panel = GradientPanel(cb, max_rate=1e6)  # before training: no run yet, following the callback
    assert panel.run is None and panel._is_live()
    during = []
    cb.on_step.append(lambda run: during.append((run.n_steps, panel.run is run, panel._is_live())))
    pushed = panel.push_count
    lit_fit(max_steps=3, cb=cb)
    assert during == [(1, True, True), (2, True, True), (3, True, True)]
    assert panel.run is cb.run and panel.run.n_steps == 3
    assert panel.push_count > pushed  # the panel sent steps while fit() ran
    assert not panel._is_live()  # fit() ended: the recorder is detached
    panel.flush()
    assert panel.step == 3
    panel.close()
    after = GradientPanel(cb)  # after training: the finished run
    assert after.run.n_steps == 3
    after.close()


@pytest.mark.slow
def test_gradient_panel_follows_a_hf_trainer_training_in_a_thread(tmp_path):
    pytest.importorskip("transformers")
    import threading

    from gradwidget.integrations.transformers import GradwidgetCallback
    from gradwidget import GradientPanel

    cb = GradwidgetCallback()
    panel = GradientPanel(cb, max_rate=1e6)
    seen = []
    cb.on_step.append(lambda run: seen.append(threading.current_thread() is not threading.main_thread()))
    result = {}
    t = threading.Thread(target=lambda: result.update(zip(("cb", "logged"), hf_train(tmp_path, cb=cb))))
    t.start()
    t.join(timeout=240)
    assert not t.is_alive() and result["cb"] is cb
    assert seen == [True] * 4  # recorded in the training thread, one call per update
    assert panel.run is cb.run and panel.run.n_steps == 4 and panel.push_count >= 2
    assert not panel._is_live()
    panel.close()


def test_importing_gradwidget_imports_no_trainer_library():
    code = (
        "import sys, gradwidget, gradwidget.integrations; import gradwidget.panel.widget; "
        "bad = [m for m in ('transformers', 'lightning', 'pytorch_lightning', 'accelerate') if m in sys.modules]; "
        "print(bad); assert not bad"
    )
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_lightning_accumulation_gives_the_noise_scale():
    """Lightning calls ``training_step``, not the module's forward: the callback tells the Recorder
    each micro-batch's size, so accumulation over 2 batches of 8 gives the gradient at 8 and 16;
    the accumulated gradient is the one Lightning steps with (up to the estimator's fixed scale)."""
    from gradwidget import analyze

    cb, spy = lit_fit(max_steps=2 * NOISE_EVERY + 1, trace_nonfinite=False)  # the default cadence
    rows = cb.run.noise.rows
    assert cb.run.meta["noise_scale"]["batch_size"] == "log"
    assert list(rows["step"]) == measured_steps(cb.run.steps)  # the trainer's step labels
    assert (rows["b_small"] == 8).all() and (rows["b_big"] == 16).all()
    at = [i for i, s in enumerate(cb.run.steps) if s in set(rows["step"])]
    seen = np.array([sum(v * v for v in step.values()) for step in spy.norms])[at]
    ratio = rows["big_total"] / seen
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-4)  # one scale for every step
    est = analyze(cb.run).noise_scale
    assert est is not None and (est.b_small, est.b_big) == (8, 16) and np.isfinite(est.b_simple).any()
