"""Replicas out of sync across ranks.

Reads the replica check's record, ``run.meta["replicas"]``: under torch.distributed the torch
Recorder compares a fingerprint of each replicated parameter (weight and gradient L2 norm) across
ranks on recorded steps, and rank 0 keeps which layers, ranks and steps disagreed
(``gradwidget.collect._replicas``); a saved run folder reads the same. ``..replicas.replica_finding``
turns it into layers (earliest and most different first), ranks (the minority of three or more, most
often odd first; both of two, blaming neither, unless one of them alone is set up differently), the
first step and the evidence.

Bound: a relative difference above ``Thresholds.replica_tolerance`` (1e-5) counts. It is applied
where the values are compared (collect side: only what exceeds it is kept in the record, with the
tolerance used), and this rule reads the record: nothing here compares numbers again. How 1e-5 was
set: see ``Thresholds.replica_tolerance``.

Always Critical, confidence 1.0: healthy replicas are bit-identical, so any recorded difference is
each rank training its own model from that step. Explains nothing (a symptom it causes, e.g. a loss
that differs per rank, is not measured). Its action names what breaks DDP's sync in this setup
(DDP on some ranks only, no wrapper, or what bypasses the wrapper; under tensor parallelism, what
gives the parts every rank holds whole different updates) and how to recover.
"""

from __future__ import annotations

from ..replicas import ReplicaFinding, replica_finding
from ._base import CauseRule, Context, Diagnosis


def _finding(c: Context) -> ReplicaFinding | None:
    meta = c.run.meta
    return replica_finding(meta.get("replicas") if isinstance(meta, dict) else None)


def find(c: Context) -> Diagnosis | None:
    f = _finding(c)
    if f is None:
        return None
    known = set(c.run.layer_names)
    layers = [n for n in f.layers if n in known]
    return Diagnosis("replicas_diverged", "Critical", layers, f.first_step, f.evidence, 1.0, ranks=f.ranks)


def action(d: Diagnosis, c: Context) -> str:
    """Make the replicas agree again: what breaks their sync in this setup, then how to recover."""
    f = _finding(c)
    since = f" saved before step {d.first_step}" if d.first_step is not None else ""
    which = "each replicated parameter, not the shards" if f is not None and f.tensor_parallel else "each parameter"
    ref = f.reference if f is not None else None
    if ref is None:  # two ranks, neither blamed: the user knows which holds the intended state
        copy = f"copy the weights of the rank that holds the intended ones to every rank (torch.distributed.broadcast(p.data, src=that rank) for {which})"
    else:
        copy = f"copy rank {ref}'s weights to every rank (torch.distributed.broadcast(p.data, src={ref}) for {which})"
    recover = f"; then restart from a checkpoint{since}, or {copy}"
    if f is not None and f.tensor_parallel:
        return (
            "give the parameters every tensor-parallel rank holds whole (layers not parallelised, row-wise "
            "biases, norms) the same gradient and update on every rank: the same batch on each, gradient "
            "clipping by one total norm over all ranks or none, any change to .grad alike everywhere "
            "(DeepSpeed PR 1801: clipping left BLOOM's LayerNorm weights out of sync across its tensor-parallel "
            "ranks)" + recover
        )
    if f is not None and f.unwrapped and f.wrapped:
        ranks = ", ".join(map(str, f.unwrapped))
        return f"wrap the model in DistributedDataParallel on every rank, alike (rank(s) {ranks} do not)" + recover
    if f is not None and f.unwrapped:
        return (
            "wrap the model in DistributedDataParallel (nothing averages the gradients across ranks now, so "
            "each trains on its own data), or all-reduce the gradients before optimizer.step()" + recover
        )
    return (
        "find what bypasses DDP's sync: moving or casting the model (.to(), .cpu()/.cuda(), .half()) or "
        "replacing a parameter after DistributedDataParallel(model) leaves it outside DDP's gradient hooks "
        "(pytorch#104336: wrap after the last move); no_sync(), gradient clipping and any change to .grad "
        "must happen alike on every rank (decide from values all-reduced across ranks)" + recover
    )


RULE = CauseRule("replicas_diverged", "replicas out of sync across ranks", find, action, kind="observation")
