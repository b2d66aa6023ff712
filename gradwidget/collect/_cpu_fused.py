"""Every statistic of many CPU tensors in one pass, from a small C library (``_cpu_stats.c``)
compiled once per machine by the system's C compiler and called through ``ctypes``. Private to
``gradwidget.collect``; ``_fused`` calls it for CPU tensors as it calls Triton for a GPU's.

PyTorch's eager CPU kernels read a gradient once per statistic and dispatch a dozen ops a tensor
(``_kernels.grad_rows``): on the Llama-style bench model that is 1.1 ms a step against 0.5 ms for
one pass, on the bench transformer 3.2 ms (on two threads) against 1.5 ms (bench/cpu_pass.py). The pass
is shared among torch's threads, by tensors (``_shares``). The library is built with ``cc`` (or
``$CC``) into ``~/.cache/gradwidget`` (``$XDG_CACHE_HOME``) in about 0.2 s, under a name that
hashes its source, flags, compiler and architecture, and renamed into place whole (processes of
one job may build it at once). Where there is no compiler, the build fails or the platform has no
``cc`` (Windows), ``broken`` says why and the eager kernels take every statistic: the same
numbers, a little slower.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import functools
import hashlib
import heapq
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from ._kernels import in_one_block, read_in_place

#: the C source, beside this module (in the wheel as package data)
SOURCE = Path(__file__).with_name("_cpu_stats.c")
#: optimised, with the source's ``omp simd`` loops vectorised (no OpenMP runtime is linked)
FLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared")
#: the dtypes the library reads, by the suffix of its functions (``gw_rows_*``, ``gw_dots_*``)
_FUNCTIONS = {torch.float32: "f32", torch.float64: "f64"}
#: a float32's biased exponents (the histogram's counts; ``_kernels.octaves`` folds them)
EXPONENTS = 256
#: the fewest entries a thread is handed: a step's pass is shared among torch's threads
#: (``torch.get_num_threads()``, as PyTorch's own kernels are), largest tensors first, but never
#: in shares smaller than this (16 cores, the 4.2 M-parameter transformer's 8.3 M entries: 2.9 ms
#: on 4 threads, 7.4 ms on 16; bench/cpu_pass.py)
SHARE_ENTRIES = 1 << 21
#: seconds the compiler may take before the build counts as failed
BUILD_TIMEOUT = 60

#: why the library cannot be had in this process (no compiler, a failed build), after which the
#: eager kernels take every statistic; None while it works or before it was asked for
broken: str | None = None


def takes(dtype: torch.dtype) -> bool:
    """Whether the library reads CPU tensors of ``dtype`` (float32 or float64; it is built on
    first asking)."""
    return dtype in _FUNCTIONS and _library() is not None


def rows(tensors: list[torch.Tensor], n_full: int, n_hist: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(5, len(tensors))`` float64 rows L2 norm, L1 norm, max |x|, non-zero count and sum of
    same-dtype CPU ``tensors`` (only the L2 norm past the first ``n_full``: weights), and the
    ``(n_hist, 256)`` int64 float32-exponent counts of the first ``n_hist``. A tensor of another
    dtype or device than the first raises ``TypeError`` (the caller plans again): the library reads
    raw addresses."""
    lib = _library()
    dt = tensors[0].dtype
    if lib is None or dt not in _FUNCTIONS:
        raise TypeError(f"no CPU statistics library for {dt}")
    dense = read_in_place(tensors, torch.device("cpu"), dt)
    n = len(dense)
    table = np.fromiter((t.data_ptr() for t in dense), np.int64, n)
    numels = np.fromiter((t.numel() for t in dense), np.int64, n)
    out = np.empty((5, n), np.float64)
    counts = np.empty((max(n_hist, 1), EXPONENTS), np.int64)
    run = functools.partial(
        _run_share, getattr(lib, "gw_rows_" + _FUNCTIONS[dt]), table, numels, n_full, n_hist, out, counts
    )
    shares = _shares(numels, torch.get_num_threads())
    waiting = [_pool(len(shares) - 1).submit(run, share) for share in shares[1:]]
    run(shares[0])  # this thread takes a share too
    for w in waiting:
        w.result()
    return torch.from_numpy(out), (torch.from_numpy(counts[:n_hist]) if n_hist else None)


def dots(g: torch.Tensor, a: torch.Tensor) -> tuple[float, float, float]:
    """``g.g``, ``g.a`` and ``a.a`` of two CPU tensors of one shape, layout and dtype, summed in
    float64 in one pass (the noise probe's increment ``g`` and the gradient ``a`` it is about to be
    added to: their sum's squared norm is ``a.a + 2 g.a + g.g``). Tensors the library cannot read
    entry by entry alike (another dtype, shape or layout, a view that is not one block, a lazily
    negated one) raise ``TypeError``."""
    lib = _library()
    dt = g.dtype
    if lib is None or dt not in _FUNCTIONS or a.dtype != dt or a.device != g.device or g.device.type != "cpu":
        raise TypeError("no CPU statistics library for these tensors")
    if g.shape != a.shape or g.stride() != a.stride() or g.is_neg() or a.is_neg() or not in_one_block(g):
        raise TypeError("the two tensors' entries are not stored alike in one block")
    out = (ctypes.c_double * 3)()
    getattr(lib, "gw_dots_" + _FUNCTIONS[dt])(g.data_ptr(), a.data_ptr(), g.numel(), out)
    return out[0], out[1], out[2]


def _shares(numels: np.ndarray, threads: int) -> list[np.ndarray]:
    """The tensors (ascending indices) each of up to ``threads`` threads reads, at least about
    ``SHARE_ENTRIES`` entries each: the largest first, each to the thread with the fewest so far."""
    n = len(numels)
    k = min(threads, n, int(numels.sum()) // SHARE_ENTRIES)
    if k < 2:
        return [np.arange(n)]
    loads = [(0, j) for j in range(k)]
    owner = np.empty(n, np.int64)
    for i in np.argsort(-numels, kind="stable").tolist():
        load, j = heapq.heappop(loads)
        owner[i] = j
        heapq.heappush(loads, (load + int(numels[i]), j))
    return [np.flatnonzero(owner == j) for j in range(k)]


def _run_share(fn, table, numels, n_full: int, n_hist: int, out, counts, share: np.ndarray) -> None:
    """One library call over the tensors ``share`` (ascending: gradients before weights, as the
    library reads them), its rows and counts written into ``out`` and ``counts`` at their columns."""
    if len(share) == len(table):
        fn(len(share), table.ctypes.data, numels.ctypes.data, n_full, n_hist, out.ctypes.data, counts.ctypes.data)
        return
    m, full, hist = len(share), int(np.count_nonzero(share < n_full)), int(np.count_nonzero(share < n_hist))
    sub_table, sub_numels = np.ascontiguousarray(table[share]), np.ascontiguousarray(numels[share])
    sub_out, sub_counts = np.empty((5, m), np.float64), np.empty((max(hist, 1), EXPONENTS), np.int64)
    fn(m, sub_table.ctypes.data, sub_numels.ctypes.data, full, hist, sub_out.ctypes.data, sub_counts.ctypes.data)
    out[:, share] = sub_out
    counts[share[:hist]] = sub_counts[:hist]


def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """Threads for the shares past the caller's, kept from step to step (made again for more
    threads, or in a forked child, which has none of its parent's)."""
    global _executor
    have = _executor
    if have is None or have[0] != os.getpid() or have[1] < workers:
        if have is not None and have[0] == os.getpid():
            have[2].shutdown(wait=False)
        pool = concurrent.futures.ThreadPoolExecutor(max(workers, 1), thread_name_prefix="gradwidget-stats")
        have = _executor = (os.getpid(), workers, pool)
    return have[2]


#: ``(pid, workers, pool)`` of the threads ``_pool`` made
_executor: tuple | None = None


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The loaded library, built first where no cached build matches; None (and ``broken`` set)
    where it cannot be had."""
    global broken
    try:
        lib = ctypes.CDLL(str(_built()))
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        broken = f"{type(e).__name__}: {str(e)[:300]}"
        return None
    for suffix in _FUNCTIONS.values():
        f = getattr(lib, "gw_rows_" + suffix)
        f.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        f.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
        f.restype = None
        f = getattr(lib, "gw_dots_" + suffix)
        f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p], None
    return lib


def _built() -> Path:
    """The library's path, compiled there if this source, compiler and flags were never built."""
    if sys.platform == "win32":
        raise RuntimeError("no C compiler is looked for on Windows")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    source = SOURCE.read_bytes()
    # the machine's architecture too: a home folder shared by x86-64 and ARM machines holds one of each
    target = f"{sys.platform} {platform.machine()}".encode()
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), cc.encode(), target]))
    folder = _cache_folder()
    path = folder / f"cpu_stats-{key.hexdigest()[:16]}.so"
    if path.exists():
        return path
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, timeout=BUILD_TIMEOUT
        )
        if done.returncode:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-300:]}")
        os.replace(tmp, path)  # whole or not at all: another process may be building it too
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _cache_folder() -> Path:
    """``$XDG_CACHE_HOME/gradwidget`` (``~/.cache/gradwidget``), or where that cannot be written a
    temporary folder of this process's, removed when it exits."""
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gradwidget"
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except (OSError, RuntimeError):  # RuntimeError: no home directory to expand
        pass
    tmp = tempfile.mkdtemp(prefix="gradwidget-")
    atexit.register(shutil.rmtree, tmp, True)
    return Path(tmp)
