"""Was the gradient reset between optimizer steps? A forgotten ``optimizer.zero_grad()`` is seen
directly, not guessed from how the norms grow: one small parameter the optimizer holds is watched.
A tensor hook sums what each backward brings it (``fresh``), and at each optimizer step the
gradient handed to the optimizer is fitted as ``a * last + b * fresh``, ``last`` being the gradient
the previous step consumed. Not reset: ``a = b`` (1, or the common factor of an in-place rescale:
clipping, AMP's unscale). Reset: ``a = 0``. Gradient accumulation over micro-batches,
``model.zero_grad()``, ``set_to_none`` or in-place zeroing all read as reset; a gradient the fit does
not explain (zeroed between two backwards of one step, written by hand) is not called carried.
It also counts the steps at which the optimizer found no gradient (None, or all zeros) although that
step's backward brought one (``cleared``: ``zero_grad()`` between ``backward()`` and ``step()``).
Costs one small tensor's copy and a 3 x 3 Gram matrix a step, brought to the host in the step's one
copy. Kept in ``run.meta["grad_reset"]`` (docs/run-format.md). A probe of the Recorder
(``_probe``): its one tensor hook is its own, removed by ``close``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ._hooks import remove_tensor_hooks
from ._probe import Probe, StepContext

if TYPE_CHECKING:
    from ._kernels import HostCopy

#: the watched parameter has at least this many entries where the model has one (two gradients of
#: a handful of entries can point the same way, and the fit needs them apart)
MIN_WATCHED_NUMEL = 16
#: the fit explains the gradient when what is left is at most this share of its norm (exactly,
#: up to rounding, when it is what it claims)
FIT_RESIDUAL = 0.1
#: carried: the last gradient's coefficient is at least this share of this step's (1 when carried,
#: 0 when reset)
CARRIED_SHARE = 0.5
#: where ``carried``'s six dot products (ll, ff, lf, gl, gf, gg) sit in the flattened Gram matrix of
#: the rows (last, fresh, gradient); picked on the host: indexing a GPU tensor by a host list copies
#: the index to the device and waits for it (a second host sync per recorded step, bench/gpu.py)
_DOTS = [0, 4, 1, 6, 7, 8]
#: the last and this step's gradients point the same way (|cos| above this): the fit cannot tell
COLLINEAR = 1 - 1e-6


def carried(ll: float, ff: float, lf: float, gl: float, gf: float, gg: float) -> bool | None:
    """From the dot products of the gradient ``g``, the last step's ``l`` and this step's fresh
    sum ``f``: is ``g`` the last gradient plus the fresh one (True), not (False), or can this step
    not tell (None: a zero or non-finite gradient, or two that point the same way)."""
    if not all(map(math.isfinite, (ll, ff, lf, gl, gf, gg))) or ll <= 0 or gg <= 0:
        return None
    if ff <= 0:  # no backward reached it this step: its gradient is the last one's, or not
        a = gl / ll
        return bool(a > 0 and gg - a * gl <= FIT_RESIDUAL**2 * gg)
    det = ll * ff - lf * lf
    if det <= (1 - COLLINEAR**2) * ll * ff:
        return None
    a = (gl * ff - gf * lf) / det
    b = (gf * ll - gl * lf) / det
    fits = gg - a * gl - b * gf <= FIT_RESIDUAL**2 * gg
    return bool(fits and b > 0 and a >= CARRIED_SHARE * b)


class GradResetCheck(Probe):
    """Watches ``param`` (``name``: its layer) from step to step: on how many recorded steps the
    check could be made, on how many the last step's gradient was still there, and the first."""

    def __init__(self, param: torch.Tensor, name: str) -> None:
        self.param = param
        self.name = name
        self.checked = 0
        self.carried = 0
        self.first_step: int | None = None
        self.steps = 0  #: optimizer steps seen
        self.cleared = 0  #: ... at which the gradient was gone although this step's backward brought one
        self._fresh: torch.Tensor | None = None  # this step's backwards, summed
        self._last: torch.Tensor | None = None  # the gradient the last optimizer step consumed
        self._dots: torch.Tensor | None = None  # this step's six dot products, on the device
        self._queued: tuple | None = None  # (host copy, handle) of a recorded step's dot products
        self._handle = param.register_hook(self._see)

    @classmethod
    def choose(cls, params: list[torch.Tensor], names: list[str]) -> GradResetCheck | None:
        """Watch the smallest dense, plain-tensor parameter of ``params`` (those the optimizer
        holds) with at least MIN_WATCHED_NUMEL entries (else the largest), or none."""
        sizes = [
            (p.numel(), k)
            for k, p in enumerate(params)
            if p.requires_grad and p.layout == torch.strided and type(p.data) is torch.Tensor and p.numel()
        ]
        if not sizes:
            return None
        big = [sk for sk in sizes if sk[0] >= MIN_WATCHED_NUMEL]
        k = min(big)[1] if big else max(sizes)[1]
        return cls(params[k], names[k])

    def _see(self, grad: torch.Tensor) -> None:
        g = grad.detach()
        if self.param.grad is None:
            # reset since the last backward (zero_grad(), set_to_none): what earlier backwards of this
            # step brought is gone (a GAN's generator backward through the discriminator after the
            # discriminator's step, then its zero_grad), and the gradient starts from this one
            self._fresh = None
        if self._fresh is None or self._fresh.shape != g.shape:
            self._fresh = g.to(torch.float64, copy=True)
        else:
            self._fresh.add_(g)

    def before_update(self) -> None:
        """At an optimizer step, before it updates: the dot products that fit this gradient by the
        last one and this step's backwards; this one is kept for the next step."""
        g = self.param.grad
        fresh, self._fresh = self._fresh, None
        last, self._last = self._last, None
        self._dots = None
        self.steps += 1
        if g is None and fresh is not None:
            self.cleared += 1
        if g is None or g.layout != torch.strided:
            return
        with torch.no_grad():
            now = g.detach().to(torch.float64, copy=True).reshape(-1)
            if last is not None and last.shape == now.shape:
                f = torch.zeros_like(now) if fresh is None or fresh.numel() != now.numel() else fresh.reshape(-1)
                m = torch.stack([last, f, now])
                self._dots = (m @ m.T).reshape(-1)  # the Gram matrix: its six dot products in one op
            self._last = now

    def queue(self, pack: HostCopy) -> None:
        """Queue this step's dot products in the step's host copy, for ``count`` after its fetch."""
        d, self._dots = self._dots, None
        self._queued = None if d is None else (pack, pack.add(d))

    def on_step(self, ctx: StepContext) -> None:
        """Count the step, and say so in the run: at once when it is the first found carrying the
        last one's gradient, else within one flush interval."""
        first = self.count(ctx.step)
        ctx.note_meta({"grad_reset": self.to_dict()}, first)

    def count(self, step: int) -> bool:
        """Count recorded ``step`` by its dot products (fetched with the step's host copy); True
        when it is the first step found carrying the last one's gradient."""
        queued, self._queued = self._queued, None
        if queued is None:
            return False
        dots = [float(v) for v in queued[0].get(queued[1])[_DOTS]]
        if dots[5] == 0 and dots[1] > 0:  # zeroed in place (set_to_none=False) after this step's backward
            self.cleared += 1
        verdict = carried(*dots)
        if verdict is None:
            return False
        self.checked += 1
        if not verdict:
            return False
        self.carried += 1
        if self.first_step is None:
            self.first_step = step
            return True
        return False

    def continue_from(self, old: GradResetCheck) -> None:
        """Keep ``old``'s counts (the model changed and another parameter is watched now)."""
        self.checked, self.carried, self.first_step = old.checked, old.carried, old.first_step
        self.steps, self.cleared = old.steps, old.cleared

    def to_dict(self) -> dict:
        return {
            "layer": self.name,
            "checked": self.checked,
            "carried": self.carried,
            "first_step": self.first_step,
            "steps": self.steps,
            "cleared": self.cleared,
        }

    def close(self) -> None:
        remove_tensor_hooks([self._handle], [self.param])
        self._fresh = self._last = self._dots = self._queued = None
