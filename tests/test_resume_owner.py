"""Resuming holds the run folder and continues all of it: a resumer owns the folder from the moment
it is built (a second resumer, here or in another process, is refused and nothing the first wrote is
cut), every file of the run goes on (steps, histograms, the noise rows of gradient accumulation, the
meta), and under a trainer that goes on from a checkpoint the run takes the trainer's step numbers,
the steps trained again replacing the ones recorded before the crash."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget import Recorder, load_run
from gradwidget.storage import RunReader


class TinyConv(nn.Module):
    """A 1-d convolutional classifier (not the models of the other resume tests)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.conv = nn.Conv1d(3, 6, 3)
        self.head = nn.Linear(6 * 6, 2)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def accumulate(model, opt, steps: int, seed: int) -> None:
    """``steps`` optimizer steps of two micro-batches of 4 each."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        for _ in range(2):
            x, y = torch.randn(4, 3, 8, generator=g), torch.randint(0, 2, (4,), generator=g)
            (nn.functional.cross_entropy(model(x), y) / 2).backward()
        opt.step()


def test_resume_with_gradient_accumulation_continues_every_file(tmp_path):
    model = TinyConv()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False, histogram_every=3) as rec:
        accumulate(model, opt, 12, 0)
    first = load_run(tmp_path / "run")
    assert first.noise is not None and len(first.noise) and "noise_scale" in first.meta
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RunWriteWarning: every step reaches the folder
        with Recorder(
            model, opt, log_dir=tmp_path / "run", resume=True, trace_nonfinite=False, histogram_every=3
        ) as rec:
            accumulate(model, opt, 12, 1)
        run = load_run(tmp_path / "run")
    assert run.steps.tolist() == list(range(24)) == rec.run.steps.tolist()
    np.testing.assert_array_equal(run.metric("grad_norm"), rec.run.metric("grad_norm"))
    assert run.hist_steps.tolist() == list(range(0, 24, 3))
    noise = run.noise.rows["step"].tolist()
    assert noise[: len(first.noise)] == first.noise.rows["step"].tolist()  # the earlier rows, kept
    assert noise == sorted(set(noise)) and noise[-1] > 11  # and new ones after them, once each
    assert [s for s in noise if s > 11] == [16]  # at the run's cadence: its first rows are not measured again
    assert rec.run.noise.rows["step"].tolist() == noise  # the panel sees what the folder holds
    assert run.meta["noise_scale"]["two_sizes"] == "accumulation"  # the meta goes on too


def test_a_second_resumer_is_refused_and_the_first_keeps_every_step(tmp_path):
    model = TinyConv()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False):
        accumulate(model, opt, 4, 0)
    a = Recorder(model, opt, log_dir=tmp_path / "run", resume=True, trace_nonfinite=False)
    other = TinyConv()
    with pytest.raises(FileExistsError, match="being written by another Recorder"):
        Recorder(other, log_dir=tmp_path / "run", resume=True)  # before a's first step as after it
    accumulate(model, opt, 3, 1)
    with pytest.raises(FileExistsError, match="being written by another Recorder"):
        Recorder(other, log_dir=tmp_path / "run", resume=True)
    accumulate(model, opt, 3, 2)
    a.detach()
    assert load_run(tmp_path / "run").steps.tolist() == list(range(10))
    # a resumer detached before its first step gives the folder back untouched
    size = (tmp_path / "run" / "steps.bin").stat().st_size
    Recorder(other, log_dir=tmp_path / "run", resume=True).detach()
    b_opt = torch.optim.SGD(other.parameters(), lr=0.01)
    with Recorder(other, b_opt, log_dir=tmp_path / "run", resume=True, trace_nonfinite=False):
        assert (tmp_path / "run" / "steps.bin").stat().st_size == size
        accumulate(other, b_opt, 2, 3)
    assert load_run(tmp_path / "run").steps.tolist() == list(range(12))


RESUMER = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_resume_owner import TinyConv, accumulate
    from gradwidget import Recorder

    model = TinyConv()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(model, opt, log_dir={log_dir!r}, resume=True, trace_nonfinite=False)
    accumulate(model, opt, 2, 5)
    print("resumed", flush=True)
    sys.stdin.read()  # hold the folder until the test says
    accumulate(model, opt, 2, 6)
    rec.detach()
    """
)


def test_a_resumer_in_another_process_is_never_cut_by_a_later_one(tmp_path):
    log_dir = tmp_path / "run"
    model = TinyConv()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(model, opt, log_dir=log_dir, trace_nonfinite=False):
        accumulate(model, opt, 3, 0)
    script = RESUMER.format(tests=str(Path(__file__).parent), log_dir=str(log_dir))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "resumed"
        assert RunReader(log_dir).run.steps.tolist() == list(range(5))
        with pytest.raises(FileExistsError, match="being written by another Recorder"):
            Recorder(TinyConv(), log_dir=log_dir, resume=True)
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert load_run(log_dir).steps.tolist() == list(range(7))  # the other process's steps, all of them


def test_resume_from_a_checkpoint_step_replaces_the_steps_trained_again(tmp_path):
    model = TinyConv()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Recorder(model, opt, log_dir=tmp_path / "run", trace_nonfinite=False, histogram_every=2):
        accumulate(model, opt, 8, 0)  # steps 0-7; a checkpoint was taken after step 4
    with Recorder(model, opt, log_dir=tmp_path / "run", resume=4, trace_nonfinite=False, histogram_every=2) as rec:
        accumulate(model, opt, 5, 9)  # step numbers go on from the checkpoint: 5-9
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == list(range(10)) == rec.run.steps.tolist()
    np.testing.assert_array_equal(run.metric("grad_norm"), rec.run.metric("grad_norm"))
    assert run.hist_steps.tolist() == [0, 2, 4, 6, 8]
    noise = run.noise.rows["step"].tolist()
    assert noise == sorted(set(noise))
    with pytest.raises(TypeError, match="resume must be True, False or the step number"):
        Recorder(model, log_dir=tmp_path / "run", resume=-1)


class TinyLM(nn.Module):
    """A Trainer-ready model of its own (an embedding, a GRU and a head), returning its loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(32, 16)
        self.rnn = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 32)

    def forward(self, input_ids, labels=None, **kwargs):
        logits = self.head(self.rnn(self.emb(input_ids))[0])
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


@pytest.mark.slow
def test_hf_trainer_resumed_from_a_checkpoint_keeps_its_own_step_numbers(tmp_path):
    """Accumulation over 2 micro-batches; a checkpoint at step 4, a crash at step 6; the Trainer
    resumed from the checkpoint trains 5-10 again: the run holds 1-10 once each, 5-6 the new ones."""
    transformers = pytest.importorskip("transformers")
    from gradwidget.integrations.transformers import GradwidgetCallback

    g = torch.Generator().manual_seed(1)
    data = [
        {"input_ids": torch.randint(0, 32, (8,), generator=g), "labels": torch.randint(0, 32, (8,), generator=g)}
        for _ in range(96)
    ]

    class Crash(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 6:
                raise RuntimeError("crash")

    def trainer(callbacks):
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"),
            max_steps=10,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            save_strategy="steps",
            save_steps=4,
            report_to=[],
            use_cpu=True,
            learning_rate=1e-2,
            disable_tqdm=True,
            logging_steps=1,
        )
        return transformers.Trainer(model=TinyLM(), args=args, train_dataset=data, callbacks=callbacks)

    first = GradwidgetCallback(log_dir=tmp_path / "run", resume=True, trace_nonfinite=False)
    with pytest.raises(RuntimeError, match="crash"):
        trainer([first, Crash()]).train()
    first.detach()  # the process ends with the crash
    assert load_run(tmp_path / "run").steps.tolist() == [1, 2, 3, 4, 5, 6]
    second = GradwidgetCallback(log_dir=tmp_path / "run", resume=True, trace_nonfinite=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradwidget")  # no step renumbered, nothing unwritten
        t = trainer([second])
        t.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == list(range(1, 11)) == second.run.steps.tolist()
    logged = [h["loss"] for h in t.state.log_history if "loss" in h]
    np.testing.assert_allclose(run.scalar("loss")[4:], logged[-6:], rtol=1e-5)  # 5-10: the second phase's
    noise = run.noise.rows["step"].tolist()  # accumulation: the noise rows go on, once per step
    assert noise == sorted(set(noise)) and noise[-1] == 10


@pytest.mark.slow
def test_lightning_resumed_from_a_checkpoint_keeps_its_own_step_numbers(tmp_path):
    """The same under Lightning: accumulation over 2 batches, a checkpoint at step 4, a crash at 6,
    ``fit(ckpt_path=...)``: the run holds 1-10 once each, 5-6 recorded again."""
    L = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader, TensorDataset

    from gradwidget.integrations.lightning import GradwidgetCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = TinyConv()

        def training_step(self, batch, i):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Crash(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            if trainer.global_step == 6:
                raise RuntimeError("crash")

    g = torch.Generator().manual_seed(2)
    data = DataLoader(TensorDataset(torch.randn(96, 3, 8, generator=g), torch.randint(0, 2, (96,), generator=g)), 4)

    def fit(callbacks, ckpt_path=None):
        saver = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
        trainer = L.Trainer(
            max_steps=10,
            accumulate_grad_batches=2,
            callbacks=[*callbacks, saver],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
        )
        trainer.fit(Module(), data, ckpt_path=ckpt_path)

    first = GradwidgetCallback(log_dir=tmp_path / "run", resume=True, trace_nonfinite=False)
    with pytest.raises(RuntimeError, match="crash"):
        fit([first, Crash()])
    assert load_run(tmp_path / "run").steps.tolist() == [1, 2, 3, 4, 5, 6]
    (ckpt,) = [p for p in (tmp_path / "ckpt").iterdir() if "step=4" in p.name]
    second = GradwidgetCallback(log_dir=tmp_path / "run", resume=True, trace_nonfinite=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*gradwidget")
        fit([second], ckpt_path=ckpt)
    run = load_run(tmp_path / "run")
    assert run.steps.tolist() == list(range(1, 11)) == second.run.steps.tolist()
    np.testing.assert_array_equal(run.metric("grad_norm")[4:], second.run.metric("grad_norm")[4:])
