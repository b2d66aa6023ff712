"""Replicas out of sync: evidence for the ``replicas_diverged`` cause.

Under torch.distributed the torch Recorder compares, on every rank, a fingerprint of each
replicated parameter (its weight's and its gradient's L2 norm) and keeps on rank 0 which layers,
ranks and steps disagreed (``gradwidget.collect._replicas``, saved in meta.json as
``meta.replicas``; docs/run-format.md). This module reads that record, without I/O: a pure
function of it, so a saved run folder shows the diagnosis as the live run did.

Which rank is named: with three or more ranks, the minority (the ranks holding values the others
agree against; the record says which). With two there is no majority: a difference between rank 0
and rank 1 is symmetric, so both are named and the evidence says which differs from which, never
that one of them is at fault, unless the record shows what changed on one rank alone (one wraps the
model in DDP and the other does not: that rank is named).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ReplicaFinding", "replica_finding"]

PARTS = {"weight": "weight", "grad": "gradient"}


@dataclass
class ReplicaFinding:
    """Replicated parameters that differ across ranks."""

    layers: list[str]  #: that differ, the earliest and most different first
    ranks: list[int]  #: holding the odd values, the most often odd first
    first_step: int | None  #: the first checked step on which any of them differed
    evidence: str  #: the numbers: which values, how far apart, on how many checked steps
    weights: bool  #: the weights differ (not only this step's gradients)
    wrapped: list[int]  #: ranks that wrap the model in DDP
    unwrapped: list[int]  #: ranks whose model no wrapper keeps in sync (a plain module)
    tensor_parallel: bool = False  #: the ranks hold tensor-parallel pieces: only their replicated parts are compared
    pair: bool = False  #: two ranks differ and nothing says which changed: ``ranks`` names both, blaming neither
    all_ranks: list[int] = field(default_factory=list)  #: every rank compared

    @property
    def reference(self) -> int | None:
        """A rank holding the values the others should have (to copy them from), or None where the
        record does not say which (two ranks, neither blamed)."""
        if self.pair:
            return None
        return next((r for r in self.all_ranks if r not in self.ranks), None)


def replica_finding(record: dict | None) -> ReplicaFinding | None:
    """What the replica check found (``run.meta.get("replicas")``), or None when every compared
    parameter agreed on every checked step (or nothing was checked)."""
    if not isinstance(record, dict):
        return None
    entries = [e for e in record.get("diverged") or [] if isinstance(e, dict) and "layer" in e]
    if not entries:
        return None
    kinds = {int(r): k for r, k in (record.get("kinds") or {}).items()}
    wrapped = sorted(r for r, k in kinds.items() if k == "ddp")
    unwrapped = sorted(r for r, k in kinds.items() if k == "replicated")
    entries.sort(key=lambda e: (_step_key(e.get("first_step")), -float(e.get("max_rel_diff", 0.0))))
    layers: list[str] = []
    for e in entries:
        if e["layer"] not in layers:
            layers.append(e["layer"])
    count: dict[int, int] = {}
    for e in entries:
        for r in e.get("ranks", []):
            count[int(r)] = count.get(int(r), 0) + int(e.get("steps", 1))
    ranks = sorted(count, key=lambda r: (-count[r], r))
    compared = sorted(int(r) for r in record.get("ranks") or [])
    # two ranks: the check compares rank 1 with rank 0 and names rank 1, but a difference between
    # two is symmetric; only a setup that differs on one of them (DDP on one rank) says which changed
    pair = len(compared) == 2 and not (wrapped and unwrapped)
    if pair:
        ranks = compared
    elif len(compared) == 2:
        ranks = unwrapped
    steps = [int(e["first_step"]) for e in entries if e.get("first_step") is not None]
    first = min(steps) if steps else None
    weights = any(e.get("part") == "weight" for e in entries)
    tp = any(k == "tensor_parallel" for k in kinds.values())
    evidence = _evidence(record, entries, first, pair)
    return ReplicaFinding(layers, ranks, first, evidence, weights, wrapped, unwrapped, tp, pair, compared)


def _step_key(step) -> float:
    return float(step) if step is not None else float("inf")


def _evidence(record: dict, entries: list[dict], first, pair: bool) -> str:
    e = entries[0]
    vals = e.get("values") or {}
    odd = [str(r) for r in e.get("ranks", [])]
    ref = next((r for r in vals if r not in odd), None)
    part = PARTS.get(str(e.get("part")), str(e.get("part")))
    at = f" at step {e['first_step']}" if e.get("first_step") is not None else ""
    shown = ", ".join(f"rank {r} {_fmt(v)}" for r, v in list(vals.items())[:4])
    rel = f"{float(e.get('rel_diff', 0)):.3g} relative difference"
    if pair:
        a, b = list(vals)[:2] if len(vals) >= 2 else ("0", "1")
        how = (
            f"rank {a} and rank {b} differ from each other ({rel}); with two ranks there is no majority, "
            f"so these values do not say which of them changed"
        )
    elif ref is not None:
        n_odd, n_all = len(odd), len(vals)
        who = f"rank{'s' * (n_odd > 1)} {', '.join(odd)}"
        how = f"{who} differ{'s' * (n_odd == 1)} from rank {ref} ({rel}; {n_all - n_odd} of {n_all} ranks agree)"
    else:
        how = rel
    parts = [f"the {part} norm of {e['layer']}{at}: {shown} ({how})"]
    by_part = {p: sorted({x["layer"] for x in entries if x.get("part") == p}) for p in PARTS}
    checked = record.get("steps_checked")
    for p, names in by_part.items():
        if names:
            n_steps = max(int(x.get("steps", 0)) for x in entries if x.get("part") == p)
            of = f" of {checked}" if checked else ""
            parts.append(f"{PARTS[p]}s of {len(names)} layer(s) differ, on up to {n_steps}{of} checked steps")
    kinds = record.get("kinds") or {}
    if len(set(kinds.values())) > 1:
        ddp = [r for r, k in kinds.items() if k == "ddp"]
        other = [r for r, k in kinds.items() if k != "ddp"]
        parts.append(f"rank(s) {', '.join(ddp)} wrap the model in DDP, rank(s) {', '.join(other)} do not")
    n = record.get("layers_compared")
    ranks = record.get("ranks") or []
    if n is not None and ranks:
        tol = record.get("tolerance")
        parts.append(
            f"{n} replicated layers compared across ranks {', '.join(map(str, ranks))}"
            + (f" (tolerance {tol:g} relative)" if isinstance(tol, (int, float)) else "")
        )
    return "; ".join(parts)


def _fmt(v) -> str:
    if v is None:
        return "no gradient"
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)
