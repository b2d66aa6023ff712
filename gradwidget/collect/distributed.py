"""Recording under ``torch.distributed``: DDP (replicated gradients), FSDP and tensor parallelism
(sharded gradients).

The torch ``Recorder`` calls :func:`attach` only when a default process group is initialised, so a
single-process run never imports or pays for any of this.

Two modes:

``replicated`` (DDP, or a plain module in a process group, taken to be kept in sync by its user)
    After backward, DDP has averaged the gradients and every rank holds the same values. Rank 0
    records them exactly as a single process would; the other ranks record nothing. No extra
    collective. (With an optimizer every rank takes part in the replica check, ``_replicas``: a
    fingerprint per recorded step through the key-value store.) Without an optimizer, the step is read in an autograd
    end-of-backward callback queued behind DDP's own (which finishes the all-reduce).

``sharded`` (FSDP2 ``fully_shard``, FSDP1 ``FullyShardedDataParallel(use_orig_params=True)`` and
tensor parallelism, ``parallelize_module``: any model with DTensor parameters)
    Each rank holds a slice of every gradient (tensor parallelism: of the DTensor ones; its plain
    parameters are replicated, counted once). Per recorded step, each rank computes partial sums
    over its own slices (as FSDP's ``clip_grad_norm_`` does for the total norm, but per tensor and
    for every statistic): sum of squares, sum of |g|, max |g|, count of zeros, sum, count of
    non-finite entries, a has-a-gradient flag, the weight's and the update's sums of squares and,
    on histogram steps, octave-bin counts. These ``9`` (+ ``N_BINS``) float64 numbers per layer are
    packed into one tensor and combined into rank 0 by two reduces: a SUM over the packed tensor
    and a MAX over its max |g| column (maxima do not add). Rank 0 forms the statistics with the
    unsharded element counts, so norms, means, std and zero fractions equal those of the unsharded
    model. A DTensor held whole on several ranks (a ``Replicate`` mesh dimension: tensor parallelism's
    row-wise bias, HSDP's replicas) is counted once, by mesh coordinate 0 of those dimensions.

    A gradient still holding pending sums (a ``Partial`` placement: sequence parallelism's LayerNorm
    weights, whose gradient each rank computes from its own tokens; the optimizer sums them when it
    reads them) is summed first, one all-reduce of that gradient (DTensor's ``redistribute``), so
    its statistics are those of the gradient the optimizer applies.

    Cost per recorded step (``L`` layers, ``h`` = 1 on histogram steps, else 0): 2 collectives (and
    the all-reduce of each gradient with pending sums, above); every rank contributes ``8 * L * (10 + N_BINS * h)`` bytes (``bytes_per_step``). A reduce is
    combined along the backend's ring or tree, so what reaches rank 0 is one such message whatever
    the number of ranks (the gather this replaced brought ``world_size - 1`` of them to rank 0). With
    an optimizer and update norms on, the reduces run after ``optimizer.step()`` (in the step
    post-hook) so the update's partials ride in the same messages.

Only rank 0 writes the run directory and holds the recorded ``Run``; on the other ranks
``recorder.run`` is ``None``.

Layer order under FSDP (not tensor parallelism, whose per-parameter hooks fire in autograd's order)
comes from the first forward pass (see ``DistContext.fallback_arrival``):
FSDP hands over gradients per shard group, not in autograd's order.

Layer names: DDP's wrapper is unwrapped (no ``module.`` prefix); FSDP1's ``_fsdp_wrapped_module``,
activation checkpointing's ``_checkpoint_wrapped_module`` and ``torch.compile``'s ``_orig_mod`` path
components are dropped, so names match the single-process model. FSDP2 keeps the original names.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..run import METRICS, N_BINS
from ._kernels import (
    HostCopy,
    is_dtensor,
    local_piece,
    norms,
    octave_bins,
    pending_sum,
)
from ._stats import finish_rows, queue_group

#: path components inserted by wrappers, dropped from layer and module names.
WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})

#: columns of the per-layer partials, in packing order.
PARTIALS = ("sumsq", "l1", "max", "zeros", "sum", "nonfinite", "has_grad", "weight_sumsq", "update_sumsq")
_P = {k: i for i, k in enumerate(PARTIALS)}
_M = {name: i for i, name in enumerate(METRICS)}


def clean_name(name: str) -> str:
    """A parameter or module path with wrapper components removed."""
    return ".".join(p for p in name.split(".") if p not in WRAPPER_PARTS)


def type_name(module: nn.Module) -> str:
    """The class name a user wrote: FSDP2 swaps a module's class for a generated subclass
    ``FSDP<Name>`` of (FSDPModule, <Name>) and FSDP1 wraps it; report <Name>."""
    FSDP = _fsdp1_class()
    if FSDP is not None and isinstance(module, FSDP):
        return type_name(module.module)  # FSDP1 wraps: name what it wraps
    cls = type(module)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return cls.__name__
    if issubclass(cls, FSDPModule):
        for base in cls.__mro__[1:]:
            if not issubclass(base, FSDPModule):
                return base.__name__
    return cls.__name__


def bytes_per_step(n_layers: int, with_hist: bool) -> int:
    """Bytes each rank contributes to the reduces of one recorded step in sharded mode: the packed
    partials (SUM) and their max |g| column again (MAX)."""
    return 8 * n_layers * (len(PARTIALS) + 1 + (N_BINS if with_hist else 0))


def _fsdp1_class():
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # pragma: no cover
        return None
    return FullyShardedDataParallel


class DistContext:
    """What the Recorder needs to know about the process group and how the model is distributed."""

    def __init__(self, model: nn.Module, kind: str, group=None) -> None:
        self.model = model  # the module whose parameters are recorded (DDP unwrapped)
        self.kind = kind  # "ddp", "replicated", "fsdp2", "fsdp1" or "tensor_parallel"
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.is_writer = self.rank == 0
        self.sharded = kind in ("fsdp2", "fsdp1", "tensor_parallel")
        #: gradients arrive per FSDP group, not in autograd's order: layer order from the first forward
        self.order_from_forward = kind in ("fsdp2", "fsdp1")
        #: True on ranks that record nothing at all (replicated mode, rank != 0)
        self.inert = not self.sharded and not self.is_writer
        self.bytes_sent = 0  # bytes this rank sent in collectives issued by the recorder
        self.collectives = 0  # collectives issued by the recorder
        self._fsdp1_shapes: dict[str, tuple] = {}
        if kind == "fsdp1":
            self._fsdp1_shapes = _fsdp1_full_shapes(model)
        backend = dist.get_backend(group)
        self._comm_device = (
            torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        )
        self._pending: Any = None
        #: DDP: the global ranks of its process group (the ranks it keeps in sync); None otherwise
        self.ddp_ranks: list[int] | None = None
        #: DDP: the parameters it leaves out of its sync (each rank keeps its own)
        self.ddp_ignored: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"<DistContext {self.kind} rank {self.rank}/{self.world_size}>"

    def origin_exchange(self) -> "OriginExchange":
        """Where this recorder's ranks leave the non-finite origins they trace for rank 0."""
        return OriginExchange(self)

    def held_apart(self, name: str) -> bool:
        """Whether ranks hold parameter ``name`` (a clean name) apart by design: FSDP1 shards it,
        or DDP was told to leave it out of the sync (``_set_params_and_buffers_to_ignore_for_model``)."""
        return name in self._fsdp1_shapes or name in self.ddp_ignored

    # ------------------------------------------------------------------ layout
    def full_shape(self, name: str, p: torch.Tensor) -> tuple:
        """The unsharded shape of parameter ``name``."""
        if self.kind == "fsdp1":
            return tuple(self._fsdp1_shapes.get(clean_name(name), tuple(p.shape)))
        return tuple(p.shape)  # a DTensor reports its global shape

    def owns(self, name: str, p: torch.Tensor) -> bool:
        """Whether this rank's local piece of ``p`` counts towards the global statistics: shards
        always do; replicated copies count once (mesh coordinate 0 along replicated dimensions). A
        DTensor on a sub-mesh (FSDP's data-parallel dimension of a 2-D mesh, next to tensor
        parallelism) has a copy on every other sub-mesh: the one holding the group's rank 0 counts."""
        if is_dtensor(p):
            from torch.distributed.tensor import Replicate

            mesh = p.device_mesh  # type: ignore[attr-defined]  # a DTensor
            first = dist.get_global_rank(self.group, 0) if self.group is not None else 0
            if first not in mesh.mesh.flatten().tolist():
                return False
            coord = mesh.get_coordinate() or []
            return all(
                c == 0
                for c, pl in zip(coord, p.placements)  # type: ignore[attr-defined]
                if isinstance(pl, Replicate)
            )
        if self.kind == "fsdp1" and clean_name(name) in self._fsdp1_shapes:
            return True
        return self.is_writer  # a parameter FSDP does not manage is replicated

    def fallback_arrival(
        self, names: list[str], params: list[torch.Tensor], fwd_modules: list[str], got_grad: set[int] | None = None
    ) -> list[int]:
        """Gradient arrival order for sharded models, where per-parameter gradient hooks fire per
        FSDP group (FSDP2) or not at all (FSDP1), so their order is not autograd's.

        Built from the first forward instead: parameter-owning modules in reverse order of their
        first call; within a module, parameters in reverse registration order (autograd's order for
        ``nn.Linear``: bias, then weight). A parameter whose module is never called itself (such as
        ``MultiheadAttention.out_proj``, used through its parent's functional forward) is placed
        with its nearest called ancestor, after the ancestor's own parameters in depth order.
        ``got_grad``: the parameters known to have received a gradient (FSDP2), or None to take
        every trainable parameter under a called module (FSDP1).
        """
        pos = {m: k for k, m in enumerate(fwd_modules)}
        depth = []
        for i, n in enumerate(names):
            if not params[i].requires_grad or (got_grad is not None and i not in got_grad):
                continue
            mod = n.rsplit(".", 1)[0] if "." in n else ""
            anchor = mod
            while anchor not in pos and anchor:
                anchor = anchor.rsplit(".", 1)[0] if "." in anchor else ""
            if anchor not in pos:
                if got_grad is None:
                    continue  # under no module that ran: treated as unused
                depth.append((-1, 0, i))  # got a gradient outside any module's forward: input side
            else:
                depth.append((pos[anchor], 0 if anchor == mod else 1, i))
        return [i for _, _, i in sorted(depth, reverse=True)]

    # ------------------------------------------------------------------ sharded statistics
    def prepare(self, names: list[str], params: list[torch.Tensor], order: list[int]) -> None:
        """Fix, for the recorder's column order, the unsharded element counts and ownership."""
        self._order = list(order)
        self._numel = np.array(
            [float(np.prod(self.full_shape(names[i], params[i]), dtype=np.float64)) for i in order], np.float64
        )
        self._owned = np.array([self.owns(names[i], params[i]) for i in order], bool)

    def update_buffers(self, params: list[torch.Tensor]):
        """(local views, snapshot buffers) for the update norm, on this rank's pieces only."""
        loc = [local_piece(p.detach()) for p in params]
        return params, [torch.empty_like(t) for t in loc]

    def snapshot(self, update_bufs) -> None:
        params, bufs = update_bufs
        torch._foreach_copy_(bufs, [local_piece(p.detach()) for p in params])

    def local_partials(self, params: list[torch.Tensor], with_hist: bool, also=None) -> np.ndarray:
        """``(L, len(PARTIALS) [+ N_BINS])`` float64 partial sums of this rank's pieces, columns in
        the recorder's order. ``also(pack)``: queue more tensors into the same host copy (the
        NaN tracer's steps)."""
        L = len(self._order)
        P = np.zeros((L, len(PARTIALS) + (N_BINS if with_hist else 0)), np.float64)
        wgroups: dict = {}
        ggroups: dict = {}
        for c, pi in enumerate(self._order):
            p = params[pi]
            g = p.grad
            if g is not None and not g.is_sparse:
                g = local_piece(self._summed(g))  # on every rank: summing pending parts is a collective
            if not self._owned[c]:
                continue
            w = local_piece(p.detach())
            if w.numel():
                wgroups.setdefault((w.device, w.dtype), []).append((c, w))
            if g is None or g.is_sparse:
                continue
            P[c, _P["has_grad"]] = 1.0
            if g.numel():
                ggroups.setdefault((g.device, g.dtype), []).append((c, g))
        pack = HostCopy()  # one host copy per device for weights, gradients and histograms
        wparts: list[tuple[list[int], Any]] = []
        gparts: list[tuple[list[int], list[torch.Tensor], Any, Any, bool]] = []
        for key in set(wgroups) | set(ggroups):
            witems, gitems = wgroups.get(key, []), ggroups.get(key, [])
            grads = [g for _, g in gitems]
            rows, wnorms, counts, exact = queue_group(pack, grads, [w for _, w in witems], with_hist)
            if witems:
                wparts.append(([c for c, _ in witems], wnorms))
            if gitems:
                gparts.append(([c for c, _ in gitems], grads, rows, counts, exact))
        if also is not None:
            also(pack)
        pack.fetch()
        for cols, at in wparts:
            wn = pack.get(at)
            P[cols, _P["weight_sumsq"]] = wn * wn
        for cols, grads, rows, counts, exact in gparts:
            n = np.array([g.numel() for g in grads], np.float64)
            l2, l1, linf, nnz, s, nonfinite = finish_rows(pack.get(rows), grads, n, exact)
            zeros = n - nnz
            P[cols, _P["sumsq"]] = l2 * l2
            P[cols, _P["l1"]] = l1
            P[cols, _P["max"]] = linf
            P[cols, _P["zeros"]] = zeros
            P[cols, _P["sum"]] = s
            P[cols, _P["nonfinite"]] = nonfinite
            if with_hist:
                assert counts is not None  # queued with the rows on histogram steps
                P[cols, len(PARTIALS) :] = octave_bins(pack.get(counts), n - zeros)
        return P

    def _summed(self, g: torch.Tensor) -> torch.Tensor:
        """``g`` with its pending sums done (``pending_sum``: ``Partial`` placements redistributed to
        ``Replicate``, one all-reduce of ``g``), as the optimizer will read it."""
        if not pending_sum(g):
            return g
        from torch.distributed.tensor import Partial, Replicate

        self.collectives += 1
        self.bytes_sent += local_piece(g).numel() * g.element_size()
        placements = [Replicate() if isinstance(pl, Partial) else pl for pl in g.placements]  # type: ignore[attr-defined]
        return g.redistribute(g.device_mesh, placements)  # type: ignore[attr-defined]  # a DTensor

    def local_update_sumsq(self, update_bufs, update_cols: np.ndarray, P: np.ndarray) -> None:
        params, bufs = update_bufs
        torch._foreach_sub_(bufs, [local_piece(p.detach()) for p in params])
        if not bufs:
            return
        sq = norms(bufs).double().cpu().numpy() ** 2
        owned = self._owned[update_cols]
        P[update_cols[owned], _P["update_sumsq"]] = sq[owned]

    def reduce(self, P: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The recorded step's two collectives: every rank's packed partials summed into rank 0, and
        their max |g| column maxed. Returns ``(sums, maxima)`` on rank 0, None elsewhere."""
        t = torch.from_numpy(np.ascontiguousarray(P)).to(self._comm_device)
        m = t[:, _P["max"]].clone()
        dst = dist.get_global_rank(self.group, 0) if self.group is not None else 0
        dist.reduce(t, dst=dst, op=dist.ReduceOp.SUM, group=self.group)
        dist.reduce(m, dst=dst, op=dist.ReduceOp.MAX, group=self.group)
        self.collectives += 2
        self.bytes_sent += (t.numel() + m.numel()) * t.element_size()
        if not self.is_writer:
            return None
        return t.cpu().numpy(), m.cpu().numpy()

    def statistics(
        self, S: np.ndarray, mx: np.ndarray, update_cols: np.ndarray | None, measured_update: bool
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The recorder's ``(METRICS, L)`` values and ``(L, N_BINS)`` histogram from the partials
        summed over ranks (``S``) and the largest |g| over ranks (``mx``), with the unsharded
        element counts."""
        L = S.shape[0]
        out = np.full((len(METRICS), L), np.nan, np.float64)  # float64: the non-finite counts exact
        n = self._numel
        has = S[:, _P["has_grad"]] > 0
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            sumsq, total = S[:, _P["sumsq"]], S[:, _P["sum"]]
            mean = total / n
            var = np.maximum(sumsq / n - mean * mean, 0.0)
            vals = {
                "grad_norm": np.sqrt(sumsq),
                "mean_abs": S[:, _P["l1"]] / n,
                "max_abs": mx,
                "std": np.sqrt(var),
                "zero_frac": S[:, _P["zeros"]] / n,
                "nonfinite": S[:, _P["nonfinite"]],
            }
        for k, v in vals.items():
            out[_M[k], has] = v[has]
        out[_M["weight_norm"]] = np.sqrt(S[:, _P["weight_sumsq"]])
        if measured_update and update_cols is not None and len(update_cols):
            stepped = update_cols[has[update_cols]]  # optimizers skip parameters without a gradient
            out[_M["update_norm"], stepped] = np.sqrt(S[stepped, _P["update_sumsq"]])
        hist = None
        if S.shape[1] > len(PARTIALS):
            hist = np.rint(S[:, len(PARTIALS) :]).astype(np.uint64)
        return out, hist


def _fsdp1_full_shapes(model: nn.Module) -> dict[str, tuple]:
    """Unsharded shapes of the parameters FSDP1 manages, by clean name."""
    FSDP = _fsdp1_class()
    shapes = {}
    for prefix, m in model.named_modules():
        if not isinstance(m, FSDP):
            continue
        handle = getattr(m, "_handle", None)
        if handle is None:
            continue
        fp = handle.flat_param
        for fqn, shape in zip(fp._fqns, fp._shapes):
            shapes[clean_name(f"{prefix}.{fqn}" if prefix else fqn)] = tuple(shape)
    return shapes


def attach(model: nn.Module, optimizer=None, group=None) -> DistContext:
    """Inspect ``model`` inside the initialised process group and choose how to record it."""
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        ctx = DistContext(model.module, "ddp", group)
        ctx.ddp_ranks = dist.get_process_group_ranks(model.process_group)
        ctx.ddp_ignored = frozenset(clean_name(n) for n in getattr(model, "parameters_to_ignore", ()))
        return ctx
    FSDP = _fsdp1_class()
    if FSDP is not None and any(isinstance(m, FSDP) for m in model.modules()):
        flat = [n for n, _ in model.named_parameters() if n.endswith("_flat_param")]
        if flat:
            raise ValueError(
                "gradwidget records FSDP1 models wrapped with use_orig_params=True (it needs the "
                f"original parameters, not flat ones such as {flat[0]!r}); wrap with "
                "FullyShardedDataParallel(..., use_orig_params=True) or use FSDP2's fully_shard"
            )
        if optimizer is None:
            raise ValueError(
                "gradwidget records an FSDP1 model at optimizer.step() (FSDP1 sets the sharded "
                "gradients without per-parameter hooks, so the end of backward cannot be seen): "
                "pass the optimizer, Recorder(model, optimizer), or use FSDP2's fully_shard"
            )
        return DistContext(model, "fsdp1", group)
    if any(is_dtensor(p) for p in model.parameters()):
        from torch.distributed.fsdp import FSDPModule

        fsdp2 = any(isinstance(m, FSDPModule) for m in model.modules())  # with or without tensor parallelism
        return DistContext(model, "fsdp2" if fsdp2 else "tensor_parallel", group)
    return DistContext(model, "replicated", group)


#: Recorders built in this process under a process group: every rank builds them in the same order,
#: so the n-th one has the same store keys on every rank
_EXCHANGES = [0]


class OriginExchange:
    """Each rank traces its own forward and backward and finds its own non-finite origin; rank 0
    keeps the earliest. Ranks find theirs at different moments, so instead of a collective (which
    every rank would have to enter together) each posts its origin to the process group's
    key-value store; rank 0 reads one counter per recorded step and the new origins it announces.
    Without a store (an unusual process group) each rank keeps its own and rank 0 reports its own."""

    def __init__(self, ctx: DistContext) -> None:
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.prefix = f"gradwidget/{_EXCHANGES[0]}/nonfinite_origin"
        _EXCHANGES[0] += 1
        try:
            self.store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):  # pragma: no cover - no store to use
            self.store = None  # type: ignore[assignment]
        self.posted: dict[int, dict] = {}  # rank -> origin (rank 0: those read so far)

    def post(self, origin: dict) -> None:
        """This rank's origin, for rank 0 (rank 0 posts its own to itself)."""
        self.posted[self.rank] = origin
        if self.store is not None and self.rank != 0:
            import json

            self.store.set(f"{self.prefix}/{self.rank}", json.dumps(origin))
            self.store.add(f"{self.prefix}/count", 1)

    @property
    def complete(self) -> bool:
        return len(self.posted) >= self.world_size

    def gather(self) -> list[dict]:
        """Rank 0: every origin posted so far (its own included); reads the store only when its
        counter says another rank posted since the last call."""
        if self.store is not None and not self.complete:
            others = len(self.posted) - (0 in self.posted)
            if self.store.add(f"{self.prefix}/count", 0) > others:
                import json

                for r in range(1, self.world_size):
                    key = f"{self.prefix}/{r}"
                    if r not in self.posted and self.store.check([key]):
                        self.posted[r] = json.loads(self.store.get(key))
        return list(self.posted.values())
