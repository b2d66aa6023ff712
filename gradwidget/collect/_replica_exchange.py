"""The replica check's traffic (``_replicas`` says what is compared and when).

Through the process group's key-value store, never a collective, so the
check cannot hang or reorder the job's own collectives whatever the ranks do (a rank that steps
fewer times under DDP's ``join()``, a model wrapped on one rank only). Each rank other than 0 sets
one key per checked step (8 bytes of step number + 16 bytes per compared parameter) into a ring of
``SLOTS`` keys, so the store holds at most ``SLOTS`` values per rank. Rank 0 reads, at each of its
checks, the earlier steps every rank has posted (one ``check`` and one ``multi_get`` of the other
ranks' keys): under DDP the ranks are in lockstep, so step n is compared at step n + 1 (at the
end, in ``close``).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ..thresholds import Thresholds
from ._probe import Probe
from ._replicas import ReplicaRecord, disagreement, fingerprint, replica_codes, signature

#: ring of store keys per rank: the store holds at most this many fingerprints per rank
SLOTS = 8
#: at close, how long rank 0 waits for the other ranks' last fingerprints
CLOSE_WAIT_S = 2.0
#: replica checks built in this process: every rank builds its Recorders in the same order, so the
#: n-th check has the same store keys on every rank (as ``distributed.OriginExchange``)
_BUILT = [0]


class ReplicaExchange(Probe):
    """The check's traffic through the process group's key-value store (see the module's
    docstring): every rank posts its setup once and a fingerprint per checked step; rank 0 reads
    them without waiting and compares. A probe of the Recorder (``_probe``): ``attach`` puts its
    optimizer step pre-hook on, ``close`` takes it off.

    ``label()`` (rank 0): the step number the Recorder gave the step being checked (None: none yet).
    ``on_change(record)`` (rank 0): a new divergence, or the record at close (to write meta.json).
    """

    def __init__(
        self,
        ctx: Any,
        names: list[str],
        params: list[torch.Tensor],
        every: int,
        label: Callable[[], int | None],
        on_change: Callable[[dict], None],
        store=None,
        prefix: str | None = None,
        tolerance: float = Thresholds.replica_tolerance,
    ) -> None:
        """``store`` and ``prefix``: the process group's store and the next check's keys unless given
        (tests drive several ranks' checks through one store in one process). ``tolerance``: the
        relative difference above which replicas differ (the Recorder's ``Thresholds``)."""
        from .distributed import clean_name

        self.rank, self.world_size, self.every = ctx.rank, ctx.world_size, every
        self.names, self.params = [clean_name(n) for n in names], params
        self.codes = replica_codes(params, lambda i: ctx.held_apart(self.names[i]))
        self.active = bool((self.codes >= 0).any())
        if prefix is None:
            prefix = f"gradwidget/{_BUILT[0]}/replicas"
            _BUILT[0] += 1
        self.prefix = prefix
        self.label, self.on_change, self.tolerance = label, on_change, tolerance
        self.store = dist.distributed_c10d._get_default_store() if store is None else store
        self.n = 0  # optimizer steps seen
        self.bytes_sent = 0
        self.setup = {
            "kind": ctx.kind,
            "ddp_ranks": ctx.ddp_ranks,
            "signature": signature(self.names, params),
            "codes": self.codes.tolist(),
            "active": self.active,
        }
        self.store.set(f"{prefix}/setup/{self.rank}", json.dumps(self.setup))
        # rank 0
        self._peers: list[int] | None = None  # ranks compared with rank 0 (rank 0 first)
        self._pending: dict[int, tuple[int | None, np.ndarray]] = {}
        self.record: ReplicaRecord | None = None
        self._codes: np.ndarray | None = None
        self._excluded: np.ndarray | None = None  # layers never compared (plain model, unequal from the start)

    # ------------------------------------------------------------------ every rank
    _handle: Any = None

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        """See each of ``optimizer``'s steps (a step pre-hook, removed by ``close``)."""
        self._handle = optimizer.register_step_pre_hook(self.step_hook)

    def step_hook(self, optimizer, args, kwargs) -> None:
        n, self.n = self.n, self.n + 1
        if n % self.every:
            return
        fp = fingerprint(self.params, self.codes) if self.active else None
        if self.rank != 0:
            if fp is not None:
                value = np.concatenate([[float(n)], fp.ravel()]).tobytes()
                key = f"{self.prefix}/fp/{self.rank}/{(n // self.every) % SLOTS}"
                self.store.set(key, value)  # type: ignore[arg-type]  # the store takes bytes too
                self.bytes_sent += len(value)
            return
        if fp is not None:
            self._pending[n] = (self.label(), fp)
            self.poll()

    def close(self) -> None:
        """Take the step hook off; rank 0: compare the last steps (waiting briefly for their
        posts) and keep the record."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.rank == 0 and self.active:
            self.poll(final=True)

    # ------------------------------------------------------------------ rank 0
    def poll(self, final: bool = False) -> None:
        """Compare every pending step the other ranks have posted (oldest first), without waiting;
        ``final`` (at close): wait up to ``CLOSE_WAIT_S`` for the last steps' posts."""
        if final and self._pending:
            self._wait_for_last()
        changed = False
        if self._peers is not None or self._read_setups():
            changed = self._compare_posted()
        if len(self._pending) > SLOTS:  # ranks that stopped posting (or never set up): forget the oldest
            for n in sorted(self._pending)[: len(self._pending) - SLOTS]:
                del self._pending[n]
        if (changed or final) and self.record is not None:
            self.on_change(self.record.data)

    def _wait_for_last(self) -> None:
        import datetime

        n = max(self._pending)
        keys = [f"{self.prefix}/setup/{r}" for r in range(1, self.world_size)]
        keys += [f"{self.prefix}/fp/{r}/{(n // self.every) % SLOTS}" for r in range(1, self.world_size)]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=CLOSE_WAIT_S))
        except (RuntimeError, dist.DistStoreError):  # a rank that never posts: compare what came
            pass

    def _compare_posted(self) -> bool:
        assert self._peers is not None
        others = self._peers[1:]
        changed = False
        for n in sorted(self._pending):
            label, own = self._pending[n]
            if not others:
                del self._pending[n]
                continue
            keys = [f"{self.prefix}/fp/{r}/{(n // self.every) % SLOTS}" for r in others]
            if not self.store.check(keys):
                break
            got = [np.frombuffer(v, np.float64) for v in self.store.multi_get(keys)]
            steps = [int(g[0]) for g in got]
            if any(s < n for s in steps):
                break  # a rank has not reached step n yet
            del self._pending[n]
            if any(s > n for s in steps):
                continue  # overwritten: this process fell SLOTS steps behind; the step is lost
            fp = np.stack([own] + [g[1:].reshape(own.shape) for g in got])
            changed |= self._compare(label, fp)
        return changed

    def _read_setups(self) -> bool:
        keys = [f"{self.prefix}/setup/{r}" for r in range(self.world_size)]
        if not self.store.check(keys):
            return False
        setups = [json.loads(v) for v in self.store.multi_get(keys)]
        own = setups[0]
        same = [r for r, s in enumerate(setups) if s["signature"] == own["signature"] and s["active"]]
        kinds = {r: setups[r]["kind"] for r in same}
        if own["kind"] == "ddp" and all(k == "ddp" for k in kinds.values()) and own["ddp_ranks"] is not None:
            same = [r for r in same if r in own["ddp_ranks"]]  # DDP over a sub-group: its replicas
        self._peers = same
        self._codes = np.array([setups[r]["codes"] for r in same], np.int64)
        compared = int(((self._codes >= 0).sum(axis=0) >= 2).sum()) if len(same) > 1 else 0
        self.record = ReplicaRecord(self.names, same, self.every, compared, len(self.names) - compared, self.tolerance)
        self.record.data["kinds"] = {str(r): kinds[r] for r in same}
        self.record.data["world_size"] = self.world_size
        self._plain = all(k == "replicated" for k in kinds.values())
        return True

    def _compare(self, label: int | None, fp: np.ndarray) -> bool:
        assert self.record is not None and self._codes is not None
        codes = self._codes
        if self._plain and self._excluded is None:
            # a model no wrapper keeps in sync: parameters that differ at the first check (tensor-
            # parallel pieces, independent models) were never replicas; only the others are watched
            odd0, _ = disagreement(fp[:, :, :1], codes, self.tolerance)
            excluded = np.asarray(odd0.any(axis=(0, 2)), bool)
            self._excluded = excluded
            if excluded.any():
                self.record.data["not_replicas_from_start"] = int(excluded.sum())
                self.record.data["layers_compared"] -= int(excluded.sum())
        if self._excluded is not None and self._excluded.any():
            codes = np.where(self._excluded[None], -1, codes)
        odd, rel = disagreement(fp, codes, self.tolerance)
        return self.record.add(label, fp, self._peers or [], odd, rel)
