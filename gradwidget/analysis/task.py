"""What the run optimises, read from the loss's own autograd graph (``collect.loss_graph``) or
stated by the user (``Recorder(..., objective=...)``, kept in ``run.meta["objective"]``, or
``analyze(run, objective=...)``, which overrides it): which function made the loss, whether it is a
sum over the batch, how many classes a cross entropy reads, and whether the loss is one to minimise
at all. The causes read it instead of guessing from the model's output width:

- a chance level, ln(classes), exists only where the loss says there are classes (a cross entropy
  or ``nll_loss`` with C classes; a binary cross entropy: ln 2 per output);
- a summed loss is read per example (divided by the batch it sums over);
- an objective that is not minimised on its own (adversarial: the loss depends on trainable tensors
  outside the recorded model, as a GAN generator's depends on its discriminator; another recorded
  model's loss depends on this one's parameters, as the generator's on the discriminator's, whose
  own Recorder then reads it as a discriminator or critic (``run.meta["read_by"]``); or the recorded
  steps take turns over disjoint parts of the model, each part trained by its own optimizer on its
  own loss, as a GAN's generator and discriminator are when one Recorder sees both; a policy
  gradient; an expression with no loss function in it) gives no claim on the loss's trajectory: its
  damage is unknown, so statistical patterns stay information (``damage``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._args import OBJECTIVES
from ..collect.loss_graph import LossGraph

#: the graph's reducing op -> the loss's kind
_KINDS = {
    "NllLoss": "nll",
    "NllLoss2d": "nll",
    "BinaryCrossEntropy": "bce",
    "BinaryCrossEntropyWithLogits": "bce",
    "MseLoss": "mse",
    "L1Loss": "l1",
    "SmoothL1Loss": "l1",
    "HuberLoss": "l1",
    "KlDiv": "kl",
}
#: ops above the reducer that add a second term to the loss (a KL term, a penalty)
_ADDING = frozenset({"Add", "Sub"})
#: turns: the steps with a gradient fall into at least two sets of layers, pairwise disjoint, each
#: on at least this share of them (a WGAN's generator steps once per 5 critic steps: 1/6) ...
TURN_SHARE = 0.1
#: ... and the set changes from one step to the next on at least this share of them (two phases
#: one after the other, a frozen backbone then the head, change once)
TURN_SWITCHES = 0.1


@dataclass(frozen=True)
class Task:
    """The objective as the analysis reads it."""

    kind: str  #: cross_entropy, nll, bce, mse, l1, kl, another reducer's name, custom, unknown
    judged: bool  #: a loss to minimise: its trajectory (divergence, chance, stalling) is evidence
    classes: int | None = None  #: the classes a cross entropy / nll reads (None: no chance level)
    summed: bool | None = None  #: a sum over the batch (None: the graph does not say)
    batch: int | None = None  #: the examples a summed loss sums over
    terms: int = 1  #: terms added into the loss (a reconstruction plus a KL term: 2)
    assumed: str = ""  #: what the analysis assumed, in words (the report's note)
    reading: str = ""  #: what the loss was read as, in a few words (the panel's verdict line)

    @property
    def chance(self) -> float | None:
        """The loss of a model that learned nothing, per example: ln(classes) for a cross entropy,
        ln 2 for a binary one (an upper bound: a constant at the label rate does no worse); None for
        a loss without classes."""
        if not self.judged or self.terms > 1 or self.summed:
            return None
        if self.kind in ("cross_entropy", "nll") and self.classes is not None and self.classes >= 2:
            return float(np.log(self.classes))
        if self.kind == "bce":
            return float(np.log(2.0))
        return None

    def per_example(self, y):
        """The loss per example: a summed loss divided by the batch it sums over."""
        return y / self.batch if self.summed and self.batch else y


def task_of(run, objective: str = "auto") -> Task:
    """The run's task: stated by ``objective`` (or ``run.meta["objective"]``), else read off the loss's
    graph. A cross entropy whose graph predates the recorded class count takes it from the output
    layer's width: the graph says there are classes, the width how many."""
    if objective == "auto":
        stated = run.meta.get("objective") if isinstance(run.meta, dict) else None
        objective = stated if stated in OBJECTIVES else "auto"
    graph = LossGraph.of_run(run)
    if objective in ("adversarial", "policy_gradient", "other"):
        return Task(
            objective,
            False,
            assumed=f"objective={objective!r}: the loss's trajectory is not judged",
            reading=f"objective={objective!r}, its trajectory not judged",
        )
    parts = turns(run) if objective == "auto" else 0
    if parts:
        return Task(
            "adversarial",
            False,
            assumed=f"the recorded steps take turns over {parts} disjoint parts of the model (optimizers each "
            "training one part on its own loss, as a GAN's generator and discriminator): the logged loss "
            "interleaves their objectives and its trajectory is not judged; pass objective='loss' if it is "
            "one loss to minimise",
            reading="optimizers taking turns, as a GAN's: its trajectory not judged",
        )
    read_by = run.meta.get("read_by") if isinstance(run.meta, dict) else None
    if isinstance(read_by, str) and objective == "auto":
        return Task(
            "adversarial",
            False,
            summed=graph.summed if graph is not None else None,
            assumed=f"another recorded model's loss ({read_by}'s) depends on this model's parameters: it is "
            "that model's discriminator or critic, whose loss the other works against, so its trajectory is "
            "not judged; pass objective='loss' if it is a loss to minimise",
            reading=f"a discriminator or critic (a {read_by}'s loss reads it): its trajectory not judged",
        )
    if graph is None:
        return Task(
            "unknown",
            True,
            assumed="the loss was logged without its graph: read as a loss to minimise, with no chance level",
            reading="a loss to minimise (its graph not seen)",
        )
    if graph.foreign and objective == "auto":
        return Task(
            "adversarial",
            False,
            summed=graph.summed,
            assumed=f"the loss depends on {graph.foreign} trainable tensors outside the recorded model (another "
            "network's, as a GAN's generator loss depends on its discriminator): its trajectory is not judged; "
            "pass objective='loss' if it is a loss to minimise",
            reading="adversarial (it depends on another network): its trajectory not judged",
        )
    if graph.reducer is None and not graph.cross_entropy:
        return Task(
            "custom",
            objective == "loss",
            assumed="the loss is an expression with no loss function in it (a policy gradient, a custom "
            "objective): "
            + (
                "read as a loss to minimise (objective='loss')"
                if objective == "loss"
                else "its trajectory is not judged; pass objective='loss' if it is a loss to minimise"
            ),
            reading="a loss to minimise (objective='loss')"
            if objective == "loss"
            else "a custom expression: its trajectory not judged",
        )
    kind = "cross_entropy" if graph.cross_entropy else _KINDS.get(graph.reducer or "", (graph.reducer or "").lower())
    classes = graph.classes
    if classes is None and kind in ("cross_entropy", "nll"):
        classes = output_width(run)
    terms = len(graph.terms) + any(o in _ADDING for o in graph.above)
    t = Task(kind, True, classes, graph.summed, graph.batch, max(1, terms))
    what = kind.replace("_", " ") + (f" over {classes} classes" if t.chance is not None and classes else "")
    if t.summed:
        what += f", summed over the batch ({t.batch} examples: read per example)" if t.batch else ", summed"
    if t.terms > 1:
        what += f", plus {t.terms - 1} more term{'s' * (t.terms > 2)}"
    return Task(
        kind,
        True,
        classes,
        graph.summed,
        graph.batch,
        t.terms,
        f"the loss's graph shows a {what}: a loss to minimise",
        what,
    )


def output_layer(run):
    """The output layer's weight: the 2-d weight nearest the loss in the backward order."""
    ws = [
        info
        for info in run.layers
        if info.name.endswith("weight") and len(info.shape) == 2 and info.backward_index >= 0
    ]
    return min(ws, key=lambda info: info.backward_index) if ws else None


def output_width(run) -> int | None:
    """Rows of the output layer's weight (at least 2): the classes only where the loss says there
    are classes."""
    out = output_layer(run)
    return int(out.shape[0]) if out is not None and out.shape[0] >= 2 else None


def turns(run) -> int:
    """How many disjoint parts of the model the recorded steps take turns over (0: they do not),
    read from the layers each step brings a gradient to (an optimizer's ``zero_grad()`` after its
    step, Lightning's ``toggle_optimizer``) or, where stale gradients stay, the layers whose weights
    moved between steps."""
    if run.n_steps < 4 or run.n_layers < 2:
        return 0
    g, w = run.metric("grad_norm"), run.metric("weight_norm")
    with np.errstate(invalid="ignore"):
        got = np.isfinite(g) & (g > 0)
        moved = np.isfinite(w[1:]) & np.isfinite(w[:-1]) & (w[1:] != w[:-1])
    return max(_turns(got), _turns(moved))


def _turns(on) -> int:
    """The sets of layers ``on`` each step, those on at least TURN_SHARE of the steps pairwise
    disjoint, at least two of them, changing on at least TURN_SWITCHES of the steps: how many."""
    on = on[on.any(axis=1)]
    n = on.shape[0]
    if n < 4:
        return 0
    sets, which, counts = np.unique(on, axis=0, return_inverse=True, return_counts=True)
    common = counts >= TURN_SHARE * n
    if common.sum() < 2 or (sets[common].sum(axis=0) > 1).any():
        return 0
    which = np.asarray(which).reshape(-1)
    if (which[1:] != which[:-1]).mean() < TURN_SWITCHES:
        return 0
    return int(common.sum())
