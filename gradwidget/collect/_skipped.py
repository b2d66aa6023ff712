"""Steps the optimizer never took: AMP's GradScaler skips ``optimizer.step()`` when it finds
Inf/NaN, so the step hooks never see that step. ``optimizer.zero_grad`` is wrapped on the instance
(the class's stays as it is; ``unwrap`` restores the instance's own), and the zero_grad that
follows a backward no step consumed records it. Several backwards per step (accumulation) stay one
step: only zero_grad flushes, and finite gradients it drops are no step (counted). Owned by the
Recorder; private to ``gradwidget.collect``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._groups import grad_of
from ._kernels import norms, stored_values


class SkippedSteps:
    """The ``zero_grad`` wrapper of one Recorder. ``params()``: the parameters recorded now;
    ``record()``: record the gradients as they are as a step; ``discarded(n)``: ``n`` backwards'
    finite gradients were dropped by zero_grad so far; ``passive()``: whether a zero_grad call is
    only passed on (inside ``optimizer.step()``, whose closure may call it, or detached)."""

    def __init__(
        self,
        params: Callable[[], list[torch.Tensor]],
        record: Callable[[], None],
        discarded: Callable[[int], None],
        passive: Callable[[], bool],
    ) -> None:
        self._params, self._record, self._discarded_to, self._passive = params, record, discarded, passive
        #: an optimizer step ran since the last zero_grad (or none ran yet); the Recorder sets it at each step
        self.stepped = True
        self._mark: tuple = ()  # the gradients as the last zero_grad left them (``_grad_mark``)
        self._discarded = 0  # backwards whose finite gradients zero_grad dropped before any optimizer step
        self._optimizer: torch.optim.Optimizer | None = None
        self._wrapper: Callable | None = None
        self._own: Any = None  # the optimizer instance's own zero_grad attribute, to restore

    @property
    def wrapped(self) -> bool:
        return self._wrapper is not None

    def wrap(self, optimizer: torch.optim.Optimizer) -> None:
        """Wrap ``optimizer.zero_grad`` on the instance."""
        original = optimizer.zero_grad
        self._own = optimizer.__dict__.get("zero_grad")  # an instance attribute to restore

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            if self._passive():  # a closure's backwards belong to the step under way; a
                return original(*args, **kwargs)  # detached recorder still wrapped records nothing
            self.flush()
            out = original(*args, **kwargs)
            self.stepped, self._mark = False, self._grad_mark()
            return out

        setattr(optimizer, "zero_grad", zero_grad)  # on the instance: the class's stays as it is
        self._optimizer, self._wrapper = optimizer, zero_grad

    def unwrap(self) -> None:
        """Restore the optimizer's own zero_grad, unless someone wrapped it again since (theirs stays)."""
        opt, wrapper = self._optimizer, self._wrapper
        if opt is None or wrapper is None or opt.__dict__.get("zero_grad") is not wrapper:
            return
        if self._own is None:
            del opt.zero_grad
        else:
            setattr(opt, "zero_grad", self._own)
        self._optimizer, self._wrapper = None, None

    def flush(self) -> None:
        """Record the gradients of a backward that no optimizer step consumed: a step AMP's
        GradScaler skipped, which it does only for Inf/NaN gradients. Finite ones that zero_grad
        drops (``zero_grad()`` inside a gradient-accumulation loop) are no step: counted
        (``run.meta["discarded_backwards"]``), not recorded as steps of their own."""
        if not self.stepped and self._grad_mark() != self._mark:
            self.stepped = True
            if self._all_finite():
                self._discarded += 1
                self._discarded_to(self._discarded)
                return
            self._record()

    def _grad_mark(self) -> tuple:
        """Which gradient tensors exist and their in-place version counters: backward changes it
        (new tensors, or accumulation into zeroed ones), a second zero_grad does not. Taken at
        every zero_grad, so kept to one pass of C-level iteration over the parameters."""
        grads = list(map(grad_of, self._params()))
        return tuple(map(id, grads)), tuple(g._version for g in grads if g is not None)

    def _all_finite(self) -> bool:
        """Whether every gradient is finite (one fused norm and one host read: only on a zero_grad
        that drops gradients no step used)."""
        grads = [stored_values(g) for g in map(grad_of, self._params()) if g is not None]
        return not grads or bool(norms(grads).isfinite().all())
