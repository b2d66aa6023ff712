"""How a step's tensors are grouped for fused statistics, planned once and reused.

Many small tensors (a stack of tiny layers, the biases and norms of a transformer) cost their
per-tensor Python and dispatch overhead, not their arithmetic. So tensors of one device, dtype and
shape with at most ``STACK_NUMEL`` entries are stacked into one matrix whose rows are reduced
together, unless one fused kernel reads them for less (``fused``: Triton's one launch reads them
all); the rest (large tensors, sparse gradients, shapes of their own) keep one list per device and dtype.
The plan is kept while it holds: a gradient that appears, disappears, changes layout or moves
makes the step's grouping fail or the watch list fire, and the caller plans again from the
tensors as they are.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict

import numpy as np
import torch

from ._kernels import HostCopy, norms, stacked, stacked_norms

#: tensors with at most this many entries are stacked with others of their shape: below it a
#: tensor's few kernels cost less than their per-tensor overhead
STACK_NUMEL = 4096


class Plan:
    """Columns of ``owners`` (parameters, in column order) split by the tensors ``get`` reads from
    them now (their gradients, or themselves): ``stacks`` (columns, owners) of same-shape small
    dense tensors, ``rest`` ``{(device, dtype): (columns, owners)}``, and ``absent``, the owners
    that have no tensor now (watched, so that one appearing triggers a new plan). ``fused(device,
    dtype, members, numel)`` says where one fused kernel reads a shape group's small tensors too:
    that group is not stacked."""

    def __init__(self, owners: list, get, fused=None) -> None:
        self.get = get
        keyed: dict = defaultdict(list)
        rest: dict = defaultdict(list)
        self.absent: list = []
        for c, p in enumerate(owners):
            t = get(p)
            if t is None:
                self.absent.append(p)
            elif t.layout == torch.strided and 0 < t.numel() <= STACK_NUMEL:
                keyed[(t.device, t.dtype, tuple(t.shape))].append(c)
            elif t.layout in (torch.strided, torch.sparse_coo) and t.numel() > 0:
                rest[(t.device, t.dtype)].append(c)
        self.stacks: list[tuple[list[int], list]] = []
        for (dev, dt, shape), cols in keyed.items():
            if len(cols) > 1 and not (fused and fused(dev, dt, len(cols), math.prod(shape))):
                self.stacks.append((cols, [owners[c] for c in cols]))
            else:
                rest[(dev, dt)].extend(cols)
        self.rest = {k: (sorted(cols), [owners[c] for c in sorted(cols)]) for k, cols in rest.items()}

    def current(self) -> bool:
        """No owner that had no tensor has one now (the cheap half of the check; the other half is
        that grouping this step's tensors does not fail)."""
        get = self.get
        return not any(get(p) is not None for p in self.absent)


#: a parameter's ``.grad`` (C-level, for ``map`` over thousands of parameters)
grad_of = operator.attrgetter("grad")


def detached(p: torch.Tensor) -> torch.Tensor:
    return p.detach()


class UpdateSnapshot:
    """The parameters an optimizer step updates, copied before it, and the norms of their change
    after it: a stack group is one stacked copy, the rest preallocated buffers (``_foreach``).
    Parameters without a gradient at the copy are not updated by the step and get no norm."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.params = params
        self.plan = Plan(params, detached)
        self._bufs = {
            k: [torch.empty_like(p, memory_format=torch.preserve_format).detach() for p in owners]
            for k, (_, owners) in self.plan.rest.items()
        }
        self._copies: list[torch.Tensor] = []
        self._rest_keep: dict = {}
        self.has_grad = np.zeros(len(params), bool)

    def take(self) -> bool:
        """Copy the parameters the coming step updates; False (nothing copied) if none has a gradient."""
        self._copies, self._rest_keep = [], {}
        self.has_grad = np.fromiter((p.grad is not None for p in self.params), bool, len(self.params))
        if not self.has_grad.any():
            return False
        self._copies = [stacked(owners) for _, owners in self.plan.stacks]
        for k, (cols, owners) in self.plan.rest.items():
            keep = [j for j, c in enumerate(cols) if self.has_grad[c]]
            self._rest_keep[k] = keep
            if keep:
                torch._foreach_copy_([self._bufs[k][j] for j in keep], [owners[j].detach() for j in keep])
        return True

    def norms(self, pack: HostCopy) -> list[tuple[np.ndarray, tuple]]:
        """Queue the update norms in ``pack``: ``(positions in params, handle)`` pairs."""
        out = []
        for before, (cols, owners) in zip(self._copies, self.plan.stacks):
            out.append((np.asarray(cols), pack.add(stacked_norms(before.sub_(stacked(owners))))))
        for k, (cols, owners) in self.plan.rest.items():
            keep = self._rest_keep.get(k, [])
            if keep:
                diffs = [self._bufs[k][j] for j in keep]
                torch._foreach_sub_(diffs, [owners[j].detach() for j in keep])
                out.append((np.asarray(cols)[keep], pack.add(norms(diffs))))
        self._copies = []
        return out
