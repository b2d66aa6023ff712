"""The Triton kernel of ``_fused`` (imported by it on first use, where Triton is installed): per
program, a slice of one tensor from a table of addresses reduced to a partial row of its five
statistics and, on histogram steps, its float32 exponent counts."""

import triton
import triton.language as tl


@triton.jit
def take(x, sq, l1, total, top, nonzero, counts, HIST: tl.constexpr):
    """One block's entries (``x``, float32) added to a program's per-lane accumulators."""
    a = tl.abs(x)
    x64 = x.to(tl.float64)
    sq += x64 * x64
    l1 += a.to(tl.float64)
    total += x64
    top = tl.maximum(top, a)
    nonzero += (x != 0).to(tl.int32)
    if HIST:
        counts += tl.histogram((a.to(tl.int32, bitcast=True) >> 23) & 255, 256)
    return sq, l1, total, top, nonzero, counts


@triton.jit
def partial_rows(
    ptrs,
    numels,
    part,
    hist,
    n_hist,
    BLOCK: tl.constexpr,
    DTYPE: tl.constexpr,
    WITH_HIST: tl.constexpr,
):
    """Program (t, s) reads blocks s, s + split, ... of tensor t and writes its partial row:
    whole blocks without a mask, then the ragged last block, by the program whose turn it is."""
    t = tl.program_id(0)
    s = tl.program_id(1).to(tl.int64)
    split = tl.num_programs(1).to(tl.int64)
    base = tl.load(ptrs + t).to(tl.pointer_type(DTYPE))
    n = tl.load(numels + t)
    hist_on = WITH_HIST and t < n_hist
    lanes = tl.arange(0, BLOCK)
    sq = tl.zeros([BLOCK], tl.float64)
    l1 = tl.zeros([BLOCK], tl.float64)
    total = tl.zeros([BLOCK], tl.float64)
    top = tl.zeros([BLOCK], tl.float32)
    nonzero = tl.zeros([BLOCK], tl.int32)
    counts = tl.zeros([256], tl.int32)
    whole = n // BLOCK
    for b in tl.range(s, whole, split):
        x = tl.load(base + b * BLOCK + lanes).to(tl.float32)
        if hist_on:
            sq, l1, total, top, nonzero, counts = take(x, sq, l1, total, top, nonzero, counts, True)
        else:
            sq, l1, total, top, nonzero, counts = take(x, sq, l1, total, top, nonzero, counts, False)
    if whole * BLOCK < n and s == whole % split:  # masked lanes read 0: exponent 0, a column octave_bins derives
        offs = whole * BLOCK + lanes
        x = tl.load(base + offs, mask=offs < n, other=0.0).to(tl.float32)
        if hist_on:
            sq, l1, total, top, nonzero, counts = take(x, sq, l1, total, top, nonzero, counts, True)
        else:
            sq, l1, total, top, nonzero, counts = take(x, sq, l1, total, top, nonzero, counts, False)
    at = (t * split + s) * 5
    tl.store(part + at, tl.sum(sq))
    tl.store(part + at + 1, tl.sum(l1))
    tl.store(part + at + 2, tl.max(top).to(tl.float64))
    tl.store(part + at + 3, tl.sum(nonzero.to(tl.int64)).to(tl.float64))
    tl.store(part + at + 4, tl.sum(total))
    if hist_on:
        tl.store(hist + (t * split + s) * 256 + tl.arange(0, 256), counts)
