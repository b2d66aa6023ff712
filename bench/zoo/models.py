"""The zoo's architectures: small configurations of the models people train, random init, CPU.

Each ``Arch`` knows how to build its model, its default task, how to turn a batch into
``(N, classes)`` logits, and the learning rates a healthy run uses with each optimizer. The
transformers models (hf.py) are built from their config classes (no download); dropout is off so
healthy runs are deterministic. ``build`` adds what fine-tuning does to a model: parts frozen on
purpose, a pretrained state, LoRA adapters (peft).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from . import data, hf, real

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

    def __init__(self, classes: int = 4, act: str = "relu", in_ch: int = 3, size: int = 32):
        super().__init__()
        A = ACTIVATIONS[act]
        self.features = nn.Sequential(
            nn.Conv2d(in_ch, 8, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1),
            A(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(16 * (size // 8) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


RECURRENT = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}


class RecurrentLM(nn.Module):
    """Embedding + a 2-layer recurrent network (LSTM, GRU or Elman RNN with tanh) + Linear
    next-token head: the language model of the PyTorch word_language_model example."""

    def __init__(self, vocab: int = 64, emb: int = 32, hidden: int = 64, cell: str = "lstm", layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb)
        self.rnn = RECURRENT[cell](emb, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.emb(x))[0])


def LSTMLM(**kw) -> RecurrentLM:
    return RecurrentLM(cell="lstm", **kw)


def GRULM(vocab: int = real.TEXT_VOCAB, **kw) -> RecurrentLM:
    return RecurrentLM(cell="gru", vocab=vocab, **kw)


def RNNLM(vocab: int = real.TEXT_VOCAB, **kw) -> RecurrentLM:
    return RecurrentLM(cell="rnn", vocab=vocab, **kw)


class TabularMLP(nn.Module):
    """The tabular model of a Kaggle notebook: Linear-ReLU-Dropout blocks (``body``) and a separate
    ``head`` (a Linear to the classes, or to one value for regression)."""

    def __init__(self, n_in: int = 13, classes: int = 3, width: int = 64, depth: int = 3, act: str = "relu"):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(depth):
            layers += [nn.Linear(n_in if i == 0 else width, width), ACTIVATIONS[act](), nn.Dropout(0.1)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _lm_logits(out: torch.Tensor) -> torch.Tensor:
    return out.reshape(-1, out.shape[-1])


#: the tasks a case can train on, by name (an arch's default or a case's ``task``)
TASKS: dict[str, Callable[[int], data.Task]] = {
    "clusters": data.clusters,
    "images": data.images,
    "markov": data.markov_tokens,
    "markers": data.marker_tokens,
    "digits": real.digits_images,
    "digits_0_4": functools.partial(real.digits_images, classes=(0, 1, 2, 3, 4)),
    "digits_5_9": functools.partial(real.digits_images, classes=(5, 6, 7, 8, 9)),
    "digits_b16": functools.partial(real.digits_images, batch_size=16),
    "digits_b8": functools.partial(real.digits_images, batch_size=8),
    "wine": real.wine,
    "cancer": real.breast_cancer,
    "diabetes": real.diabetes,
    "digits_flat": real.digits_flat,
    "reference": real.text_lm,
    "docstrings": functools.partial(real.text_lm, source="docstrings"),
    "text_source": real.text_source,
    "recase": real.text_recase,
}
#: build options that fit a model to the real tasks' shapes
TEXT = {"vocab": real.TEXT_VOCAB}
DIGITS_CNN = {"in_ch": 1, "size": 8, "classes": 10}
DIGITS_HF = {"channels": 1, "labels": 10}
DIGITS_VIT = {"channels": 1, "size": 8, "patch": 2, "labels": 10}
TABULAR = {
    "wine": {"n_in": 13, "classes": 3},
    "cancer": {"n_in": 30, "classes": 2},
    "diabetes": {"n_in": 10, "classes": 1},
    "digits_flat": {"n_in": 64, "classes": 10},
}


def _call(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return m(x)


def _lm(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _lm_logits(m(x))


def _hf_lm(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _lm_logits(m(input_ids=x).logits)


def _hf_seq2seq(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Teacher forcing: the model shifts ``labels`` right into its decoder inputs."""
    return _lm_logits(m(input_ids=x, labels=y).logits)


def _hf_text(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return m(input_ids=x).logits


def _hf_image(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return m(pixel_values=x).logits


@dataclass(frozen=True)
class Arch:
    """One architecture: model, default task, forward to flat logits, and its healthy learning rates."""

    name: str
    build: Callable[..., nn.Module]
    task: str  #: a TASKS name
    forward: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]  #: (model, x, y) -> (N, classes)
    lr: dict = field(default_factory=dict)  #: optimizer name -> healthy lr
    flat_targets: bool = False  #: targets are (N, T): flatten them


ARCHS: dict[str, Arch] = {
    a.name: a
    for a in [
        Arch("mlp", MLP, "clusters", _call, {"sgd": 0.1, "adamw": 3e-3}),
        Arch("cnn", CNN, "images", _call, {"sgd": 0.01, "adamw": 1e-3}),
        Arch("lstm", LSTMLM, "markov", _lm, {"sgd": 1.0, "adamw": 1e-2}, flat_targets=True),
        Arch("gpt2", hf.gpt2, "markov", _hf_lm, {"sgd": 0.3, "adamw": 3e-3}, flat_targets=True),
        Arch("bert", hf.bert, "markers", _hf_text, {"adamw": 1e-3}),
        Arch("resnet", hf.resnet, "images", _hf_image, {"sgd": 0.05, "adamw": 3e-3}),
        Arch("vit", hf.vit, "images", _hf_image, {"sgd": 0.05, "adamw": 1e-3}),
        Arch("gru", GRULM, "reference", _lm, {"sgd": 1.0, "adamw": 1e-2}, flat_targets=True),
        Arch("rnn", RNNLM, "reference", _lm, {"sgd": 0.3, "adamw": 3e-3}, flat_targets=True),
        Arch("llama", hf.llama, "reference", _hf_lm, {"sgd": 0.3, "adamw": 3e-3}, flat_targets=True),
        Arch("moe", hf.mixtral, "reference", _hf_lm, {"adamw": 3e-3}, flat_targets=True),
        Arch("t5", hf.t5, "recase", _hf_seq2seq, {"adamw": 3e-3}, flat_targets=True),
        Arch("distilbert", hf.distilbert, "markers", _hf_text, {"adamw": 1e-3}),
        Arch("convnext", hf.convnext, "digits", _hf_image, {"sgd": 0.05, "adamw": 3e-3}),
        Arch("tabular", TabularMLP, "wine", _call, {"sgd": 0.05, "adamw": 3e-3}),
    ]
}


def build(arch: str, state: dict | None = None, **variant) -> nn.Module:
    """``arch``'s model with its build options; ``state`` (a pretrained state dict) is loaded first,
    then ``freeze`` (module paths frozen on purpose) and ``lora`` (module names that get LoRA
    adapters of rank 4: peft freezes everything else)."""
    freeze, lora = variant.pop("freeze", ()), variant.pop("lora", ())
    model = ARCHS[arch].build(**variant)
    if state is not None:
        model.load_state_dict(state)
    for path in freeze:
        model.get_submodule(path).requires_grad_(False)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(lora)))
    return model
