"""A recorded step's statistics (``StepStatistics``, owned by the Recorder of ``collect/torch.py``):
weight norms, gradient statistics and histogram exponent counts of every column, queued by the
plans of ``_groups`` and brought to the host in one packed copy per device, with what else rides
in that copy (the loss, the NaN tracer's flags, the noise probe's and the zero_grad check's
vectors).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..run import METRICS, N_BINS
from . import _fused
from ._groups import Plan, detached, grad_of
from ._norm_range import exact_norms, untrusted_norms
from ._kernels import (
    HostCopy,
    exponent_counts,
    grad_rows,
    norms,
    octave_bins,
    stacked,
    stacked_exponent_counts,
    stacked_norms,
    stacked_rows,
    stored_values,
)

#: row of each metric in a step's ``(METRICS, L)`` values
_M = {name: i for i, name in enumerate(METRICS)}


class StepStatistics:
    """The statistics of ``ordered`` (the parameter of each column): the plans that group them are
    kept from step to step and made again when one goes stale (a gradient appeared or vanished, a
    parameter moved). A new instance when the columns change."""

    def __init__(self, ordered: list[torch.Tensor]) -> None:
        self.ordered = ordered
        self._wplan: Plan | None = None
        self._gplan: Plan | None = None

    @staticmethod
    def _fuses_small(device: torch.device, dtype: torch.dtype, members: int, numel: int) -> bool:
        """Whether the fused kernel reads a shape group of small tensors a plan would otherwise
        stack: where it runs, its one launch reads them all."""
        return _fused.takes(device, dtype)

    def collect(
        self, with_hist: bool, loss=None, also: Callable[[HostCopy], None] | None = None
    ) -> tuple[np.ndarray, np.ndarray | None, object, HostCopy]:
        """This step's ``(METRICS, L)`` values, ``(L, N_BINS)`` histogram (on histogram steps), loss
        (a tensor loss read in the same copy) and the fetched copy: weight norms, gradient
        statistics, exponent counts, the loss and what ``also(pack)`` queues in it are copied to
        the host once (as ``distributed``'s ``local_partials`` takes it); what it queued is read
        from the returned copy."""
        L = len(self.ordered)
        out = np.full((len(METRICS), L), np.nan, np.float64)  # float64: the non-finite counts exact
        hist = np.zeros((L, N_BINS), np.uint64) if with_hist else None
        with torch.no_grad():
            pack, wparts, gparts = self._queue(with_hist)
            loss_at = pack.add(loss.detach().float().mean()) if isinstance(loss, torch.Tensor) else None
        if also is not None:
            also(pack)
        pack.fetch()
        for cols, at in wparts:
            out[_M["weight_norm"], cols] = pack.get(at)
        if gparts:  # every group's rows at once: the numpy work per step does not grow with groups
            cols = np.concatenate([part[0] for part in gparts]).astype(np.int64)
            grads = [g for part in gparts for g in part[1]]
            numels = np.concatenate([part[2] for part in gparts])
            exact = np.concatenate([np.full(len(part[0]), part[5]) for part in gparts])
            host = np.concatenate([pack.get(part[3]) for part in gparts], axis=1)
            nonzero = self._fill_grad_stats(out, cols, grads, numels, host, exact)
            if hist is not None:
                hist[cols] = octave_bins(np.concatenate([pack.get(part[4]) for part in gparts]), nonzero)
        return out, hist, (float(pack.get(loss_at)) if loss_at is not None else loss), pack

    def _queue(self, with_hist: bool) -> tuple[HostCopy, list, list]:
        """Queue the weight norms and gradient statistics of every column in a new host copy, by the
        plans; a plan gone stale fails or shows here, and the step is planned again."""
        for attempt in range(2):
            if attempt or self._wplan is None:
                self._wplan = Plan(self.ordered, detached, self._fuses_small)
            if attempt or self._gplan is None or not self._gplan.current():
                self._gplan = Plan(self.ordered, grad_of, self._fuses_small)
            try:
                return self._queue_planned(with_hist)
            except (TypeError, RuntimeError, AttributeError):
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _queue_planned(self, with_hist: bool) -> tuple[HostCopy, list, list]:
        """Each gradient part: columns, stored values, sizes, rows' and counts' handles, and whether
        its L2 norm was accumulated in float64 (``finish_rows``)."""
        wplan, gplan = self._wplan, self._gplan
        assert wplan is not None and gplan is not None  # planned by _queue
        pack = HostCopy()
        wparts: list = [(cols, pack.add(stacked_norms(stacked(owners)))) for cols, owners in wplan.stacks]
        gparts: list = []
        for cols, owners in gplan.stacks:
            grads = [p.grad for p in owners]
            x = stacked(grads)
            numels = np.full(len(cols), x.shape[1], np.float64)
            counts = pack.add(stacked_exponent_counts(x)) if with_hist else None
            gparts.append((cols, grads, numels, pack.add(stacked_rows(x)), counts, True))
        for key in set(wplan.rest) | set(gplan.rest):
            wcols, wowners = wplan.rest.get(key, ([], []))
            gcols, gowners = gplan.rest.get(key, ([], []))
            grads = [stored_values(p.grad) for p in gowners]
            rows, wnorms, counts, exact = queue_group(pack, grads, list(wowners), with_hist)
            if wowners:
                wparts.append((wcols, wnorms))
            if gowners:
                gparts.append((gcols, grads, np.array([p.numel() for p in gowners], np.float64), rows, counts, exact))
        return pack, wparts, gparts

    @staticmethod
    def _fill_grad_stats(
        out: np.ndarray, cols: np.ndarray, grads: list[torch.Tensor], n: np.ndarray, host: np.ndarray, exact: np.ndarray
    ) -> np.ndarray:
        """Per-layer metrics of gradient columns ``cols`` from their host rows (``finish_rows``).
        Returns each column's exact non-zero count (float64; the histogram's subnormals are derived
        from it, never from the float32 zero fraction)."""
        l2, l1, linf, nnz, s, nonfinite = finish_rows(host, grads, n, exact)
        mean = s / n
        with np.errstate(invalid="ignore", over="ignore"):  # beyond float32's range: stored as inf
            var = np.maximum(l2 * l2 / n - mean * mean, 0.0)
            out[_M["grad_norm"], cols] = l2
            out[_M["mean_abs"], cols] = l1 / n
            out[_M["max_abs"], cols] = linf
            out[_M["std"], cols] = np.sqrt(var)
        out[_M["zero_frac"], cols] = 1.0 - nnz / n
        out[_M["nonfinite"], cols] = nonfinite
        return nnz


def queue_group(
    pack: HostCopy, grads: list[torch.Tensor], weights: list[torch.Tensor], with_hist: bool
) -> tuple[tuple | None, tuple | None, tuple | None, bool]:
    """The statistics backend of one device and dtype, for both recorders (whole tensors here, a
    rank's pieces in ``distributed``): queue in ``pack`` the ``(5, len(grads))`` rows of
    ``grads`` (L2, L1, max |g|, non-zero count, sum), the L2 norms of ``weights`` and, with
    ``with_hist``, the gradients' octave counts; their handles (None for what was not asked) and
    whether the L2 norms were accumulated in float64. The fused Triton kernel where it runs (one
    launch, ``_fused``), else PyTorch's kernels (``_kernels``), also after the fused kernel failed."""
    t = (grads or weights)[0]
    if _fused.takes(t.device, t.dtype):
        try:
            return (*_fused.queue(pack, grads, weights, with_hist), True)
        except RuntimeError:
            if _fused.broken is None:
                raise
    return (
        pack.add(grad_rows(grads)) if grads else None,
        pack.add(norms(weights)) if weights else None,
        pack.add(exponent_counts(grads)) if with_hist and grads else None,
        False,
    )


def finish_rows(
    host: np.ndarray, grads: list[torch.Tensor], n: np.ndarray, exact: np.ndarray | bool
) -> tuple[np.ndarray, ...]:
    """L2, L1, max |g|, non-zero count, sum and non-finite count of ``grads`` from their host rows
    (``queue_group``); ``grads`` are the stored values (a sparse gradient's non-zero entries),
    ``n`` their sizes, ``exact`` where the L2 norm was squared and summed in float64 (never taken
    again). Rare cases read their tensor again: a float32 norm that overflowed or underflowed
    (``_norm_range``), and a tensor with NaN/Inf entries, whose entries are counted exactly (a
    non-finite entry makes max |g| non-finite; a large finite norm does not)."""
    l2, l1, linf, nnz, s = (np.array(r, np.float64) for r in host[:5])
    redo = untrusted_norms(l2, linf, n)
    redo = redo[~np.broadcast_to(exact, l2.shape)[redo]]
    if redo.size:
        l2[redo] = exact_norms([grads[k] for k in redo])
    # rare: a float32 sum that overflowed though every entry is finite (bfloat16 gradients near the
    # dtype's max): summed again in float64, so a mean that fits float32 is finite
    for k in np.flatnonzero(np.isfinite(linf) & ~(np.isfinite(l1) & np.isfinite(s))):
        l1[k] = float(grads[k].abs().sum(dtype=torch.float64))
        s[k] = float(grads[k].sum(dtype=torch.float64))
    nonfinite = np.zeros(len(grads))
    for k in np.flatnonzero(~np.isfinite(linf) | ~np.isfinite(l2)):
        g = grads[k]
        nonfinite[k] = float((~torch.isfinite(g)).sum())
        nnz[k] = float((g != 0).sum())
        linf[k] = math.inf
    return l2, l1, linf, nnz, s, nonfinite
