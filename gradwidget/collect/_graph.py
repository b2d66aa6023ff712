"""Layer order and data-flow edges from the real autograd graph, for the Recorder: forward hooks
note which module output each parameter-owning module consumes on the first forward (again for a
layer first used later), and the graph between them is walked once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from torch import nn

from ._hooks import Hook
from ._inputs import _compiling, _module_of
from ._probe import Probe

_MAX_GRAPH_VISITS = 200_000
#: forwards captured again, at most, to find the edges of layers first used after the first step
_LATE_CAPTURES = 16


class GraphCapture(Probe):
    """The edges between ``model``'s parameter-owning modules, from the grad_fns their forwards
    consume and produce. ``order_pending()`` says whether the Recorder still needs the modules in
    first-forward order (``fwd_modules``); ``on_captured()`` runs after each capture."""

    def __init__(self, model: nn.Module, order_pending: Callable[[], bool], on_captured: Callable[[], None]) -> None:
        self.model = model
        self.edges: set[tuple[str, str]] | None = None  # (source module, consuming module)
        self.fwd_modules: list[str] = []  # parameter-owning modules in first-forward order
        self.wanted: set[str] = set()  # modules of late layers whose edges are still unknown
        self.capturing = False
        self._order_pending = order_pending
        self._on_captured = on_captured
        self._late_captures = 0
        self._mod_in: dict[str, list] = {}
        self._mod_out: dict = {}
        self._handles: list = []

    @property
    def seen(self) -> bool:
        """Whether a forward hook saw a tensor with its graph (none does inside torch.compile)."""
        return bool(self._mod_in or self._mod_out)

    def install(self) -> None:
        """Forward hooks that, on the first forward with autograd on, note which module output
        each parameter-owning module consumes. Removed once captured."""
        owners = {name: m for name, m in self.model.named_modules() if any(True for _ in m.parameters(recurse=False))}
        self._mod_in, self._mod_out = {}, {}
        self.capturing = True

        def pre(name):
            def f(mod, args, kwargs=None):
                if _compiling():  # reading grad_fn inside a compiled region breaks its graph
                    return
                if torch.is_grad_enabled() and self.capturing:
                    if name not in self._mod_in and self._order_pending():
                        self.fwd_modules.append(name)
                    fns = []
                    for a in list(args) + list((kwargs or {}).values()):
                        if isinstance(a, torch.Tensor) and a.grad_fn is not None:
                            fns.append(a.grad_fn)
                    self._mod_in.setdefault(name, []).extend(fns)

            return f

        def post(name):
            def f(mod, args, output):
                if _compiling():
                    return
                if torch.is_grad_enabled() and self.capturing:
                    outs = output if isinstance(output, (tuple, list)) else (output,)
                    for o in outs:
                        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                            self._mod_out.setdefault(o.grad_fn, name)

            return f

        def root_done(mod, args, output):
            if not _compiling() and torch.is_grad_enabled() and self._mod_out:
                self.finish()

        for name, m in owners.items():
            self._handles.append(m.register_forward_pre_hook(Hook(pre(name))))
            self._handles.append(m.register_forward_hook(Hook(post(name))))
        self._handles.append(self.model.register_forward_hook(Hook(root_done)))

    def finish(self) -> None:
        """Turn what the forward hooks saw into module edges, then remove the hooks and drop the
        grad_fns they hold (and the activations those keep alive). Runs when the root module's
        forward returns or, for models whose root forward never runs (an ``nn.ModuleDict`` whose
        submodules are called directly), at the first step, whatever was seen by then."""
        if not self.capturing:
            return
        self.capturing = False
        self.edges = (self.edges or set()) | self._walk()
        self.wanted -= set(self._mod_in) | set(self._mod_out.values())
        self._mod_in, self._mod_out = {}, {}
        self._uninstall()
        self._on_captured()

    def capture_late(self) -> None:
        """Capture the next forward's graph again while a layer first used after the first step has
        no edges yet; at most ``_LATE_CAPTURES`` times, since a layer used once may never return."""
        if self.wanted and not self.capturing and self._late_captures < _LATE_CAPTURES:
            self._late_captures += 1
            self.install()

    def close(self) -> None:
        self._uninstall()

    def _uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _walk(self) -> set[tuple[str, str]]:
        edges: set[tuple[str, str]] = set()
        visits = 0
        for name, fns in self._mod_in.items():
            stack, seen = list(fns), set()
            while stack and visits < _MAX_GRAPH_VISITS:
                node = stack.pop()
                if node is None or node in seen:
                    continue
                seen.add(node)
                visits += 1
                src = self._mod_out.get(node)
                if src is not None and src != name:
                    edges.add((src, name))
                    continue
                for nxt, _ in getattr(node, "next_functions", ()):
                    if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                        stack.append(nxt)
        return edges

    def layer_edges(self, order: list[int] | None, names: list[str]) -> list[tuple[int, int]]:
        """The edges between columns (``order``: column -> index into ``names``, the parameters'
        names): every parameter of a source module to every parameter of its consumer."""
        if not self.edges or order is None:
            return []
        by_mod: dict[str, list[int]] = defaultdict(list)
        for c, pi in enumerate(order):
            by_mod[_module_of(self.model, names[pi])[0]].append(c)
        return sorted({(a, b) for src, dst in self.edges for a in by_mod.get(src, ()) for b in by_mod.get(dst, ())})
