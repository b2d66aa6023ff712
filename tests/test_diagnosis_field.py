"""Diagnoses on runs the zoo does not contain, trained here on real models: healthy
fine-tuning and short noisy runs get no finding a user would act on, and total damage is Critical.
Each case was a false alarm (or an understated one) before the rules read trends with a statistic
that knows noise and run length, and read frozen parts as fine-tuning."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gradwidget import Recorder, analyze, summary  # noqa: E402 (skipped without torch)

ACTED_ON = ("Critical", "High", "Medium")


def _train(model, params, batches, lr, steps, forward):
    """``steps`` AdamW steps recorded by a Recorder, the loss logged; the Run."""
    opt = torch.optim.AdamW(params, lr=lr)
    rec = Recorder(model, opt)
    for i in range(steps):
        loss = forward(model, batches(i))
        opt.zero_grad()
        loss.backward()
        rec.log(loss=loss)
        opt.step()
    rec.detach()
    return rec.run


def _alarms(rep) -> list[tuple[str, str, str]]:
    return [(d.cause, d.priority, d.evidence) for d in rep.diagnoses if d.priority in ACTED_ON]


def _python_text() -> tuple[torch.Tensor, int]:
    """English text that ships with Python (the Zen, and the json package's source) as characters."""
    import codecs
    import inspect
    import json
    import this

    s = codecs.decode(this.s, "rot13") + inspect.getsource(json)
    chars = sorted(set(s))
    idx = {c: i for i, c in enumerate(chars)}
    return torch.tensor([idx[c] for c in s]), len(chars)


@pytest.mark.filterwarnings("ignore:fan_in_fan_out:UserWarning", "ignore::FutureWarning")
def test_lora_adapters_at_a_working_rate_are_normal_training():
    """LoRA (peft) on a small causal LM pretrained here: the base is frozen, lora_B starts at zero
    (so lora_A's first gradients are exactly zero) and the loss, already well below chance, moves
    little. Before: "plateau, Medium" (and "lr_too_low: raise 10-100x" on the issue's model)."""
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    ids, V = _python_text()
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=V, n_positions=64)
    base = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)

    def batch(i, B=16, T=32):
        st = torch.randint(0, ids.numel() - T - 1, (B,), generator=g)
        return torch.stack([ids[s : s + T] for s in st])

    def lm(m, x):
        return m(input_ids=x, labels=x).loss

    _train(base, base.parameters(), batch, 3e-3, 60, lm)  # brief pretraining
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0))
    run = _train(model, [p for p in model.parameters() if p.requires_grad], batch, 3e-3, 60, lm)
    rep = analyze(run)
    assert any(n.endswith("lora_B.default.weight") for n in run.layer_names)
    assert not _alarms(rep) and rep.overall_health == "Healthy", _alarms(rep)
    assert {d.cause for d in rep.diagnoses} <= {"frozen", "plateau"}  # information, Low


def test_a_short_noisy_resnet_run_is_progress_not_a_stuck_one():
    """A Hugging Face ResNet (basic blocks), AdamW 1e-3, batches of 16, 40 steps on noisy digits:
    the loss falls slowly under heavy batch noise. Before: "lr_too_low, Medium" (a least-squares
    slope over noise read as a slow fall), and on the issue's ResNet-18 "plateau, Medium"."""
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None]
    x = (x - x.mean()) / x.std()
    x = torch.nn.functional.interpolate(x + 2.0 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0)), 16)
    y = torch.tensor(d.target)
    cfg = transformers.ResNetConfig(
        num_channels=1,
        embedding_size=16,
        hidden_sizes=[16, 32, 64],
        depths=[1, 1, 1],
        layer_type="basic",
        num_labels=10,
    )
    model = transformers.ResNetForImageClassification(cfg)
    g = torch.Generator().manual_seed(0)

    def batch(i):
        return torch.randint(0, len(x), (16,), generator=g)

    run = _train(model, model.parameters(), batch, 1e-3, 40, lambda m, b: m(pixel_values=x[b], labels=y[b]).loss)
    rep = analyze(run)
    assert not rep.diagnoses, [(d.cause, d.priority, d.evidence) for d in rep.diagnoses]
    loss = run.scalar("loss")
    assert np.median(loss[-5:]) < np.median(loss[:5])  # it did learn, slowly


def _distilbert(freeze: bool):
    torch.manual_seed(0)
    V, T = 100, 16
    cfg = transformers.DistilBertConfig(
        vocab_size=V, dim=32, n_layers=3, n_heads=2, hidden_dim=64, max_position_embeddings=T, num_labels=2
    )
    model = transformers.DistilBertForSequenceClassification(cfg)
    if freeze:
        model.distilbert.embeddings.requires_grad_(False)
        model.distilbert.transformer.layer[0].requires_grad_(False)
    g = torch.Generator().manual_seed(0)

    def batch(i):
        x = torch.randint(2, V, (32, T), generator=g)
        y = torch.randint(0, 2, (32,), generator=g)
        x[:, 3] = y  # the label is a marker token
        return x, y

    params = [p for p in model.parameters() if p.requires_grad]
    return _train(model, params, batch, 1e-3, 60, lambda m, b: m(input_ids=b[0], labels=b[1]).loss)


def test_a_distilbert_frozen_at_its_input_side_reads_as_the_same_network_unfrozen():
    """A randomly initialised DistilBERT with its embeddings and first layer frozen on purpose: its
    next layer's attention query/key start with tiny gradients (near-uniform attention), as they
    do unfrozen. Before: "vanishing, High" frozen and nothing unfrozen."""
    frozen, unfrozen = analyze(_distilbert(True)), analyze(_distilbert(False))
    assert not _alarms(unfrozen), _alarms(unfrozen)
    assert not _alarms(frozen), _alarms(frozen)
    assert [d.cause for d in frozen.diagnoses] == ["frozen"]


def test_a_gpt2_whose_loss_never_leaves_chance_is_critical():
    """GPT-2 (4 layers) at lr 0.1: the loss jumps, then sits at ln(vocab) for the rest of the run:
    the model learns nothing, whatever else is wrong. Before: lr_too_high at High, a "Warning"."""
    torch.manual_seed(0)
    V = 256
    cfg = transformers.GPT2Config(n_layer=4, n_head=2, n_embd=64, vocab_size=V, n_positions=32)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(0)

    def batch(i):  # a learnable chain, next = 3 * prev + 1 (mod V), 10% of tokens replaced at random
        x = torch.empty(16, 32, dtype=torch.long)
        x[:, 0] = torch.randint(0, V, (16,), generator=g)
        for t in range(1, 32):
            x[:, t] = (3 * x[:, t - 1] + 1) % V
        noise = torch.rand(x.shape, generator=g) < 0.1
        x[noise] = torch.randint(0, V, (int(noise.sum()),), generator=g)
        return x

    run = _train(model, model.parameters(), batch, 0.1, 60, lambda m, x: m(input_ids=x, labels=x).loss)
    rep = analyze(run)
    top = rep.diagnoses[0]
    assert top.cause == "lr_too_high" and top.priority == "Critical" and rep.overall_health == "Critical"
    assert "never left chance level" in top.evidence or "diverged" in top.evidence, top.evidence
    assert summary(run).overall_health.value == "Critical"  # one verdict
