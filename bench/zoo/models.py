"""The zoo's architectures: small configurations of the models people train, random init, CPU.

Each ``Arch`` knows how to build its model, its task, how to turn a batch into ``(N, classes)``
logits, and the learning rates a healthy run uses with each optimizer. The transformers models are
built from their config classes (no download); dropout is off so healthy runs are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from . import data

ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}


class MLP(nn.Module):
    """``depth`` Linear+activation layers of width ``width`` and a Linear head, default init."""

    def __init__(self, n_in: int = 32, width: int = 64, depth: int = 6, classes: int = 8, act: str = "relu"):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(n_in if i == 0 else width, width), ACTIVATIONS[act]()]
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Three Conv2d+activation(+max-pool) blocks and a Linear head, no normalisation."""

    def __init__(self, classes: int = 4, act: str = "relu"):
        super().__init__()
        A = ACTIVATIONS[act]
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class LSTMLM(nn.Module):
    """Embedding + 2-layer LSTM + Linear next-token head."""

    def __init__(self, vocab: int = 64, emb: int = 32, hidden: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=64,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg)


def _bert() -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    cfg = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg.num_labels = 4
    return BertForSequenceClassification(cfg)


def _resnet() -> nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    cfg = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")
    cfg.num_labels = 4
    return ResNetForImageClassification(cfg)


def _vit() -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    cfg.num_labels = 4
    return ViTForImageClassification(cfg)


def _lm_logits(out: torch.Tensor) -> torch.Tensor:
    return out.reshape(-1, out.shape[-1])


@dataclass(frozen=True)
class Arch:
    """One architecture: model, task, forward to flat logits, and its healthy learning rates."""

    name: str
    build: Callable[..., nn.Module]
    task: Callable[[int], data.Task]
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]  #: (model, x) -> (N, classes) logits
    lr: dict = field(default_factory=dict)  #: optimizer name -> healthy lr
    flat_targets: bool = False  #: targets are (N, T): flatten them


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        Arch("mlp", MLP, data.clusters, lambda m, x: m(x), {"sgd": 0.1, "adamw": 3e-3}),
        Arch("cnn", CNN, data.images, lambda m, x: m(x), {"sgd": 0.01, "adamw": 1e-3}),
        Arch(
            "lstm",
            LSTMLM,
            data.markov_tokens,
            lambda m, x: _lm_logits(m(x)),
            {"sgd": 1.0, "adamw": 1e-2},
            flat_targets=True,
        ),
        Arch(
            "gpt2",
            _gpt2,
            data.markov_tokens,
            lambda m, x: _lm_logits(m(input_ids=x).logits),
            {"sgd": 0.3, "adamw": 3e-3},
            flat_targets=True,
        ),
        Arch("bert", _bert, data.marker_tokens, lambda m, x: m(input_ids=x).logits, {"adamw": 1e-3}),
        Arch("resnet", _resnet, data.images, lambda m, x: m(pixel_values=x).logits, {"sgd": 0.05, "adamw": 3e-3}),
        Arch("vit", _vit, data.images, lambda m, x: m(pixel_values=x).logits, {"sgd": 0.05, "adamw": 1e-3}),
    ]
}
