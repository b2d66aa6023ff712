"""The binary step and histogram records: built from a Run, read in bounded chunks, checked
(no writer could have produced a bad one) and appended to a Run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..run import METRICS, SCALARS, Run
from .layout import RunFormatError, file_size, hist_dtype, open_regular, step_dtype


def step_records(run: Run, a: int = 0, b: int | None = None) -> np.ndarray:
    """The records (``step_dtype``, the format written) of the run's step rows ``a`` to ``b``
    (default: all); the non-finite counts exact."""
    b = run.n_steps if b is None else b
    rec = np.zeros(max(0, b - a), step_dtype(run.n_layers))
    rec["step"] = run.steps[a:b]
    for s in SCALARS:
        rec[s] = run.scalar(s)[a:b]
    for m in METRICS:
        rec[m] = run.metric(m)[a:b]
    return rec


def hist_records(run: Run, a: int = 0, b: int | None = None) -> np.ndarray:
    """The records (``hist_dtype``: 64-bit counts) of the run's histograms ``a`` to ``b`` (default: all)."""
    counts = run.hist[a:b]
    rec = np.zeros(len(counts), hist_dtype(run.n_layers))
    rec["step"], rec["counts"] = run.hist_steps[a:b], counts
    return rec


#: bytes of records read, checked and taken at a time: a damaged or sparse multi-GB file fails at
#: its first bad record without the reader ever holding more than this of it
READ_CHUNK_BYTES = 16 << 20


def _not_after(steps: np.ndarray, prev_step) -> np.ndarray:
    """Which step numbers do not come after the one before them (the first after ``prev_step``,
    the last step already read, if any): step numbers only increase."""
    prev = np.concatenate([[prev_step if prev_step is not None else np.iinfo(np.int64).min], steps[:-1]])
    return steps <= prev


def bad_step_record(recs: np.ndarray, prev_step) -> tuple[int, str] | None:
    """The first record that no writer could have produced (index, why), or None. Records carry
        their step number, which only increases, and norms, fractions and counts are never negative
    (``Run.append`` enforces the first; no recorder produces the second):
        random bytes, or a meta.json listing a different number of layers, break these at once."""
    if not len(recs):
        return None
    steps = recs["step"]
    checks: list[tuple[Any, str]] = [
        (_not_after(steps, prev_step), "its step number {step} does not follow the previous step")
    ]
    with np.errstate(invalid="ignore"):
        checks.append((recs["global_norm"] < 0, "its global norm is negative"))
        for m in METRICS:
            checks.append(((recs[m] < 0).any(axis=1), f"its {m} is negative"))
    bad = np.zeros(len(recs), bool)
    for mask, _ in checks:
        bad |= mask
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    why = next(msg for mask, msg in checks if mask[i])
    return i, why.format(step=int(steps[i]))


def bad_hist_record(hists: np.ndarray, prev_step, steps: np.ndarray) -> tuple[int, str] | None:
    """The first histogram record whose step is out of order or not a recorded step, or None."""
    if not len(hists):
        return None
    hs = hists["step"]
    pos = np.clip(np.searchsorted(steps, hs), 0, max(len(steps) - 1, 0))
    recorded = (steps[pos] == hs) if len(steps) else np.zeros(len(hs), bool)
    out_of_order = _not_after(hs, prev_step)
    bad = out_of_order | ~recorded
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    why = "does not follow the previous histogram" if out_of_order[i] else "is not a step in steps.bin"
    return i, f"its step number {int(hs[i])} {why}"


def read_records(p: Path, offset: int, dt: np.dtype, size: int) -> tuple[np.ndarray, int]:
    """The whole ``dt`` records of file ``p`` (``size`` bytes long) after ``offset``, at most
    ``READ_CHUNK_BYTES`` of them (one record at least), and the offset after them."""
    whole = min((size - offset) // dt.itemsize, max(1, READ_CHUNK_BYTES // dt.itemsize))
    if whole <= 0:
        return np.zeros(0, dt), offset
    with open_regular(p) as f:
        try:
            f.seek(offset)
            buf = f.read(whole * dt.itemsize)
        except OSError as e:
            raise RunFormatError(f"{p} cannot be read: {e.strerror or e}") from None
    n = len(buf) // dt.itemsize
    return np.frombuffer(buf[: n * dt.itemsize], dtype=dt), offset + n * dt.itemsize


#: step records read to decide which layer count a steps.bin was written with
_PROBE_RECORDS = 64


def _plausible_records(recs: np.ndarray) -> bool:
    """Could a writer have produced these step records? (Stricter than ``bad_step_record``: also
    fractions in [0, 1] and whole counts of non-finite values.)"""
    if bad_step_record(recs, None) is not None:
        return False
    zf, nf = recs["zero_frac"], recs["nonfinite"]
    with np.errstate(invalid="ignore"):
        ok_zf = np.isnan(zf) | ((zf >= 0) & (zf <= 1))
        ok_nf = np.isnan(nf) | (nf == np.floor(nf))
    return bool(ok_zf.all() and ok_nf.all())


def layer_mismatch(p: Path, n_layers: int, version: int) -> str | None:
    """If steps.bin (format ``version``) is not whole records of ``n_layers`` layers but is whole,
    plausible records (at least two) of another layer count, a sentence naming both numbers; else None."""
    size = file_size(p)
    base = step_dtype(0, version).itemsize
    per_layer = step_dtype(1, version).itemsize - base
    # two records of a candidate must fit in a read chunk: the probe reads no more than that
    top = (min(size, READ_CHUNK_BYTES) // 2 - base) // per_layer
    if top < 1:
        return None
    ls = np.arange(1, top + 1, dtype=np.int64)
    fits = np.flatnonzero(size % (base + per_layer * ls) == 0) + 1
    plausible = []
    for n in fits.tolist():
        if n == n_layers:
            continue
        dt = step_dtype(n, version)
        with open_regular(p) as f:
            k = min(_PROBE_RECORDS, READ_CHUNK_BYTES // dt.itemsize, size // dt.itemsize)
            recs = np.frombuffer(f.read(k * dt.itemsize), dtype=dt)
        if _plausible_records(recs):
            plausible.append((not _norms_agree(recs), n))  # a layout whose norms add up comes first
    if not plausible:
        return None
    n = min(plausible)[1]
    return (
        f"meta.json lists {n_layers} layers, but steps.bin holds {size // step_dtype(n, version).itemsize} whole "
        f"records of {n} layers: meta.json belongs to another run (or was edited)"
    )


def _norms_agree(recs: np.ndarray) -> bool:
    """Is each record's global norm the root sum of squares of its layers' norms, as recorders
    write it? True of the layout a file was written with, and of hardly any other reading of it."""
    gn = recs["global_norm"]
    g = recs["grad_norm"].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        expect = np.sqrt(np.nansum(g * g, axis=1))
        ok = ~np.isfinite(gn) | np.isclose(gn, expect, rtol=1e-3, atol=0)
    return bool(ok.all() and np.isfinite(gn).any())


def append_records(run: Run, recs: np.ndarray) -> None:
    """Append step records (``step_dtype``, either format) to ``run``: each row as float64, so the
    non-finite counts of format 2 stay exact."""
    for r in recs:
        run.append(int(r["step"]), np.stack([r[m] for m in METRICS]), {s: r[s] for s in SCALARS})


def bad_noise_record(recs: np.ndarray, prev_step) -> tuple[int, str] | None:
    """The first noise row (``noise.bin``) no recorder could have written (index, why), or None:
    steps increase, batch sizes are positive (or NaN: unknown), squared norms are not negative."""
    with np.errstate(invalid="ignore"):
        checks: list[tuple[Any, str]] = [
            (_not_after(recs["step"], prev_step), "its step number {step} does not follow the previous row"),
            ((recs["b_small"] <= 0) | (recs["b_big"] <= 0) | (recs["n_small"] < 2), "its batch sizes are not valid"),
            (
                (recs["small_sq"] < 0).any(axis=1) | (recs["big_sq"] < 0).any(axis=1) | (recs["small_total"] < 0),
                "a squared norm is negative",
            ),
        ]
    bad = np.logical_or.reduce([mask for mask, _ in checks])
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return i, next(msg for mask, msg in checks if mask[i]).format(step=int(recs["step"][i]))
