"""Layer order and data-flow edges from the real autograd graph, for the Recorder: forward hooks
note which module output each parameter-owning module consumes on the first forward (again for a
layer first used later), and the graph between them is walked once.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from ._inputs import _compiling, _module_of
from ._stats import _M
from ._hooks import Hook
from ._state import _RecorderState

_MAX_GRAPH_VISITS = 200_000
#: forwards captured again, at most, to find the edges of layers first used after the first step
_LATE_CAPTURES = 16


class _GraphEdges(_RecorderState):
    """The Recorder's backward-graph capture (a mixin: the state is the Recorder's)."""

    def _install_graph_capture(self) -> None:
        """Forward hooks that, on the first forward with autograd on, note which module output
        each parameter-owning module consumes. Removed once captured."""
        owners = {name: m for name, m in self.model.named_modules() if any(True for _ in m.parameters(recurse=False))}
        self._mod_in: dict[str, list] = {}
        self._mod_out: dict = {}
        self._capturing = True

        def pre(name):
            def f(mod, args, kwargs=None):
                if _compiling():  # reading grad_fn inside a compiled region breaks its graph
                    return
                if torch.is_grad_enabled() and self._capturing:
                    if name not in self._mod_in and self._order is None:
                        self._fwd_modules.append(name)
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
                if torch.is_grad_enabled() and self._capturing:
                    outs = output if isinstance(output, (tuple, list)) else (output,)
                    for o in outs:
                        if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                            self._mod_out.setdefault(o.grad_fn, name)

            return f

        def root_done(mod, args, output):
            if not _compiling() and torch.is_grad_enabled() and self._mod_out:
                self._finish_capture()

        for name, m in owners.items():
            self._graph_handles.append(m.register_forward_pre_hook(Hook(pre(name))))
            self._graph_handles.append(m.register_forward_hook(Hook(post(name))))
        self._graph_handles.append(self.model.register_forward_hook(Hook(root_done)))

    def _finish_capture(self) -> None:
        """Turn what the forward hooks saw into module edges, then remove the hooks and drop the
        grad_fns they hold (and the activations those keep alive). Runs when the root module's
        forward returns or, for models whose root forward never runs (an ``nn.ModuleDict`` whose
        submodules are called directly), at the first step, whatever was seen by then."""
        if not self._capturing:
            return
        self._capturing = False
        self._edges_mod = (self._edges_mod or set()) | self._walk_edges()
        self._edge_wanted -= set(self._mod_in) | set(self._mod_out.values())
        self._mod_in, self._mod_out = {}, {}
        for h in self._graph_handles:
            h.remove()
        self._graph_handles = []
        if self.run is not None:  # graph captured after the first step: store it now
            self.run.edges = np.asarray(self._layer_edges(), np.int32).reshape(-1, 2)
            if self._writer is not None:
                self._writer.write_meta()

    def _capture_late_edges(self) -> None:
        """Capture the next forward's graph again while a layer first used after the first step has
        no edges yet; at most ``_LATE_CAPTURES`` times, since a layer used once may never return."""
        if self._edge_wanted and not self._capturing and self._late_captures < _LATE_CAPTURES:
            self._late_captures += 1
            self._install_graph_capture()

    def _adopt_late_layers(self, values: np.ndarray) -> None:
        """A layer marked unused at the first step that now has a gradient becomes trainable, placed
        after the layers of the first backward (its real arrival order was not observed), and the
        next forward is captured for its edges; the run directory's meta is rewritten."""
        has = ~np.isnan(values[_M["nonfinite"]])
        late = [c for c in self._unused_cols if has[c]]
        if not late:
            return
        run, order = self.run, self._order
        assert run is not None and order is not None  # only the recording rank, after the first step
        self._unused_cols = [c for c in self._unused_cols if not has[c]]
        nxt = 1 + max(layer.backward_index for layer in run.layers)
        for k, c in enumerate(late):
            run.layers[c].status, run.layers[c].backward_index = "trainable", nxt + k
            self._edge_wanted.add(_module_of(self.model, self._names[order[c]])[0])
        self._capture_late_edges()
        if self._writer is not None:
            self._writer.write_meta()

    def _walk_edges(self) -> set[tuple[str, str]]:
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

    def _layer_edges(self) -> list[tuple[int, int]]:
        if not self._edges_mod or self._order is None:
            return []
        by_mod: dict[str, list[int]] = defaultdict(list)
        for c, pi in enumerate(self._order):
            by_mod[_module_of(self.model, self._names[pi])[0]].append(c)
        return sorted(
            {(a, b) for src, dst in self._edges_mod for a in by_mod.get(src, ()) for b in by_mod.get(dst, ())}
        )
