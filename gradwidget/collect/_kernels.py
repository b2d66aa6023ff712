"""The statistics kernels both recorders run on a step's gradients (``collect/torch.py`` on whole
tensors, ``collect/distributed.py`` on each rank's shards): fused norms, the exponent counts of the
histogram, the one packed device-to-host copy, and what a rank holds of a DTensor (``local_piece``,
``pending_sum``). Private to ``gradwidget.collect``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections import defaultdict

import numpy as np
import torch

from ..run import HIST_LOG2_LO, N_BINS


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor (FSDP2's shards, tensor parallelism's pieces). Asked of
    ``sys.modules``: no DTensor exists until something imported ``torch.distributed.tensor``, and
    asking never imports it (a single process stays without it)."""
    dt = sys.modules.get("torch.distributed.tensor")
    return dt is not None and isinstance(t, dt.DTensor)


def pending_sum(t: object) -> bool:
    """Whether ``t`` is a DTensor whose ranks hold parts of a sum still to be done (a ``Partial``
    placement: sequence parallelism's LayerNorm gradients, one part per rank's tokens)."""
    if not is_dtensor(t):
        return False
    from torch.distributed.tensor import Partial

    return any(isinstance(pl, Partial) for pl in t.placements)  # type: ignore[attr-defined]  # a DTensor


def local_piece(t: torch.Tensor) -> torch.Tensor:
    """What this process holds of ``t``: a DTensor's local tensor, any other tensor itself."""
    return t.to_local() if is_dtensor(t) else t  # type: ignore[attr-defined]  # a DTensor


def acc_dtype(tensors: list[torch.Tensor]) -> torch.dtype:
    """The dtype statistics of ``tensors`` are accumulated in: float32, or float64 when one of them
    is float64. Never the tensors' own half precision: a float16 sum overflows at 65504 (a norm of
    100k entries of 300 would read Inf), as ``clip_grad_norm_`` users know."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def norms(tensors: list[torch.Tensor], ord: float = 2) -> torch.Tensor:
    """Fused ``ord``-norms of ``tensors`` (one ``_foreach_norm``), accumulated in ``acc_dtype``."""
    return torch.stack(torch._foreach_norm(tensors, ord, dtype=acc_dtype(tensors)))


#: take the statistics of CPU tensors as on an accelerator (``as_accelerator``): off; a test
#: switches it on to check the accelerator's path without one
_CPU_AS_ACCELERATOR = False


def as_accelerator(device: torch.device) -> bool:
    """Whether statistics of tensors on ``device`` are taken as on an accelerator (the fused
    Triton kernel where it runs, else ``_foreach_norm`` for every order): every device but the
    CPU, which has faster kernels of its own (``grad_rows``)."""
    return device.type != "cpu" or _CPU_AS_ACCELERATOR


def grad_rows(grads: list[torch.Tensor]) -> torch.Tensor:
    """Rows L2 norm, L1 norm, max |g|, non-zero count and sum (float64, ``(5, len(grads))``) for a
    group of same-device/dtype gradients, left on the device for the caller to copy. Every sum is
    accumulated in ``acc_dtype`` whatever the gradients' dtype.

    On CUDA the multi-tensor ``_foreach_norm`` kernels are fastest for every order; on CPU they are
    only fast for the L2 norm, while per-tensor ``abs()`` (then its norms, max and count) and ``sum``
    are 2-15x faster (bench/overhead.py), so CPU uses those, all five on one tensor before the next:
    it is read from memory once and then from cache (6-10% faster than five passes over all of
    them). On CPU |g|'s smallest and largest entries come from one ``aminmax`` over its bits as
    integers (ordered as the values are: |g| has no sign bit), and its non-zeros are counted only
    when the smallest is zero: most gradients have none, and the count is the dearest of the five. None of them syncs with
    the host on CUDA; on CPU reading the smallest is a read of memory.
    """
    acc = acc_dtype(grads)
    if as_accelerator(grads[0].device):
        l2, l1, linf, nnz = (norms(grads, o) for o in (2, 1, math.inf, 0))
        sums = torch.stack([g.sum(dtype=acc) for g in grads])
        return torch.stack([r.to(torch.float64) for r in (l2, l1, linf, nnz, sums)])
    # one list per statistic, each stacked and converted once
    l2s: list[torch.Tensor] = []
    l1s: list[torch.Tensor] = []
    maxes: list[torch.Tensor] = []
    counts: list[int] = []
    totals: list[torch.Tensor] = []
    for g in grads:  # one |g| buffer alive at a time: no fresh pages for a list of them
        a = g.abs()
        l2s.append(torch.linalg.vector_norm(a, 2, dtype=acc))
        l1s.append(a.sum(dtype=acc))
        as_int = _SAME_SIZE_INT.get(a.dtype)
        if as_int is None:
            maxes.append(a.amax())
            counts.append(int(count_nonzero_abs(a)))
        else:
            lo, hi = torch.aminmax(a.view(as_int))
            maxes.append(hi.view(a.dtype))  # NaN's bits are above Inf's: a NaN is the largest, as amax has it
            counts.append(int(count_nonzero_abs(a)) if lo.item() == 0 else a.numel())
        totals.append(g.sum(dtype=acc))
    rows = [torch.stack(r).to(torch.float64) for r in (l2s, l1s, maxes, totals)]
    rows.insert(3, torch.tensor(counts, dtype=torch.float64))
    return torch.stack(rows)


#: the integer type of each float type's size: |g| is zero exactly where its bits are (abs clears
#: the sign of -0.0; NaN and subnormals have bits set)
_SAME_SIZE_INT = {
    torch.float32: torch.int32,
    torch.float64: torch.int64,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def count_nonzero_abs(a: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Non-zero entries of ``a = |g|``, counted over its bits as integers: CPU's integer count is
    faster than its float count."""
    as_int = _SAME_SIZE_INT.get(a.dtype)
    return torch.count_nonzero(a if as_int is None else a.view(as_int), dim=dim)


def stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Same-shape tensors as the rows of one ``(k, numel)`` matrix (one copy); a stale plan (a
    tensor gone, reshaped, sparse or moved) raises here and is planned again by the caller."""
    with torch.no_grad():
        x = torch.stack(tensors)
    if x.layout != torch.strided:
        raise TypeError("stacked tensors must be dense")
    return x.reshape(len(tensors), -1)


def stacked_rows(x: torch.Tensor) -> torch.Tensor:
    """``grad_rows`` of the rows of ``stacked(grads)``: five row reductions for the whole stack
    instead of five ops per tensor (many small tensors cost their Python and dispatch
    overhead, not their arithmetic). The L2 norm is squared and summed in float64, whatever ``x``'s
    dtype: a row has at most ``STACK_NUMEL`` entries, and no float32 square can then overflow or
    underflow it (``_norm_range``: nothing to take again)."""
    acc = acc_dtype([x])
    a = x.abs()
    rows = (
        torch.linalg.vector_norm(x, 2, dim=1, dtype=torch.float64),
        a.sum(1, dtype=acc),
        a.amax(1).to(acc),
        count_nonzero_abs(a, dim=1).to(acc),
        x.sum(1, dtype=acc),
    )  # counts <= STACK_NUMEL: exact
    return torch.stack(rows).to(torch.float64)


def stacked_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norms of the rows of ``stacked(tensors)``, accumulated in ``acc_dtype``."""
    return torch.linalg.vector_norm(x, 2, dim=1, dtype=acc_dtype([x]))


def stored_values(g: torch.Tensor) -> torch.Tensor:
    """The entries a gradient stores: itself, or a sparse gradient's coalesced values (duplicate
    indices summed, as the dense gradient has them). Every statistic we take (norms, max, non-zero
    count, sum, exponent counts) is the same over these as over the dense tensor, whose other
    entries are zeros; sizes come from the dense shape (``g.numel()``)."""
    return g.coalesce().values() if g.layout == torch.sparse_coo else g


def read_in_place(tensors: list[torch.Tensor], device: torch.device, dtype: torch.dtype) -> list[torch.Tensor]:
    """``tensors`` as a kernel that reads raw addresses needs them (``_fused``'s Triton kernel,
    and nothing else): ``numel`` stored entries from each ``data_ptr``, in any order (every
    statistic is order-free, so a permuted dense layout such as channels-last is read as it is;
    any other view through a contiguous copy), a lazily negated view (``torch._neg_view``)
    resolved. A tensor of another device or dtype raises ``TypeError``: moved or recast since the
    plan, it is planned again by the caller."""
    out = []
    for t in tensors:
        if t.dtype != dtype or t.device != device:
            raise TypeError("a tensor's dtype or device changed since the statistics were planned")
        if t.is_neg():
            t = t.resolve_neg()
        out.append(t if in_one_block(t) else t.contiguous())
    return out


def in_one_block(t: torch.Tensor) -> bool:
    """Whether ``t``'s entries fill ``numel`` consecutive slots from ``data_ptr`` in some order
    (contiguous, channels-last and other permuted layouts)."""
    if t.layout != torch.strided:
        return False
    if t.is_contiguous():
        return True
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1)
    span = 1
    for st, sz in dims:
        if st != span:
            return False
        span *= sz
    return True


def biased_exponents(x: torch.Tensor) -> torch.Tensor:
    """The float32 biased exponent of each entry of ``x`` (same shape, 0..255: 0 for zeros and
    subnormals, 255 for Inf/NaN): its bits shifted, where a log2 would cost a transcendental. A
    finite float64 entry beyond float32's range gets the largest finite exponent (254: the top bin,
    where every value beyond the bins lands), not Inf's; one below it reads as a subnormal (0)."""
    x = x.detach()
    f = x.float()
    if x.dtype == torch.float64:
        f = torch.where(torch.isinf(f) & torch.isfinite(x), torch.finfo(torch.float32).max, f)
    return torch.bitwise_right_shift(f.view(torch.int32), 23).bitwise_and_(255)


def exponent_counts(grads: list[torch.Tensor]) -> torch.Tensor:
    """``(len(grads), OCTAVE_COLUMNS)`` octave counts of |g| (``octaves``), on the device: one shift and
    one count (``count_values``) of the float32 biased exponents per tensor instead of a log10 and a
    histc (3x faster than torch.histc of the logarithms)."""
    return octaves(torch.stack([count_values(biased_exponents(g).reshape(-1), 256) for g in grads]))


def count_values(idx: torch.Tensor, n: int) -> torch.Tensor:
    """How many times each of ``0 .. n-1`` occurs in ``idx``: ``bincount`` on CPU. Elsewhere never
    ``bincount``: CUDA's reads the largest index back to the host to size its output (a sync per
    call) even when ``minlength`` already fixes it. On CUDA ``histc_count`` counts up to 4,096 values
    (a tensor's exponents, ``n`` = 256; a stack's of up to 16 rows, 256 per row); ``scatter_count``
    counts more (a larger stack), every count under ``torch.use_deterministic_algorithms`` (CUDA's
    histc has no deterministic kernel) and every count on other devices (histc is measured on CUDA
    only)."""
    if idx.device.type == "cpu":
        return torch.bincount(idx, minlength=n)
    if idx.device.type == "cuda" and n * n <= HISTC_EXACT and not torch.are_deterministic_algorithms_enabled():
        return histc_count(idx, n)
    return scatter_count(idx, n)


#: torch.histc counts in its input's dtype (float32 here): exact up to 2**24 per bin, so it is fed at
#: most this many entries at a time; and a bin index ``x * n / n`` is exact while ``x * n`` is
HISTC_EXACT = 1 << 24


def histc_count(idx: torch.Tensor, n: int, chunk: int = HISTC_EXACT) -> torch.Tensor:
    """``count_values`` of ``idx`` (integers in ``0 .. n-1``, ``n * n <= HISTC_EXACT``) by
    ``torch.histc`` over float32 chunks of at most ``chunk`` entries. A gradient's entries fall in a
    few dozen exponents: ``scatter_add_`` then queues millions of global atomic adds on each of a
    few addresses, where histc counts in each block's shared memory first (bench/gpu.py --kernels)."""
    counts = [torch.histc(part.float(), bins=n, min=0, max=n) for part in idx.reshape(-1).split(chunk)]
    # one chunk (a tensor of at most 2**24 entries): no zeros to add it to; each op is a launch
    return counts[0].long() if len(counts) == 1 else torch.stack(counts).long().sum(0)


def scatter_count(idx: torch.Tensor, n: int) -> torch.Tensor:
    idx = idx.reshape(-1).long()
    return torch.zeros(n, dtype=torch.int64, device=idx.device).scatter_add_(0, idx, torch.ones_like(idx))


def stacked_exponent_counts(x: torch.Tensor) -> torch.Tensor:
    """``exponent_counts`` of the rows of ``stacked(grads)``: one bincount, each row's exponents
    offset into a block of 256 of its own."""
    k = x.shape[0]
    e = biased_exponents(x)
    e += torch.arange(0, 256 * k, 256, device=x.device, dtype=e.dtype).unsqueeze(1)
    return octaves(count_values(e.reshape(-1), 256 * k).view(k, 256))


#: where each float32 biased exponent's count goes: ``e`` in 1..254 holds
#: ``2**(e-127) <= |g| < 2**(e-126)``, an octave of the Run's histogram (clipped to its ends); 0
#: holds zeros and subnormals (not counted here: ``octave_bins`` derives them), 255 Inf/NaN
_OCTAVE_OF_EXPONENT = [N_BINS] + [min(max(e - 127 - HIST_LOG2_LO, 0), N_BINS - 1) for e in range(1, 255)] + [N_BINS + 1]
#: octave counts per tensor: the Run's ``N_BINS``, then zeros and subnormals, then Inf/NaN
OCTAVE_COLUMNS = N_BINS + 2


def octaves(counts: torch.Tensor) -> torch.Tensor:
    """``(k, 256)`` exponent counts summed into ``(k, OCTAVE_COLUMNS)`` on the device (one small op):
    a quarter of the host copy, and no per-tensor work on the host (where thousands of tiny
    tensors would spend most of a histogram step)."""
    return counts.new_zeros((counts.shape[0], OCTAVE_COLUMNS)).index_add_(1, _octave_index(counts.device), counts)


@functools.lru_cache(maxsize=None)
def _octave_index(device: torch.device) -> torch.Tensor:
    """``_OCTAVE_OF_EXPONENT`` on ``device``, made once (a copy to a GPU per step could wait on it)."""
    return torch.tensor(_OCTAVE_OF_EXPONENT, device=device)


def octave_bins(c: np.ndarray, nonzero: np.ndarray) -> np.ndarray:
    """The Run's octave-bin histograms from host octave counts ``c`` (tensors, OCTAVE_COLUMNS) and
    each tensor's exact non-zero count ``nonzero`` (NaN and Inf included): the subnormals (non-zero,
    yet no octave and not Inf/NaN) go to the lowest bin, whatever else the tensor holds."""
    c = np.rint(c).astype(np.int64)
    out = c[:, :N_BINS].copy()
    counted = out.sum(axis=1) + c[:, N_BINS + 1]
    out[:, 0] += np.maximum(0, np.rint(nonzero).astype(np.int64) - counted)
    return out.astype(np.uint64)


class HostCopy:
    """Tensors to bring to the host, packed into one float64 tensor per device so that a recorded
    step costs one device-to-host copy per device (float64 holds counts exactly up to 2**53)."""

    def __init__(self) -> None:
        self._parts: dict = defaultdict(list)
        self._host: dict = {}

    def add(self, t: torch.Tensor) -> tuple:
        """Queue ``t``; returns the handle to ``get`` it by after ``fetch``."""
        parts = self._parts[t.device]
        parts.append(t.reshape(-1).to(torch.float64))
        return t.device, len(parts) - 1, tuple(t.shape)

    def fetch(self) -> None:
        for dev, parts in self._parts.items():
            host = torch.cat(parts).cpu().numpy()
            ends = np.cumsum([p.numel() for p in parts])
            self._host[dev] = np.split(host, ends[:-1])

    def get(self, handle: tuple) -> np.ndarray:
        dev, k, shape = handle
        return self._host[dev][k].reshape(shape)
