"""bench/noise_scale.py's measure of what the data allows: the spread of one measured row's |G|²
estimate, from Σ and G, against the spread of rows drawn as the Recorder's are."""

import numpy as np
import pytest
import torch
from noise_scale import exact_at
from torch import nn


def test_one_rows_spread_of_g2_matches_rows_drawn_from_the_examples():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(300, 5, generator=gen)
    Y = (X[:, 0] + 0.5 * torch.randn(300, generator=gen) > 0).long() + (X[:, 1] > 1).long()
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    b, micro = 8, 4
    b_simple, row_sd = exact_at(model, X, Y, "ce", b, micro)

    per = []  # every example's gradient, flattened, by autograd one at a time
    for x, y in zip(X, Y):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[None]), y[None]).backward()
        per.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double())
    flat = torch.stack(per)
    G = flat.mean(0)
    g2 = float(G.pow(2).sum())
    assert b_simple == pytest.approx(float((flat - G).pow(2).sum(1).mean()) / g2, rel=1e-9)

    rows = []  # the Recorder's rows: micro-batches drawn with replacement, the mean of X_iᵀX_j over pairs
    for _ in range(4000):
        means = flat[torch.randint(0, len(flat), (micro, b), generator=gen)].mean(1)
        gram = means @ means.T
        rows.append(float((gram.sum() - gram.diag().sum()) / (micro * (micro - 1))))
    rows = np.array(rows)
    assert rows.mean() / g2 == pytest.approx(1.0, abs=4 * rows.std() / g2 / np.sqrt(len(rows)))
    assert rows.std() / g2 == pytest.approx(row_sd, rel=0.08)
