"""Norms that neither overflow nor underflow wherever the value fits float32.

PyTorch's eager norm kernels square and sum in float32 (``_kernels.acc_dtype``): a float32 gradient of 1,000
entries of 1e18 has the norm 3.2e19, which float32 holds, but its squares (1e36 each) sum past
float32's 3.4e38 to Inf; entries of 1e-23 square to 1e-46, below float32's smallest subnormal, and
sum to 0. LAPACK's ``nrm2`` scales by the largest entry before squaring; we get the same answer
without a cost on ordinary steps: the maximum |g| is measured anyway, so the few tensors whose
float32 norm cannot be trusted (an infinite norm with finite entries, or entries so small that
their squares leave float32's normal range) are found on the host and their norms taken again,
accumulated in float64 (whose range holds the square of every float32). One more host read on a
step that has them; none otherwise. The fused kernel (``_fused``) and the stacks of small
tensors already sum in float64: nothing of theirs is taken again. Private to ``gradwidget.collect``.
"""

from __future__ import annotations

import numpy as np
import torch

#: a largest entry below this squares under float32's smallest normal (2**-126): precision is lost
SQUARE_UNDERFLOW = 2.0**-63
#: the most a float32 square below the normal range is rounded by (half its smallest step, 2**-149)
SUBNORMAL_ERROR = 2.0**-150
#: the relative error of a norm we accept from the float32 sums
NORM_RTOL = 1e-6


def untrusted_norms(l2: np.ndarray, linf: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Positions whose float32-accumulated norm ``l2`` of ``n`` entries cannot be trusted though
    every entry is finite (``linf``, the largest |entry|, is finite): overflowed, or made of squares
    so small that their rounding (each by up to ``SUBNORMAL_ERROR``) could move it by more than
    ``NORM_RTOL`` (an underflowed 0 included). Vanishing gradients of 1e-20 in a few hundred entries
    stay trusted: the check costs no device work and the rescue runs only where it matters."""
    with np.errstate(invalid="ignore", over="ignore"):
        overflow = ~np.isfinite(l2)
        tiny = (linf > 0) & (linf < SQUARE_UNDERFLOW) & (l2 * l2 * 2 * NORM_RTOL <= n * SUBNORMAL_ERROR)
        return np.flatnonzero(np.isfinite(linf) & (overflow | tiny))


def exact_norms(tensors: list[torch.Tensor]) -> np.ndarray:
    """L2 norms of ``tensors`` accumulated in float64 (exact for any finite float32 values): one
    fused ``_foreach_norm``, read to the host in one copy."""
    with torch.no_grad():
        out = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64))
    return out.cpu().numpy()
