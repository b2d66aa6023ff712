"""Evidence for the diagnoses: pure facts about a Run that the causes (``causes/``) reason from.

Each function answers one question a practitioner would ask before blaming a layer: what the loss
did (falling, flat, diverging, spiking), what the architecture already has (normalisation, residual
paths, recurrence), whether the optimizer holds and moves each parameter, how the gradient norm grew
over the first steps (accumulation without ``zero_grad`` makes it grow like the step count), and the
scale of the data entering the first layer. Nothing here decides what is wrong. The loss's evidence
is in ``loss.py`` (re-exported here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..run import Run
from .loss import (
    LOSS_EDGE_STEPS,
    LOSS_FELL,
    LOSS_FLAT,
    LOSS_REBOUND,
    LOSS_REBOUND_FACTOR,
    LOSS_REBOUND_SIGMA,
    LOSS_SMOOTH_STEPS,
    LOSS_SPIKE,
    LOSS_SPIKE_AFTER,
    LossEvidence,
    loss_evidence,
)
from .stats import _quiet

#: the loss's evidence lives in ``loss.py``; it is re-exported here with the rest of the evidence.
__all__ = [
    "GROWTH_STEPS",
    "LOSS_EDGE_STEPS",
    "LOSS_FELL",
    "LOSS_FLAT",
    "LOSS_REBOUND",
    "LOSS_REBOUND_FACTOR",
    "LOSS_REBOUND_SIGMA",
    "LOSS_SMOOTH_STEPS",
    "LOSS_SPIKE",
    "LOSS_SPIKE_AFTER",
    "Architecture",
    "Growth",
    "LossEvidence",
    "Smoothing",
    "accumulation_smoothing",
    "adaptive_optimizer",
    "architecture",
    "depth_attenuation",
    "early_growth",
    "has_skip_path",
    "input_rms",
    "is_embedding",
    "layer_levels",
    "line_search_optimizer",
    "loss_evidence",
    "never_updated",
    "output_weight",
    "update_ratio_series",
    "weights_moved",
    "weight_growth",
]


# --------------------------------------------------------------------------- the architecture
_NORM = re.compile(r"norm", re.I)
_RECURRENT = re.compile(r"^(LSTM|GRU|RNN)(Cell)?$|LSTM|GRU", re.I)
_ATTENTION = re.compile(r"attention|attn", re.I)
#: normalisation that subtracts a per-channel mean over the batch or the instance: a bias right
#: before it changes nothing, so its gradient is (up to rounding) zero
_MEAN_REMOVING = re.compile(r"BatchNorm|InstanceNorm", re.I)
_EMBEDDING = re.compile(r"embedding", re.I)


def is_embedding(module_type: str) -> bool:
    """An embedding table: each batch touches a few rows, so most of its gradient is exactly zero by
    design (never a sign of dead or vanishing units)."""
    return bool(_EMBEDDING.search(module_type))


@dataclass
class Architecture:
    """What the model already has, so an action never asks for what is there."""

    has_norm: bool  #: a normalisation layer (LayerNorm, BatchNorm, GroupNorm, RMSNorm, ...)
    has_residual: bool  #: a skip path in the recorded data-flow graph (or attention blocks, which have one)
    has_recurrent: bool  #: LSTM / GRU / RNN
    has_attention: bool
    input_layers: list[int]  #: the layers that see the input data (deepest in the backward order)
    token_input: bool  #: the input side is an embedding (token ids, no input scale to fix)
    norm_types: list[str]
    frozen_input: bool = False  #: frozen on purpose before the first layer with a gradient (fine-tuning)


def _module_graph(run: Run) -> tuple[list[str], np.ndarray]:
    """Modules (weight and bias of one module are one node) and the data-flow edges between them."""
    mods = [info.module or info.name.rsplit(".", 1)[0] for info in run.layers]
    names = list(dict.fromkeys(mods))
    idx = {m: i for i, m in enumerate(names)}
    E = np.asarray(run.edges, np.int64).reshape(-1, 2)
    E = E[((E >= 0) & (E < run.n_layers)).all(axis=1)]
    if not E.size:
        return names, np.zeros((0, 2), np.int64)
    M = np.array([[idx[mods[u]], idx[mods[v]]] for u, v in E], np.int64)
    M = np.unique(M[M[:, 0] != M[:, 1]], axis=0)
    return names, M


def has_skip_path(run: Run) -> bool:
    """True when some module feeds another both directly and through a longer path: an edge that
    jumps two or more levels of the longest-path layering of the module graph (a residual or dense
    connection). A plain chain has none."""
    names, M = _module_graph(run)
    n = len(names)
    if not M.size:
        return False
    indeg = np.zeros(n, int)
    np.add.at(indeg, M[:, 1], 1)
    out: list[list[int]] = [[] for _ in range(n)]
    for u, v in M:
        out[u].append(v)
    level = np.zeros(n, int)
    queue = [i for i in range(n) if indeg[i] == 0]
    seen = 0
    while queue:  # Kahn's order; a cycle (a reused module) leaves its nodes at their first level
        u = queue.pop()
        seen += 1
        for v in out[u]:
            level[v] = max(level[v], level[u] + 1)
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    return bool(np.any(level[M[:, 1]] - level[M[:, 0]] >= 2))


def architecture(run: Run) -> Architecture:
    """The model's norm layers, skip paths, recurrence and attention, read from the recorded module
    types, module names and data-flow graph."""
    types = [info.module_type for info in run.layers]
    names = [info.name for info in run.layers]
    norm_types = sorted({t for t in types if _NORM.search(t)})
    attention = any(_ATTENTION.search(t) for t in types) or any(_ATTENTION.search(n) for n in names)
    bi = np.array([info.backward_index for info in run.layers])
    got = bi >= 0
    deepest = int(bi[got].max()) if got.any() else -1
    inputs = [i for i in range(run.n_layers) if got[i] and bi[i] >= deepest - 1] if deepest >= 0 else []
    # the input module: every parameter of the module that holds the deepest gradient arrival
    if inputs:
        first_mod = run.layers[int(np.argmax(np.where(got, bi, -1)))].module
        inputs = [i for i in range(run.n_layers) if run.layers[i].module == first_mod] or inputs
    token = any(is_embedding(run.layers[i].module_type) for i in inputs)
    first = int(np.argmax(np.where(got, bi, -1))) if got.any() else 0
    frozen_input = any(info.status == "frozen" for info in run.layers[:first])
    return Architecture(
        has_norm=bool(norm_types),
        has_residual=attention or has_skip_path(run),
        has_recurrent=any(_RECURRENT.search(t) for t in types),
        has_attention=attention,
        input_layers=inputs,
        token_input=token,
        norm_types=norm_types,
        frozen_input=frozen_input,
    )


# --------------------------------------------------------------------------- the optimizer
def never_updated(run: Run) -> np.ndarray:
    """Per layer: it had a finite non-zero gradient on the steps where the optimizer moved other
    layers, yet its own update norm was never measured (NaN: the optimizer does not hold it) or
    was exactly zero. False for every layer without update norms (no optimizer given)."""
    L = run.n_layers
    if run.n_steps == 0:
        return np.zeros(L, bool)
    un = run.metric("update_norm")
    g = run.metric("grad_norm")
    measured = np.isfinite(un).any(axis=1)  # steps on which the optimizer's changes were measured
    if not measured.any():
        return np.zeros(L, bool)
    with _quiet(), np.errstate(invalid="ignore"):
        others_moved = (np.nan_to_num(un[measured], nan=0.0) > 0).sum(axis=1) > 0
        rows = np.flatnonzero(measured)[others_moved]
        if not rows.size:
            return np.zeros(L, bool)
        had_grad = (np.isfinite(g[rows]) & (g[rows] > 0)).mean(axis=0) > 0.5
        still = ~(np.nan_to_num(un[rows], nan=0.0) > 0).any(axis=0)
    return had_grad & still & run.trainable_mask()


def weights_moved(run: Run) -> np.ndarray:
    """Per layer: its weights changed between recorded steps, whatever moved them (its weight norm
    is not one value: the norm of an unchanged tensor is computed alike every step)."""
    if run.n_steps < 2:
        return np.zeros(run.n_layers, bool)
    wn = run.metric("weight_norm")
    with _quiet(), np.errstate(invalid="ignore"):
        return np.isfinite(wn).any(axis=0) & (np.nanmax(wn, axis=0) != np.nanmin(wn, axis=0))


#: optimizers whose first step moves every entry by about the learning rate whatever its gradient
#: (Adam's bias-corrected first step is lr * sign(g)): that step measures the rate against the
#: weights' scale, not the steps training goes on to take.
ADAPTIVE_OPTIMIZERS = re.compile(
    r"^(Adam|AdamW|Adamax|NAdam|RAdam|SparseAdam|Adagrad|Adadelta|RMSprop|Adafactor|Lion)", re.I
)


#: optimizers that choose each step's length by a line search (the learning rate is its first trial
#: scale): an update's size against the weights says nothing of a learning rate set too high.
LINE_SEARCH_OPTIMIZERS = re.compile(r"^LBFGS", re.I)


def _optimizer_is(run: Run, kinds: re.Pattern) -> bool:
    """The run's optimizer (``run.meta["optimizer"]``, its class name) is one of ``kinds``."""
    name = run.meta.get("optimizer") if isinstance(run.meta, dict) else None
    return isinstance(name, str) and bool(kinds.match(name))


def line_search_optimizer(run: Run) -> bool:
    """The run's optimizer sets its step length by a line search."""
    return _optimizer_is(run, LINE_SEARCH_OPTIMIZERS)


def adaptive_optimizer(run: Run) -> bool:
    """The run's optimizer scales each entry's step by its own gradient history."""
    return _optimizer_is(run, ADAPTIVE_OPTIMIZERS)


def update_ratio_series(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """Steps with a measured update and, per step, the median over layers of ||update|| / ||weight||."""
    un = run.metric("update_norm")
    wn = run.metric("weight_norm")
    measured = np.isfinite(un).any(axis=1)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(wn[measured] > 0, un[measured] / wn[measured], np.nan)
        med = np.nanmedian(np.where(np.isfinite(r), r, np.nan), axis=1) if r.size else np.zeros(0)
    return run.steps[measured], med


def weight_growth(run: Run) -> np.ndarray:
    """Per layer: the largest weight norm over the run divided by the first (NaN without weights;
    Inf once a weight overflowed, which is growth too)."""
    if run.n_steps == 0:
        return np.full(run.n_layers, np.nan)
    w = run.metric("weight_norm")
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        top = np.fmax.reduce(w, axis=0).astype(np.float64)  # NaN-skipping max, no copy of the run
        first = w[0].astype(np.float64)
        return np.where(first > 0, top / first, np.nan)


# --------------------------------------------------------------------------- gradient growth
#: recorded steps over which the early growth of the gradient norm is fitted.
GROWTH_STEPS = 8


@dataclass
class Growth:
    """How the global gradient norm grew over the first ``GROWTH_STEPS`` recorded steps."""

    exponent: float  #: p of a least-squares fit g ~ (k + 1)^p over recorded steps k
    rising: float  #: share of those steps on which it rose
    max_step_ratio: float  #: largest g_k / g_(k-1): one fresh gradient at most doubles it when it accumulates
    first_ratio: float  #: g_1 / g_0: about 2 when the second step's gradient was added to the first's
    power_law: bool  #: log g is fitted better by log(k + 1) (a sum of steps) than by k (geometric growth)


def early_growth(run: Run) -> Growth | None:
    """The global gradient norm's growth over the first ``GROWTH_STEPS`` recorded steps (None when
    fewer are recorded or one is not finite). Accumulating gradients without ``zero_grad`` adds each
    step's gradient to the last, so at the start (where consecutive gradients point the same way)
    g grows like the step count: p near 1, rising on almost every step, and never more than about
    doubling in one step. A diverging run grows geometrically instead (x10 and more per step);
    healthy training has p well below 1 and rises about half the time."""
    g = run.scalar("global_norm").astype(np.float64)[:GROWTH_STEPS]
    if g.size < 4 or not np.all(np.isfinite(g)) or not np.all(g > 0):
        return None
    lg = np.log(g)
    k = np.arange(g.size, dtype=np.float64)
    (p, c), res_pow = np.polyfit(np.log1p(k), lg, 1, full=True)[:2]
    res_exp_all = np.polyfit(k, lg, 1, full=True)[1]
    pow_residual = float(res_pow[0]) if len(res_pow) else 0.0
    exp_residual = float(res_exp_all[0]) if len(res_exp_all) else 0.0
    return Growth(
        float(p),
        float(np.mean(np.diff(g) > 0)),
        float(np.max(g[1:] / g[:-1])),
        float(g[1] / g[0]),
        pow_residual < exp_residual,
    )


#: recorded steps over which accumulation's smoothing is measured, and where its late part starts.
SMOOTH_STEPS, SMOOTH_LATE = 40, 10


@dataclass
class Smoothing:
    """Per-layer step-to-step change of the gradient norm over the first ``SMOOTH_STEPS`` steps."""

    late: float  #: median over layers of the median |change in log norm| from step SMOOTH_LATE on
    early: float  #: ... over the steps before
    growth: float  #: largest global norm in the late part over the first one
    rising: float  #: share of layer-steps on which the norm rose


def accumulation_smoothing(run: Run, layers: np.ndarray | None = None) -> Smoothing | None:
    """How a sum of per-step gradients behaves: each step adds one fresh gradient to a growing
    total, so the total's relative change shrinks like 1/step (smooth, late changes a few percent,
    several times smaller than early ones) while it keeps growing. Batch noise keeps a healthy
    layer's norm changing by 10-50% a step throughout. ``layers`` (a boolean mask) limits the
    per-layer statistics to those layers. None with fewer than 20 finite steps."""
    g = run.metric("grad_norm")[:SMOOTH_STEPS].astype(np.float64)
    if layers is not None:
        g = g[:, layers]
    gl = run.scalar("global_norm")[:SMOOTH_STEPS].astype(np.float64)
    fin = np.flatnonzero(~np.isfinite(gl))
    n = int(fin[0]) if fin.size else gl.size
    if n < 2 * SMOOTH_LATE or not np.all(gl[:n] > 0):
        return None
    g, gl = g[:n], gl[:n]
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        d = np.abs(np.diff(np.log(np.where(g > 0, g, np.nan)), axis=0))
        late = float(np.nanmedian(np.nanmedian(d[SMOOTH_LATE - 1 :], axis=0)))
        early = float(np.nanmedian(np.nanmedian(d[: SMOOTH_LATE - 1], axis=0)))
        rising = float(np.nanmean(np.diff(g, axis=0) > 0))
    return Smoothing(late, early, float(np.max(gl[SMOOTH_LATE:]) / gl[0]), rising)


# --------------------------------------------------------------------------- depth
def output_weight(run: Run) -> int | None:
    """Index of the output layer's weight: the 2-d weight nearest the loss in the backward order."""
    ws = [
        i
        for i, info in enumerate(run.layers)
        if info.name.endswith("weight") and len(info.shape) >= 2 and info.backward_index >= 0
    ]
    return min(ws, key=lambda i: run.layers[i].backward_index) if ws else None


def layer_levels(run: Run, rows=slice(None), cols=slice(None)) -> np.ndarray:
    """log10 of the RMS gradient entry (``grad_norm / sqrt(numel)``) of layers ``cols`` at steps
    ``rows``: comparable across tensors of different sizes; NaN without a positive finite gradient."""
    g = run.metric("grad_norm")[rows][:, cols].astype(np.float64)
    n = np.sqrt(np.maximum(1, np.array([info.numel for info in run.layers], np.float64)))[cols]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isfinite(g) & (g > 0), np.log10(g / n), np.nan)


def depth_attenuation(run: Run, arch: Architecture) -> tuple[np.ndarray, int | None]:
    """Per step, how many decades the RMS gradient entry falls from the output layer's weight to
    the input layer's weight (NaN where either is missing, the input is an embedding: a table's
    gradient is sparse by design, or the input side is frozen: the first trained layer is not the
    input layer), and the output weight's index (``layer_levels`` relative to it
    tell how far below it each layer sits)."""
    out = output_weight(run)
    ins = [i for i in arch.input_layers if run.layers[i].name.endswith("weight") and len(run.layers[i].shape) >= 2]
    if out is None or not ins or arch.token_input or arch.frozen_input or ins[0] == out:
        return np.full(run.n_steps, np.nan), None
    lv = layer_levels(run, cols=[out, ins[0]])
    return lv[:, 0] - lv[:, 1], out


# --------------------------------------------------------------------------- input scale
def input_rms(run: Run, arch: Architecture, cannot_move: np.ndarray, rows: int = 8) -> float:
    """The root-mean-square size of the data entering the first layer, read off its gradients: for
    a Linear/Conv with a bias, ||dL/dW|| ~ ||dL/db|| x rms(input) x sqrt(fan_in), so their ratio
    estimates the input's scale (about 1 for normalised data). Median over the first ``rows``
    recorded steps; NaN when the first layer has no bias, its bias is one the loss cannot move
    (``cannot_move``, per layer: its gradient is rounding, not a measure), it feeds a batch or
    instance norm (which removes what the bias adds) or it takes token ids."""
    if arch.token_input or run.n_steps == 0:
        return float("nan")
    ins = arch.input_layers
    w = [i for i in ins if run.layers[i].name.endswith("weight") and len(run.layers[i].shape) >= 2]
    b = [i for i in ins if run.layers[i].name.endswith("bias")]
    if not w or not b or cannot_move[b[0]]:
        return float("nan")
    wi, bi = w[0], b[0]
    after = {int(d) for u, d in run.edges if u in (wi, bi)}
    if any(_MEAN_REMOVING.search(run.layers[j].module_type) for j in after):
        return float("nan")
    shape = run.layers[wi].shape
    fan_in = int(np.prod(shape[1:]))
    g = run.metric("grad_norm")[:rows].astype(np.float64)
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        r = g[:, wi] / (g[:, bi] * np.sqrt(max(fan_in, 1)))
        r = r[np.isfinite(r) & (r > 0)]
    return float(np.median(r)) if r.size else float("nan")
