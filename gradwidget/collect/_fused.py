"""Every statistic of many tensors in one pass and one GPU launch (a Triton kernel), where Triton
is installed (it comes with PyTorch's CUDA wheels on Linux); everywhere else PyTorch's eager kernels
take them (``_kernels``: the same rows and exponent counts). Private to ``gradwidget.collect``.

On an accelerator the eager kernels of ``_kernels`` read a step's gradients once per statistic
(L2, L1 and max |g| by ``_foreach_norm``, the non-zero count one kernel per tensor, the sum one
kernel per tensor, the weight norms again): about 240 launches and six passes over the large
model's memory a recorded step (the costs page of the documentation, "On a GPU"). Here one program reads a slice of one
tensor from a table of addresses, keeps the five statistics (and, on histogram steps, the counts
of the float32 exponents) in registers, and writes one partial row; a few small ops sum the
partials. Sums are accumulated in float64 per lane (no float32 overflow or underflow of a norm).
No atomics: the same inputs give the same bits. The first launch compiles the kernel (0.5 s on
an H100), once per process and dtype.

``TRITON_INTERPRET=1`` runs the same kernel on CPU tensors (Triton's interpreter, in numpy): how
the tests check it on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings

import torch

from .._warnings import GradwidgetWarning
from . import _kernels
from ._kernels import HostCopy, octaves, read_in_place

#: entries one program reads per iteration
BLOCK = 1024
#: warps a program runs on (Triton's default)
NUM_WARPS = 4
#: at most this many programs share one tensor: enough to spread a large embedding over the
#: GPU's multiprocessors, few enough that the partial rows stay small
MAX_SPLIT = 128
#: at most this many bytes of partial exponent counts on a histogram step (int32 x 256 a program)
HIST_PARTIAL_BYTES = 64 << 20
#: the partial row: sum of squares, sum of |x|, max |x|, non-zero count, sum
_PARTS = 5
#: exponent values of a float32 (the histogram's counts; ``_kernels.octaves`` folds them)
_EXPONENTS = 256

#: the dtypes the kernel reads, by their name in ``triton.language``
_ELEMENTS = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}

#: switched off by a benchmark that compares the fused kernel with the eager ones
ENABLED = True
#: why the kernel failed in this process (its first failure: no compiler for this GPU, a Triton
#: too old), after which the eager kernels take every statistic; None while it works
broken: str | None = None


@functools.lru_cache(maxsize=1)
def _triton():
    """``(triton.language, kernel)``, or None where Triton is not installed or fails to
    import. Imported on first use: a process that never records on a GPU never loads it."""
    try:
        import triton.language as tl

        from ._fused_kernel import partial_rows
    except Exception:  # not installed, or an install that cannot load (a broken wheel, no compiler)
        return None
    return tl, partial_rows


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def takes(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the fused kernel reads tensors of ``dtype`` on ``device``: float32, float16 or
    bfloat16 on a CUDA device with Triton importable (float64 keeps the eager path: the kernel
    reads in float32); CPU tensors only under Triton's interpreter, where a test takes the
    accelerator's path on CPU (``_kernels.as_accelerator``)."""
    if not ENABLED or broken is not None or dtype not in _ELEMENTS:
        return False
    if device.type == "cpu":
        if not (_interpreting() and _kernels.as_accelerator(device)):
            return False
    elif device.type != "cuda" or _interpreting():  # the interpreter reads addresses on the host
        return False
    return _triton() is not None


def rows(tensors: list[torch.Tensor], n_hist: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(5, len(tensors))`` float64 rows L2 norm, L1 norm, max |x|, non-zero count and sum (the
    rows of ``_kernels.grad_rows``) of same-device, same-dtype ``tensors``, and the ``(n_hist,
    256)`` int64 exponent counts of the first ``n_hist`` of them (None when 0), both left on the
    device. A NaN or Inf shows in the L2 norm (max |x| may drop a NaN: the caller counts such a
    tensor's entries itself). One launch, then four small ops."""
    tl, kernel = _triton()
    dev, dt = tensors[0].device, tensors[0].dtype
    if dt not in _ELEMENTS:  # recast since the plan to a dtype the kernel cannot read: planned again
        raise TypeError("a tensor's dtype or device changed since the statistics were planned")
    element = getattr(tl, _ELEMENTS[dt])
    dense = read_in_place(tensors, dev, dt)
    n = len(dense)
    numels = [t.numel() for t in dense]
    table = _table([t.data_ptr() for t in dense] + numels, dev)
    split = max(1, min(MAX_SPLIT, -(-max(numels) // BLOCK)))
    if n_hist:  # each program's 256 counts: fewer programs a tensor than a large model's partials would take
        split = max(1, min(split, HIST_PARTIAL_BYTES // (n_hist * _EXPONENTS * 4)))
    part = torch.empty(n * split * _PARTS, dtype=torch.float64, device=dev)
    hist = torch.empty(max(n_hist, 1) * split * _EXPONENTS, dtype=torch.int32, device=dev)
    try:
        # Triton launches on the current device: a model spread over GPUs has tensors elsewhere
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            kernel[(n, split)](
                table,
                table[n:],
                part,
                hist,
                n_hist,
                BLOCK=BLOCK,
                DTYPE=element,
                WITH_HIST=n_hist > 0,
                num_warps=NUM_WARPS,
            )
    except Exception as e:  # compiling or launching failed: say so once, and stop trying
        global broken
        broken = f"{type(e).__name__}: {str(e)[:300]}"
        warnings.warn(
            f"gradwidget's fused statistics kernel (Triton) failed on {dev}, so the eager PyTorch "
            f"kernels take the statistics from now on (the same numbers, a little slower): {broken}",
            GradwidgetWarning,
            stacklevel=2,
        )
        raise RuntimeError("the fused statistics kernel failed") from e
    p = part.view(n, split, _PARTS)
    out = p.sum(1)
    out[:, 2] = p[:, :, 2].amax(1)
    out[:, 0].sqrt_()
    counts = hist.view(-1, split, _EXPONENTS)[:n_hist].sum(1, dtype=torch.int64) if n_hist else None
    return out.T, counts


def queue(
    pack: HostCopy, grads: list[torch.Tensor], weights: list[torch.Tensor], with_hist: bool
) -> tuple[tuple | None, tuple | None, tuple | None]:
    """Queue in ``pack``, from one launch, the ``(5, len(grads))`` rows of ``grads``, the L2 norms
    of ``weights`` and (``with_hist``) the gradients' ``(len(grads), OCTAVE_COLUMNS)`` octave
    counts: their handles, None for what was not asked (gradients go first: only theirs are
    counted by exponent)."""
    n, tensors = len(grads), grads + weights
    r, counts = rows(tensors, n_hist=n if with_hist else 0)
    return (
        pack.add(r[:, :n]) if n else None,
        pack.add(r[0, n:]) if weights else None,
        pack.add(octaves(counts)) if counts is not None else None,
    )


def _table(values: list[int], dev: torch.device) -> torch.Tensor:
    """The tensors' addresses then sizes, on ``dev``: copied without waiting for the device (the
    CUDA driver stages a pageable source at once), and not at all when they are the last step's."""
    key = (dev, tuple(values))
    last = _last_table.get(dev)
    if last is not None and last[0] == key:
        return last[1]
    table = torch.tensor(values, dtype=torch.int64).to(dev, non_blocking=True)
    _last_table[dev] = (key, table)
    return table


#: the last table each device was given (one entry per device)
_last_table: dict = {}
