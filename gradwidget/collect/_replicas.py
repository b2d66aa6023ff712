"""The replica check: do data-parallel replicas still hold the same weights and gradients?

Under DDP every rank must hold the same weights, and after DDP's all-reduce the same gradients.
Bugs break that silently: a model moved (``.to(dtype)``, ``.cpu()`` and back) after wrapping gets
parameters whose gradient accumulators DDP never hooked (pytorch#104336), one rank skips a sync
under ``no_sync()`` while the others do not, one rank clips or edits its gradients after the
sync, the model is wrapped in DDP on some ranks only. Each rank then trains its own model.

What is compared (``fingerprint``): per parameter, the L2 norm of its weight (before the update)
and of its gradient (as ``optimizer.step()`` will use it), over the rank's local piece. Two
float64 numbers per parameter. Parameters are compared only where ranks hold the same piece by
design (``replica_codes``): a DTensor (FSDP2, tensor parallel) along its ``Replicate`` mesh
dimensions only (HSDP's replicas, tensor parallelism's replicated biases); a sharded one (no
``Replicate`` dimension, or ``Partial``) never; a parameter FSDP1 manages never; any other parameter
across every rank (under tensor parallelism, the plain parameters each rank holds whole). A gradient
still holding parts of a sum (``Partial``: sequence parallelism's LayerNorm gradients, each rank's
from its own tokens) differs by design until the optimizer sums it: its weight is compared, not it.

When (the schedule): at ``optimizer.step()`` (its pre-hook), on the steps the Recorder records
(one in ``every``), on every rank, rank 0 included. Without an optimizer nothing is checked.

How (``_replica_exchange``): through the process group's key-value store, never a collective;
rank 0 compares.

Tolerance (``Thresholds.replica_tolerance``, 1e-5 relative; how it was chosen, with the measured
numbers, is written there): the Recorder passes its thresholds' value; the record keeps the one used.

Rank 0 keeps what it finds in ``run.meta["replicas"]`` (``ReplicaRecord``; docs/run-format.md),
written to meta.json when a new divergence appears and when the recorder is closed.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np
import torch

from ..thresholds import Thresholds
from ._kernels import HostCopy, is_dtensor, local_piece, norms, pending_sum

#: the numbers compared per parameter, in column order
FINGERPRINT = ("weight", "grad")
#: a gradient that is None (not the same as a zero gradient)
NO_GRAD = -1.0
#: divergence entries kept in the record (a layer x part each); the rest are counted
MAX_ENTRIES = 256


def replica_codes(params: list[torch.Tensor], apart: Callable[[int], bool]) -> np.ndarray:
    """Per parameter, which ranks must hold the same local piece: ranks with the same code (>= 0)
    must agree; -1 is never compared. ``apart(i)``: ranks hold parameter i apart by design (FSDP1's
    shards, parameters DDP was told to ignore)."""
    codes = np.zeros(len(params), np.int64)
    for i, p in enumerate(params):
        if apart(i):
            codes[i] = -1
        elif is_dtensor(p):
            from torch.distributed.tensor import Replicate, Shard

            placements = p.placements  # type: ignore[attr-defined]  # a DTensor
            coord = p.device_mesh.get_coordinate()  # type: ignore[attr-defined]
            if coord is None or not any(isinstance(pl, Replicate) for pl in placements):
                codes[i] = -1  # every rank holds its own shard (or none): nothing is replicated
            elif not all(isinstance(pl, (Replicate, Shard)) for pl in placements):
                codes[i] = -1  # Partial: pending sums differ by design
            else:  # replicas along the Replicate dims hold the piece their Shard coordinates name
                shape = p.device_mesh.shape  # type: ignore[attr-defined]
                code, scale = 1, 1
                for c, n, pl in zip(coord, shape, placements):
                    if isinstance(pl, Shard):
                        code += c * scale
                    scale *= n
                codes[i] = code
    return codes


def fingerprint(params: list[torch.Tensor], codes: np.ndarray) -> np.ndarray:
    """``(L, 2)`` float64: the L2 norm of each compared parameter's local weight and gradient
    (``NO_GRAD`` without one), from fused norms per device and dtype and one host copy; 0 for
    parameters not compared."""
    out = np.zeros((len(params), len(FINGERPRINT)), np.float64)
    groups: dict = {}
    with torch.no_grad():
        for i, p in enumerate(params):
            if codes[i] < 0:
                continue
            w = local_piece(p.detach())
            if w.numel():
                groups.setdefault((0, w.device, w.dtype), []).append((i, w))
            g = p.grad
            if g is None or g.is_sparse:
                out[i, 1] = NO_GRAD
                continue
            if pending_sum(g):
                continue  # each rank holds its own part of a sum: not compared (0 on every rank)
            g = local_piece(g)
            if g.numel():
                groups.setdefault((1, g.device, g.dtype), []).append((i, g))
        pack = HostCopy()
        parts = [
            (col, [i for i, _ in items], pack.add(norms([t for _, t in items])))
            for (col, _, _), items in groups.items()
        ]
    if parts:
        pack.fetch()
        for col, rows, at in parts:
            out[rows, col] = pack.get(at)
    return out


def signature(names: list[str], params: list[torch.Tensor]) -> str:
    """What ranks holding the same model share: parameter names, global shapes and dtypes."""
    text = ";".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in zip(names, params))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def disagreement(
    fp: np.ndarray, codes: np.ndarray, tol: float = Thresholds.replica_tolerance
) -> tuple[np.ndarray, np.ndarray]:
    """Which ranks disagree with their replicas. ``fp``: ``(W, L, K)`` fingerprints of one step,
    ``codes``: ``(W, L)`` (``replica_codes`` of each rank). Within each layer, ranks sharing a
    code >= 0 are compared with the lowest of them (the reference); when more than half of them
    differ from the reference and all of those agree with each other, the reference is the odd
    one. Returns ``(odd, rel)``: ``(W, L, K)`` bools (this rank holds a different value) and
    relative differences from the reference (NaN where not compared). Equal means within ``tol``
    relative, or both NaN, or both the same infinity."""
    W, L, K = fp.shape
    odd = np.zeros((W, L, K), bool)
    rel = np.full((W, L, K), np.nan)
    cols, rows = np.arange(L), np.arange(W)[:, None]
    for code in np.unique(codes[codes >= 0]):
        member = (codes == code) & ((codes == code).sum(axis=0) >= 2)[None]  # (W, L): groups of 2+
        size = member.sum(axis=0)
        ref = np.argmax(member, axis=0)  # the lowest member rank of each layer
        r = _rel(fp, fp[ref, cols][None])  # (W, L, K)
        differ = (r > tol) & member[:, :, None]
        n_diff = differ.sum(axis=0)  # (L, K)
        # the reference is the odd one when most members differ from it and agree among themselves
        alt = np.take_along_axis(fp, np.argmax(differ, axis=0)[None], axis=0)  # the first that differs
        alt_agree = ((_rel(fp, alt) <= tol) | ~differ).all(axis=0)
        flip = (2 * n_diff > size[:, None]) & alt_agree & (n_diff > 0)
        is_ref = (rows == ref[None])[:, :, None] & member[:, :, None]
        odd |= np.where(flip[None], is_ref, differ)
        rel = np.where(member[:, :, None], r, rel)
    return odd, rel


def _rel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| / max(|a|, |b|); 0 where equal (both NaN, the same infinity, both zero); Inf where
    exactly one is NaN."""
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.abs(a - b) / np.maximum(np.abs(a), np.abs(b))
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    return np.where(same, 0.0, np.where(np.isnan(d), np.inf, d))


class ReplicaRecord:
    """Rank 0's summary of the check, kept in ``run.meta["replicas"]`` (bounded: one entry per
    layer and part that diverged, at most ``MAX_ENTRIES``)."""

    def __init__(
        self,
        names: list[str],
        ranks: list[int],
        every: int,
        compared: int,
        skipped: int,
        tolerance: float = Thresholds.replica_tolerance,
    ) -> None:
        self.names = names
        self.data: dict[str, Any] = {
            "schedule": f"optimizer.step() pre-hook, on recorded steps (every={every})",
            "tolerance": tolerance,
            "fingerprint": [f"{p}_norm" for p in FINGERPRINT],
            "ranks": ranks,
            "layers_compared": compared,
            "layers_not_compared": skipped,
            "steps_checked": 0,
            "first_step": None,
            "last_step": None,
            "diverged": [],
        }
        self._entry: dict[tuple[int, int], dict] = {}
        self.overflow = 0

    def add(self, step: int | None, fp: np.ndarray, ranks: list[int], odd: np.ndarray, rel: np.ndarray) -> bool:
        """One checked step; True when a new divergence entry appeared."""
        d = self.data
        d["steps_checked"] += 1
        if d["first_step"] is None:
            d["first_step"] = step
        d["last_step"] = step
        new = False
        for layer, part in zip(*np.nonzero(odd.any(axis=0))):
            layer, part = int(layer), int(part)
            who = [ranks[w] for w in np.flatnonzero(odd[:, layer, part])]
            r = rel[:, layer, part]
            worst = float(np.minimum(r[~np.isnan(r)], 1.0).max())  # 1.0: one of them NaN
            e = self._entry.get((layer, part))
            if e is None:
                if len(self._entry) >= MAX_ENTRIES:
                    self.overflow += 1
                    continue
                e = {
                    "layer": self.names[layer],
                    "part": FINGERPRINT[part],
                    "first_step": step,
                    "ranks": who,
                    "values": {str(r): _num(fp[w, layer, part]) for w, r in enumerate(ranks)},
                    "rel_diff": worst,
                    "max_rel_diff": worst,
                    "steps": 0,
                    "last_step": step,
                }
                self._entry[(layer, part)] = e
                d["diverged"].append(e)
                new = True
            e["steps"] += 1
            e["last_step"] = step
            e["max_rel_diff"] = max(e["max_rel_diff"], worst)
            e["ranks"] = sorted(set(e["ranks"]) | set(who))
        if self.overflow:
            d["entries_not_kept"] = self.overflow
        return new


def _num(x: float) -> float | str | None:
    if x == NO_GRAD:
        return None  # no gradient
    return float(x) if np.isfinite(x) else str(x)
