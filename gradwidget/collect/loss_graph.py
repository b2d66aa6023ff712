"""What the loss does to the model's output, read once off the loss's autograd graph.

A loss tensor's ``grad_fn`` chain names every op between the model's output and the loss
(``NllLossBackward0 <- LogSoftmaxBackward0 <- AddmmBackward0`` for ``cross_entropy`` of a
Linear's logits). The nodes and their ``next_functions`` survive ``backward()`` (only their saved
tensors are freed), so the chain can be read whenever the loss is logged. Some chains are certain
mistakes, whatever the numbers look like:

- ``SoftmaxBackward0`` right below the ``LogSoftmaxBackward0`` of ``cross_entropy``: probabilities
  given to a loss that applies log-softmax itself (the output saturates, its gradients shrink);
- ``SoftmaxBackward0`` right below ``NllLossBackward0``: probabilities given to ``nll_loss``, which
  expects log-probabilities;
- ``SigmoidBackward0`` right below ``BinaryCrossEntropyWithLogitsBackward0``: a sigmoid applied
  before a loss that applies it itself.

It also says whether the loss is a sum over the batch: the loss op's own ``reduction`` (autograd
keeps it as ``_saved_reduction`` on ``NllLossBackward0``, ``MseLossBackward0``...) and the ops
above it (a division by the batch size makes a sum a mean again).

"Right below" looks through ops that only move or recast values (views, transposes, casts). The
walk is a pure function over grad_fn nodes (no torch import); :class:`LossGraphProbe` is what the
Recorder attaches: forward hooks that note which node made the model's output (and the output of
any softmax/sigmoid module), removed once a logged loss has been walked. The walk runs once per
Recorder and stops at the model's output (a few nodes on a transformer's loss); when no output node is known it
goes on into the model, bounded by ``MAX_NODES``.
"""

from __future__ import annotations

import re
import weakref
from collections import deque
from dataclasses import asdict, dataclass, field

from ._hooks import Hook
from ._probe import Probe, StepContext

#: nodes visited at most in one walk (the loss side of a graph is a handful of nodes; this bounds a
#: walk that finds no model output and goes on into the model)
MAX_NODES = 4096
#: ops looked through when asking what a loss op's input really is
_TRANSPARENT = frozenset(
    {
        "View",
        "UnsafeView",
        "Reshape",
        "ReshapeAlias",
        "Transpose",
        "Permute",
        "T",
        "Squeeze",
        "Unsqueeze",
        "Expand",
        "Clone",
        "ToCopy",
        "Alias",
        "Contiguous",
        "Flatten",
        "Unflatten",
        "Slice",
        "Select",
    }
)
#: (loss op, squashing op right below it) -> (kind, what it means); advice.py says what to change
PATTERNS: dict[tuple[str, str], tuple[str, str]] = {
    ("LogSoftmax", "Softmax"): (
        "softmax_cross_entropy",
        "softmax applied to the logits before cross_entropy, which applies log_softmax itself",
    ),
    ("NllLoss", "Softmax"): ("softmax_nll", "softmax probabilities given to nll_loss, which expects log-probabilities"),
    ("NllLoss2d", "Softmax"): (
        "softmax_nll",
        "softmax probabilities given to nll_loss, which expects log-probabilities",
    ),
    ("BinaryCrossEntropyWithLogits", "Sigmoid"): (
        "sigmoid_bce_with_logits",
        "sigmoid applied to the logits before binary_cross_entropy_with_logits, which applies it itself",
    ),
}
#: autograd's ``_saved_reduction`` codes (torch's Reduction enum)
_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}
#: ops above a loss op that undo a sum (a division by the batch) or make one (a sum of a mean, x N)
_DIVIDING = frozenset({"Div", "Mean", "Mul"})
_SUMMING = frozenset({"Sum", "Mul"})
#: parameter-free modules whose output the probe notes (a model ending in one of them)
SQUASH_MODULES = ("Softmax", "Softmax2d", "Sigmoid")


def op_name(node) -> str:
    """``SoftmaxBackward0`` -> ``Softmax``: the op, without autograd's suffix and version."""
    return re.sub(r"Backward\d*$", "", type(node).__name__)


@dataclass
class OutputMistake:
    """A loss op fed the output of a squashing op that it applies itself (or must not get)."""

    kind: str  #: a key of the ``PATTERNS`` values: softmax_cross_entropy, ...
    what: str  #: what it means, in words
    ops: list[str]  #: the ops from the loss op down to the squashing op
    module: str | None = None  #: the module whose output the squashing op made ("" the model), or None

    @property
    def in_model(self) -> bool:
        """The squashing op is the model's own (a module such as ``nn.Softmax``), not the loss code's."""
        return self.module is not None


@dataclass
class LossGraph:
    """The ops between the model's output and the loss, and the mistakes among them.
    Saved in ``run.meta["loss_graph"]``."""

    ops: list[str] = field(default_factory=list)  #: loss first, down to the model's output op
    reached_output: bool = False  #: ``ops`` ends at a node the model's forward made
    mistakes: list[OutputMistake] = field(default_factory=list)
    #: the loss op nearest the loss that reduces over the batch (``NllLoss``, ``MseLoss``...), its
    #: ``reduction`` ("none", "mean", "sum") and the ops between the loss and it (a division, a sum)
    reducer: str | None = None
    reduction: str | None = None
    above: list[str] = field(default_factory=list)
    #: every op on the loss side that reduces with a ``reduction`` (``MseLoss``, ``KlDiv``...): the
    #: loss's terms, when it adds several
    terms: list[str] = field(default_factory=list)
    #: the classes a log-softmax (or ``nll_loss``) reads, from the shape autograd keeps of its
    #: input; None when the graph has none or does not say
    classes: int | None = None
    #: the examples the reducer averages or sums over (the first dimension of its input), or None
    batch: int | None = None
    #: trainable tensors outside the recorded model that the loss depends on (another network's,
    #: as a GAN generator's loss depends on its discriminator's); None when not looked for
    foreign: int | None = None

    @property
    def summed(self) -> bool | None:
        """True when the loss is a sum over the batch (``reduction="sum"`` with nothing above that
        divides it), False when it is a mean (``reduction="mean"`` with nothing above that sums it),
        None when the graph does not say."""
        if self.reduction == "sum" and not any(o in _DIVIDING for o in self.above):
            return True
        if self.reduction == "mean" and not any(o in _SUMMING for o in self.above):
            return False
        return None

    @property
    def cross_entropy(self) -> bool:
        """The loss is a cross entropy of the model's output (log-softmax then NLL on the way)."""
        return self.reached_output and "LogSoftmax" in self.ops and any(o.startswith("NllLoss") for o in self.ops)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> LossGraph | None:
        """The LossGraph a ``to_dict`` made, or None when ``d`` is not one (a run from an older
        gradwidget, or a meta.json someone edited)."""
        try:
            ms = [
                OutputMistake(
                    str(m["kind"]),
                    str(m["what"]),
                    [str(o) for o in m["ops"]],
                    None if m.get("module") is None else str(m["module"]),
                )
                for m in d.get("mistakes", [])
            ]
            red = d.get("reduction")
            return cls(
                [str(o) for o in d.get("ops", [])],
                bool(d.get("reached_output", False)),
                ms,
                None if d.get("reducer") is None else str(d["reducer"]),
                None if red is None else str(red),
                [str(o) for o in d.get("above", [])],
                [str(o) for o in d.get("terms", [])],
                *(None if d.get(k) is None else int(d[k]) for k in ("classes", "batch", "foreign")),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None

    @classmethod
    def of_run(cls, run) -> LossGraph | None:
        """The run's loss graph (None when no tensor loss was logged with its graph)."""
        d = getattr(run, "meta", {}).get("loss_graph")
        return None if d is None else cls.from_dict(d)


def _input(node):
    """The node that made a node's first input (None for a leaf or a constant)."""
    nxt = getattr(node, "next_functions", ())
    return nxt[0][0] if nxt else None


def _squashed_input(node, outputs: dict, limit: int = 8):
    """Below a loss op: the first op that is not a view or a cast, and the chain down to it."""
    chain: list = []
    cur = _input(node)
    while cur is not None and len(chain) < limit:
        chain.append(cur)
        if op_name(cur) not in _TRANSPARENT:
            break
        cur = _input(cur)
    return chain


def _shape(node) -> tuple[int, ...] | None:
    """The shape of the tensor ``node`` made (autograd keeps it after backward; None if unknown)."""
    try:
        return tuple(int(n) for n in node._input_metadata[0].shape)
    except (AttributeError, IndexError, TypeError, RuntimeError):
        return None


def _classes(node) -> int | None:
    """The classes a ``LogSoftmax`` / ``Softmax`` reads along its dim, or an ``NllLoss``'s input's
    second dimension; None when the shape is not kept."""
    name = op_name(node)
    if name in ("LogSoftmax", "Softmax"):
        shape, dim = _shape(node), getattr(node, "_saved_dim", None)
        if shape and isinstance(dim, int) and -len(shape) <= dim < len(shape):
            return shape[dim]
        return None
    if name.startswith("NllLoss"):
        below = _input(node)
        shape = _shape(below) if below is not None else None
        return shape[1] if shape and len(shape) >= 2 else shape[0] if shape else None
    return None


def walk(
    loss_fn, outputs: dict | None = None, max_nodes: int = MAX_NODES, own: set | None = None, found: list | None = None
) -> LossGraph:
    """Walk a loss's graph from ``loss_fn`` (its ``grad_fn``) towards the model's output.

    ``outputs`` maps the nodes that made the model's output (and its submodules' outputs worth
    naming) to their module paths (``""``: the model); the walk does not go past them. Returns the
    ops on the shortest path from the loss to such a node (or none found) and every ``PATTERNS``
    mistake on the way, looked for across the model's output too (``nn.Softmax`` as its last module).
    With ``own`` (the ids of the model's parameters) it also counts the trainable tensors outside
    the model that the loss depends on, and appends them to ``found`` when given."""
    outputs = outputs or {}
    parent: dict = {loss_fn: None}
    queue, found_out, mistakes, reducer = deque([loss_fn]), None, [], None
    terms: list[str] = []
    classes: int | None = None
    foreign = 0
    while queue and len(parent) <= max_nodes:
        node = queue.popleft()
        if node in outputs and node is not loss_fn:  # a model that returns its own loss goes on to its logits
            found_out = found_out if found_out is not None else node
            continue
        name = op_name(node)
        if name == "AccumulateGrad":
            var = getattr(node, "variable", None)
            if own is not None and id(var) not in own:
                foreign += 1
                if found is not None and var is not None:
                    found.append(var)
            continue
        if classes is None and found_out is None:
            classes = _classes(node)
        below = _squashed_input(node, outputs) if any(k[0] == name for k in PATTERNS) else []
        if below and (name, op_name(below[-1])) in PATTERNS:
            kind, what = PATTERNS[(name, op_name(below[-1]))]
            mistakes.append(OutputMistake(kind, what, [name] + [op_name(n) for n in below], outputs.get(below[-1])))
        for nxt, _ in getattr(node, "next_functions", ()):
            if nxt is not None and nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
        if isinstance(getattr(node, "_saved_reduction", None), int):
            reducer = node if reducer is None else reducer
            terms.append(name)
    red_in = _input(reducer) if reducer is not None else None
    red_shape = _shape(red_in) if red_in is not None else None
    return LossGraph(
        _path(parent, found_out),
        found_out is not None,
        mistakes,
        None if reducer is None else op_name(reducer),
        None if reducer is None else _REDUCTIONS.get(reducer._saved_reduction),
        _path(parent, reducer)[:-1],
        terms,
        classes,
        red_shape[0] if red_shape else None,
        foreign if own is not None else None,
    )


def _path(parent: dict, node) -> list[str]:
    """The ops from the loss down to ``node`` (empty for None), by the walk's parent links."""
    out: list[str] = []
    while node is not None:
        out.append(op_name(node))
        node = parent[node]
    return out[::-1]


#: the loss-graph probes of this process's attached Recorders: a model whose parameters another
#: recorded model's loss depends on is that model's discriminator or critic (``LossGraphProbe.read_by``)
_ATTACHED: weakref.WeakSet[LossGraphProbe] = weakref.WeakSet()


class LossGraphProbe(Probe):
    """Forward hooks on the model (and on its softmax/sigmoid modules) that note which autograd
    nodes made their outputs in the latest forward, so that :func:`walk` knows where the model
    ends. ``see(loss)`` walks the first loss given with its graph; at the first recorded step the
    probe stores the result in the run and removes its hooks (also when a step went by without
    such a loss: the user logs numbers, or a detached tensor). A probe of the Recorder (``_probe``).

    It also tells the other attached Recorders' probes which of the trainable tensors outside its
    model its loss depends on: one whose model holds them is read by this model's loss (a GAN's
    discriminator, whose parameters the generator's loss runs through; an actor's critic), and
    says so in its run (``run.meta["read_by"]``, at its next recorded step): its own loss is not
    one to minimise on its own."""

    def __init__(self, model) -> None:
        self.result: LossGraph | None = None
        self._outputs: dict = {}
        self._own = {id(p) for p in model.parameters()}
        self._name = type(model).__name__
        self._foreign: list[weakref.ref] = []  # the trainable tensors outside the model its loss read
        self.read_by: str | None = None  # the model whose loss reads this one's parameters
        self._read_noted = False
        self._compiled = False  # a forward ran inside torch.compile: removing hooks would recompile it
        self.settled = False  # its one step went by: it looks no more
        self._handles = [model.register_forward_pre_hook(Hook(self._clear))]
        for path, m in model.named_modules():
            if path == "" or type(m).__name__ in SQUASH_MODULES:
                self._handles.append(m.register_forward_hook(Hook(self._note(path))))
        for other in list(_ATTACHED):  # a loss walked before this Recorder was built
            other._tell_readers(self)
        _ATTACHED.add(self)

    def _tell_readers(self, other: LossGraphProbe) -> None:
        """Tell ``other`` if this probe's loss reads its model's parameters."""
        if other is not self and other.read_by is None:
            if any(id(t) in other._own for r in self._foreign if (t := r()) is not None):
                other.read_by = self._name

    def _clear(self, module, args) -> None:
        import torch

        if torch.compiler.is_compiling():
            self._compiled = True
        else:
            self._outputs.clear()

    def _note(self, path: str):
        def hook(module, args, output) -> None:
            import torch

            if torch.compiler.is_compiling() or not torch.is_grad_enabled():
                return  # reading grad_fn inside a compiled region breaks its graph
            outs = (
                output.values()
                if isinstance(output, dict)
                else output
                if isinstance(output, (tuple, list))
                else (output,)
            )
            for o in outs:
                if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                    self._outputs.setdefault(o.grad_fn, path)  # a submodule's hook runs before the model's

        return hook

    def see(self, loss) -> None:
        """Walk ``loss``'s graph if it is a tensor that has one and none was walked yet (never
        inside a compiled region: reading grad_fn there breaks the graph)."""
        import torch

        if self.settled or self.result is not None or torch.compiler.is_compiling():
            return
        fn = getattr(loss, "grad_fn", None)
        if self.result is None and fn is not None:
            found: list = []
            self.result = walk(fn, self._outputs, own=self._own, found=found)
            self._outputs = {}
            self._foreign = [weakref.ref(t) for t in found]
            for other in list(_ATTACHED):
                self._tell_readers(other)

    def on_step(self, ctx: StepContext) -> None:
        """At the first recorded step: store the result in ``run.meta["loss_graph"]`` (and the run
        directory's meta.json) and remove the hooks. Under torch.compile the hooks (which compile
        to nothing) stay until ``close``: taking them off would recompile the model. Once another
        model's loss is found to read this one's parameters, ``run.meta["read_by"]`` says which."""
        if self.read_by is not None and not self._read_noted:
            self._read_noted = True
            ctx.note_meta({"read_by": self.read_by}, True)
        if self.settled:
            return
        self.settled = True
        if self.result is not None:
            ctx.note_meta({"loss_graph": self.result.to_dict()}, True)
        if self._compiled:
            self._outputs = {}
        else:
            self._unhook()

    def _unhook(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles, self._outputs = [], {}

    def close(self) -> None:
        self._unhook()
        _ATTACHED.discard(self)
