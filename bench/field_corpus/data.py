"""Data bundled with installed packages (nothing is downloaded): scikit-learn's digits and
diabetes, the Python language reference text that ships for ``help()``."""

from __future__ import annotations

import numpy as np
import torch


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1797 8x8 digits as float32 in [0, 1] (N x 64), their labels, and a shuffled order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    return x, y, order


def diabetes() -> tuple[np.ndarray, np.ndarray]:
    """442 patients' 10 baseline variables (scikit-learn's scaled copy) and their disease
    progression a year later, the target standardised."""
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return x.astype(np.float32), ((y - y.mean()) / y.std()).astype(np.float32)


def reference_ids(n_chars: int = 200_000) -> tuple[torch.Tensor, int]:
    """The first ``n_chars`` characters of the Python language reference (pydoc_data.topics) as
    ids over its own alphabet, and the alphabet's size."""
    from pydoc_data.topics import topics

    text = "\n".join(topics[k] for k in sorted(topics))[:n_chars]
    alphabet = sorted(set(text))
    idx = {c: i for i, c in enumerate(alphabet)}
    return torch.tensor([idx[c] for c in text]), len(alphabet)
