"""Healthy runs the way people train, on real data: the new architectures (Llama, a mixture of
experts, T5, DistilBERT, ConvNeXt, GRU and RNN language models, a tabular MLP) and the first ones on
scikit-learn's sets and the Python distribution's English text, with warmup + cosine schedules,
step decay, clipping, weight decay, small noisy batches, short (40 steps) and long (300-400) runs,
fine-tuning from a model pretrained inside the bench with parts frozen on purpose, and LoRA (peft).

Every healthy run's loss falls beyond its batch noise (checks.HEALTHY_FALL_T); the parameters a recipe freezes on
purpose are its ``intended_frozen``, not a fault. Seed 0 (and the issue's scenarios) calibrate;
the ``_h`` runs (other seeds, mostly other data or styles) are held out.
"""

from __future__ import annotations

from . import styles as st
from .case import HEALTHY
from .cases import _add, _first_module
from .heldout import HELDOUT
from .models import DIGITS_CNN, DIGITS_HF, DIGITS_VIT, TABULAR, TEXT
from .pretrain import Pretrain

#: the states fine-tuning starts from: LMs on the language reference, vision models on digits 0-4
LM_TEXT = Pretrain("reference", 300, tuple(sorted(TEXT.items())))
LLAMA_TEXT = Pretrain("reference", 300)
RESNET_DIGITS = Pretrain("digits_0_4", 200, tuple(sorted(DIGITS_HF.items())))
CONVNEXT_DIGITS = Pretrain("digits_0_4", 200)
VIT_DIGITS = Pretrain("digits_0_4", 200, tuple(sorted(DIGITS_VIT.items())))
#: a modern LM recipe: warmup then cosine decay, clipping at 1, weight decay 0.1
MODERN = (st.warmup_cosine(10), st.clip(1.0), st.weight_decay(0.1))


def healthy(arch: str, optimizer: str, style: str = "", *, heldout: bool = False, seed: int = 0, **kw):
    """A healthy case (held out when ``heldout``)."""
    return _add(arch, optimizer, HEALTHY, seed=seed, style=style, into=HELDOUT if heldout else None, **kw)


def _tab(task: str) -> dict:
    return {"task": task, "variant": TABULAR[task]}


# ----------------------------------------------------------------------------- new architectures
healthy("gru", "adamw")
healthy("gru", "sgd")
healthy("gru", "sgd", heldout=True, seed=1)
healthy("rnn", "adamw")
healthy("rnn", "sgd", "clip", styles=[st.clip(1.0)])
healthy("rnn", "adamw", "clip", heldout=True, seed=1, styles=[st.clip(1.0)])
healthy("llama", "adamw")
healthy("llama", "adamw", "cosine-clip", styles=MODERN)
healthy("llama", "sgd")
healthy("llama", "adamw", "cosine-clip", heldout=True, seed=2, styles=MODERN)
healthy("moe", "adamw")
healthy("moe", "adamw", "cosine-clip", styles=MODERN)
healthy("moe", "adamw", heldout=True, seed=2)
healthy("t5", "adamw")
healthy("t5", "adamw", "cosine", seed=1, styles=[st.warmup_cosine(10)])
healthy("t5", "adamw", heldout=True, seed=2)
healthy("distilbert", "adamw")
healthy("distilbert", "adamw", seed=1)
healthy("distilbert", "adamw", heldout=True, seed=2)
healthy("convnext", "adamw")
healthy("convnext", "sgd")
healthy("convnext", "adamw", "cosine", heldout=True, seed=1, styles=[st.warmup_cosine(10)])
healthy("tabular", "adamw", "wine", **_tab("wine"))
healthy("tabular", "sgd", "wine", **_tab("wine"))
healthy("tabular", "adamw", "cancer", **_tab("cancer"))
healthy("tabular", "adamw", "diabetes", **_tab("diabetes"))
healthy("tabular", "sgd", "digits", **_tab("digits_flat"))
healthy("tabular", "sgd", "cancer-long", steps=400, **_tab("cancer"))
healthy("tabular", "adamw", "wine", heldout=True, seed=1, **_tab("wine"))
healthy("tabular", "sgd", "cancer", heldout=True, seed=1, **_tab("cancer"))
healthy("tabular", "sgd", "diabetes", heldout=True, seed=1, **_tab("diabetes"))
healthy("tabular", "adamw", "digits-wd", heldout=True, seed=1, styles=[st.weight_decay(0.1)], **_tab("digits_flat"))

# ----------------------------------------------------------------------------- the first archs on real data
healthy("gpt2", "adamw", "text-cosine-clip", task="reference", variant=TEXT, styles=MODERN)
healthy("gpt2", "adamw", "text-cosine-clip", heldout=True, seed=1, task="reference", variant=TEXT, styles=MODERN)
healthy("lstm", "sgd", "text-clip", task="reference", variant=TEXT, styles=[st.clip(0.5)])
healthy("lstm", "adamw", "text-long", steps=300, task="reference", variant=TEXT)
_CNN_DIGITS = {"task": "digits", "variant": DIGITS_CNN}
healthy("cnn", "sgd", "digits", styles=[st.lr(0.05)], **_CNN_DIGITS)
healthy("cnn", "adamw", "digits-b8", task="digits_b8", variant=DIGITS_CNN, styles=[st.lr(3e-3)])
healthy("cnn", "sgd", "digits-steplr", styles=[st.lr(0.05), st.step_decay(40, 0.3)], **_CNN_DIGITS)
healthy("cnn", "adamw", "digits-b8", heldout=True, seed=1, task="digits_b8", variant=DIGITS_CNN, styles=[st.lr(3e-3)])
healthy("vit", "adamw", "digits", task="digits", variant=DIGITS_VIT)
healthy(
    "vit",
    "adamw",
    "digits-cosine",
    heldout=True,
    seed=1,
    task="digits",
    variant=DIGITS_VIT,
    styles=[st.warmup_cosine(10)],
)
healthy("resnet", "sgd", "digits-steplr", task="digits", variant=DIGITS_HF, styles=[st.step_decay(40, 0.3)])
healthy("resnet", "adamw", "digits", heldout=True, seed=1, task="digits", variant=DIGITS_HF)
healthy("bert", "adamw", "clip", seed=4, styles=[st.clip(1.0)])
# short and long runs
healthy("mlp", "adamw", "short", seed=2, steps=40)
healthy("cnn", "adamw", "short", seed=2, steps=40)
healthy("gpt2", "adamw", "short", seed=2, steps=40)
healthy("mlp", "sgd", "long", seed=2, steps=400)
healthy("mlp", "adamw", "short", heldout=True, seed=3, steps=40)
healthy("tabular", "adamw", "wine-short", heldout=True, seed=2, steps=40, **_tab("wine"))

# ----------------------------------------------------------------------------- the scenarios (calibration)
# an HF ResNet (basic blocks), AdamW 1e-3, batches of 16, 40 steps: a noisy, falling loss
healthy("resnet", "adamw", "digits-b16-40", steps=40, task="digits_b16", variant=DIGITS_HF, styles=[st.lr(1e-3)])
# a randomly initialised DistilBERT with its embeddings and first layer frozen on purpose
_DISTIL_FROZEN = {"freeze": ("distilbert.embeddings", "distilbert.transformer.layer.0")}
healthy("distilbert", "adamw", "frozen-emb-l0", variant=_DISTIL_FROZEN)
healthy("distilbert", "adamw", "frozen-emb-l0", heldout=True, seed=1, variant=_DISTIL_FROZEN)
# LoRA (peft) on a small causal LM pretrained here, lr 3e-3, fine-tuned on stdlib docstrings
# (adapters on every linear layer, as peft's "all-linear"; 200 steps: a fine-tuning gain is small
# and shows beyond the batch noise only after ~150 steps)
_GPT2_LORA = {**TEXT, "lora": ("c_attn", "c_fc", "c_proj")}
_LORA = {"task": "docstrings", "steps": 200}
healthy("gpt2", "adamw", "lora", variant=_GPT2_LORA, pretrain=LM_TEXT, styles=[st.lr(3e-3)], **_LORA)
healthy("gpt2", "adamw", "lora", heldout=True, seed=1, variant=_GPT2_LORA, pretrain=LM_TEXT, **_LORA)

# ----------------------------------------------------------------------------- fine-tuning, frozen on purpose
_LLAMA_LORA = {"lora": ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
healthy("llama", "adamw", "lora", variant=_LLAMA_LORA, pretrain=LLAMA_TEXT, **_LORA)
healthy(
    "llama",
    "adamw",
    "lora-cosine",
    heldout=True,
    seed=1,
    variant=_LLAMA_LORA,
    pretrain=LLAMA_TEXT,
    styles=[st.warmup_cosine(10)],
    **_LORA,
)
# a pretrained backbone frozen, a new head trained on the other digits
_RESNET_FT = {**DIGITS_HF, "freeze": ("resnet",)}
_FT = {"task": "digits_5_9", "styles": [st.reset_head("classifier.1")]}
healthy("resnet", "adamw", "ft-frozen", variant=_RESNET_FT, pretrain=RESNET_DIGITS, **_FT)
healthy("resnet", "sgd", "ft-frozen", heldout=True, seed=1, variant=_RESNET_FT, pretrain=RESNET_DIGITS, **_FT)
healthy(
    "convnext",
    "adamw",
    "ft-frozen",
    variant={"freeze": ("convnext.embeddings", "convnext.encoder.stages.0")},
    pretrain=CONVNEXT_DIGITS,
    task="digits_5_9",
    styles=[st.reset_head("classifier")],
)
healthy(
    "vit",
    "adamw",
    "ft-partial",
    variant={**DIGITS_VIT, "freeze": ("vit.embeddings", _first_module("vit", "ViTLayer"))},
    pretrain=VIT_DIGITS,
    task="digits_5_9",
    styles=[st.reset_head("classifier")],
)
