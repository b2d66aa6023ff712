"""Where a traced step's first NaN/Inf was made: the walk over one step's events in time order
(``NonfiniteTracer`` records them; see ``gradwidget.collect.nonfinite``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..run import NONFINITE_PHASES, NonfiniteOrigin

if TYPE_CHECKING:
    import torch


@dataclass
class StepTrace:
    """One step's events: ``kinds``/``calls`` per event (host), their values (device, then host),
    and per call its module index and enclosing call (-1: called from outside any module)."""

    step: int
    values: torch.Tensor | None
    kinds: np.ndarray
    calls: np.ndarray
    call_module: np.ndarray
    call_parent: np.ndarray
    loss: float | None = None
    host: np.ndarray | None = None
    #: the optimizer did not take this step (AMP's GradScaler skips one whose gradients overflowed)
    skipped: bool = False
    #: the logged loss was a tensor with no autograd graph (a validation loss under no_grad)
    loss_outside_training: bool = False


#: event kinds: a module's input / output in the forward, the gradient it received / passed on
IN, OUT, RECV, PASS, LOSS = range(5)


def find_origin(
    tr: StepTrace, names: list[str], types: list[str], reached: list[str] | None = None, module_of=None
) -> NonfiniteOrigin | None:
    """Where step ``tr``'s first non-finite value was made, or None if the step stayed finite.

    The first non-finite event in time order decides:
      - a call's output (forward): that call made it (its inputs, earlier, were finite);
      - a call's input: code of the enclosing call made it between its children; with no
        enclosing call, the model was given it (phase ``input``);
      - the gradient a call received: code of the innermost enclosing call that received a
        finite one made it in the backward; with none, it came back from the loss (``loss``);
      - the gradient a call passed on: that call made it (what it received, earlier, was finite);
      - the logged loss: phase ``loss``.
    With every event finite, a non-finite logged loss is phase ``loss``, and non-finite parameter
    gradients (``reached``) are blamed on the module of the first one in backward order.

    A step the optimizer skipped (``tr.skipped``) gives no backward or loss origin: that is how AMP's
    GradScaler handles a scaled gradient that overflowed, by design. Its forward still counts.

    A recorded step whose every parameter gradient was finite (``reached == []``) gives no forward,
    input or backward origin (a NaN masked out before the loss, or in a gradient no parameter
    receives, never reached what the optimizer used), and no loss origin for a logged loss that was
    not part of training (a tensor without a graph: a validation loss computed under no_grad). A
    training loss that overflowed to Inf with finite gradients is still one.
    """
    origin = _find_origin(tr, names, types, reached, module_of)
    if origin is not None and reached is not None and not len(reached):
        if origin.phase != "loss" or tr.loss_outside_training:
            return None
    if origin is not None and tr.skipped and origin.phase in ("backward", "loss"):
        return None
    return origin


def _find_origin(
    tr: StepTrace, names: list[str], types: list[str], reached: list[str] | None, module_of
) -> NonfiniteOrigin | None:
    if not np.any(tr.kinds != LOSS):
        return None  # nothing of the model was traced (torch.compile, evaluation): no place to name
    vals = tr.host if tr.host is not None else np.zeros(0)
    bad = ~np.isfinite(vals)
    reached = list(reached) if reached else reached

    def make(call: int, phase: str) -> NonfiniteOrigin:
        mod = tr.call_module[call] if call >= 0 else 0
        ev = tr.calls == call
        fin = {k: bool(np.all(~bad[ev & (tr.kinds == k)])) for k in (IN, OUT, RECV, PASS)}
        if phase in ("input", "forward"):
            i_f, o_f = fin[IN], fin[OUT]
        elif phase == "backward":
            i_f, o_f = fin[RECV], fin[PASS]
        else:
            i_f, o_f = True, False
        n_call = int(np.sum(tr.call_module[:call] == mod)) if call >= 0 else 0
        return NonfiniteOrigin(
            module=names[mod],
            module_type=types[mod],
            step=tr.step,
            phase=phase,
            call=n_call,
            inputs_finite=i_f,
            output_finite=o_f,
            params_reached=reached,
        )

    hits = np.flatnonzero(bad)
    if len(hits):
        e = int(hits[0])
        kind, call = int(tr.kinds[e]), int(tr.calls[e])
        if kind == LOSS:
            return make(-1, "loss")
        parent = int(tr.call_parent[call])
        if kind in (OUT, PASS):
            return make(call, "forward" if kind == OUT else "backward")
        if kind == IN:
            return make(parent, "forward") if parent >= 0 else make(call, "input")
        # a received gradient: made by the innermost enclosing call that received a finite one
        # (an enclosing call returning the same tensor received it at the same moment, hook after hook)
        recv_bad = set(tr.calls[bad & (tr.kinds == RECV)].tolist())
        while parent >= 0 and parent in recv_bad:
            parent = int(tr.call_parent[parent])
        return make(parent, "backward") if parent >= 0 else make(-1, "loss")
    if tr.loss is not None and not np.isfinite(tr.loss):
        return make(-1, "loss")
    if reached and module_of is not None:
        path = module_of(reached[0])
        idx = names.index(path) if path in names else 0
        return NonfiniteOrigin(
            module=names[idx],
            module_type=types[idx],
            step=tr.step,
            phase="backward",
            inputs_finite=True,
            output_finite=True,
            params_reached=reached,
        )
    return None


def earliest(origins: list[NonfiniteOrigin]) -> NonfiniteOrigin | None:
    """The origin that came first among several ranks' (each found its own): the earliest step;
    at the same step one seen in a module's events before one inferred from parameter gradients
    alone (``output_finite`` True), then the pass that runs first, then the lowest rank."""
    order = {p: i for i, p in enumerate(NONFINITE_PHASES)}
    return min(origins, key=lambda o: (o.step, o.output_finite is True, order[o.phase], o.rank or 0), default=None)
