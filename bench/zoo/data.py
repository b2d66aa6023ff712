"""Learnable synthetic tasks with a fixed seed: the zoo needs losses that clearly fall on a healthy
run in ~100 steps, on CPU, without downloading a data set.

Every task is a fixed training set drawn once from its seed; ``batch(step)`` cycles through it in a
seeded order, so a case is reproducible step for step. Real-valued inputs are standardised (mean 0,
std 1 per feature) so that an unnormalised input is a mistake the zoo injects, not an accident.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def _as_is(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass
class Task:
    """A fixed data set and how to cut it into batches. ``prepare`` is the preprocessing a careful
    user applies to each batch (the synthetic sets are stored standardised: nothing to do); ``raw``
    is what the model gets when it is forgotten; ``regression`` tasks are scored by mean squared error."""

    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    seed: int
    prepare: Callable[[torch.Tensor], torch.Tensor] = _as_is
    raw: Callable[[torch.Tensor], torch.Tensor] = _as_is
    regression: bool = False

    def __post_init__(self) -> None:
        self._gen = torch.Generator().manual_seed(self.seed + 1000)
        self._order = torch.randperm(len(self.x), generator=self._gen)
        self._pos = 0

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pos + self.batch_size > len(self.x):
            self._order = torch.randperm(len(self.x), generator=self._gen)
            self._pos = 0
        i = self._order[self._pos : self._pos + self.batch_size]
        self._pos += self.batch_size
        return self.x[i], self.y[i]


def _standardise(x: torch.Tensor) -> torch.Tensor:
    """Per-feature mean 0, std 1 over the data set (the first axis)."""
    return (x - x.mean(0, keepdim=True)) / x.std(0, keepdim=True).clamp_min(1e-6)


def clusters(seed: int, n: int = 2048, dim: int = 32, classes: int = 8, batch_size: int = 64) -> Task:
    """Gaussian clusters: one random centre per class, unit noise around it."""
    g = torch.Generator().manual_seed(seed)
    centres = 0.6 * torch.randn(classes, dim, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centres[y] + torch.randn(n, dim, generator=g)
    return Task(_standardise(x), y, batch_size, seed)


def images(seed: int, n: int = 1024, size: int = 32, classes: int = 4, batch_size: int = 32) -> Task:
    """Class templates plus noise: a smooth random 3 x size x size pattern per class."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(classes, 3, size // 8, size // 8, generator=g)
    templates = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    y = torch.randint(0, classes, (n,), generator=g)
    x = templates[y] + 4.0 * torch.randn(n, 3, size, size, generator=g)
    return Task(_standardise(x), y, batch_size, seed)


def markov_tokens(
    seed: int, n: int = 512, length: int = 32, vocab: int = 64, batch_size: int = 16, p_follow: float = 0.9
) -> Task:
    """Token sequences from a sparse Markov chain: each token is followed by its fixed successor with
    probability ``p_follow``, else by a uniform random token. ``y`` is ``x`` shifted by one."""
    g = torch.Generator().manual_seed(seed)
    successor = torch.randperm(vocab, generator=g)
    seq = torch.empty(n, length + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(length):
        follow = torch.rand(n, generator=g) < p_follow
        seq[:, t + 1] = torch.where(follow, successor[seq[:, t]], torch.randint(0, vocab, (n,), generator=g))
    return Task(seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), batch_size, seed)


def marker_tokens(
    seed: int, n: int = 1024, length: int = 16, vocab: int = 64, classes: int = 4, batch_size: int = 32
) -> Task:
    """Token-presence classification: each sequence holds exactly one of ``classes`` marker tokens
    (ids 1..classes) at a random position among ordinary tokens; the label is which marker. Position
    0 is a [CLS]-like token, the last id; id 0 (BERT's padding id, which never trains) is not used."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(classes + 1, vocab - 1, (n, length), generator=g)
    x[:, 0] = vocab - 1
    y = torch.randint(0, classes, (n,), generator=g)
    pos = torch.randint(1, length, (n,), generator=g)
    x[torch.arange(n), pos] = y + 1
    return Task(x, y, batch_size, seed)
