"""Models pretrained inside the bench, for the fine-tuning cases (a frozen backbone, LoRA adapters):
train the architecture on one task in plain torch (AdamW, no recorder), keep its state dict in the
cache, and hand it to every case that fine-tunes from it. Nothing is downloaded."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .cache import DEFAULT_CACHE, cache_root


@dataclass(frozen=True)
class Pretrain:
    """What a fine-tuning case starts from: ``arch`` (with build options ``variant``) trained on
    ``task`` for ``steps`` AdamW steps at the arch's healthy AdamW rate, seed 0."""

    task: str
    steps: int = 300
    variant: tuple = ()  #: sorted (key, value) pairs, without the fine-tuning options

    def name(self, arch: str) -> str:
        opts = "".join(f"-{k}{v}" for k, v in self.variant)
        return f"{arch}{opts}-{self.task}-{self.steps}"


def pretrained_state(arch_name: str, spec: Pretrain, cache_dir=DEFAULT_CACHE) -> dict:
    """The state dict of ``arch_name`` pretrained as ``spec`` says, from the cache or trained now."""
    from .models import ARCHS, TASKS, build

    path = cache_root(cache_dir) / "pretrained" / f"{spec.name(arch_name)}.pt"
    if path.is_file():
        return torch.load(path, weights_only=True)
    arch = ARCHS[arch_name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = build(arch_name, **dict(spec.variant))
        task = TASKS[spec.task](0)
        opt = torch.optim.AdamW(model.parameters(), lr=arch.lr["adamw"], weight_decay=0.01)
        for _ in range(spec.steps):
            x, y = task.batch()
            opt.zero_grad()
            logits = arch.forward(model, task.prepare(x), y)
            loss = torch.nn.functional.cross_entropy(logits, y.reshape(-1) if arch.flat_targets else y)
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save(state, tmp)
    tmp.rename(path)
    return state
