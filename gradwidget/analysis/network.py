"""The flow network over the backward graph the Recorder saw, and its critical paths (as in the original crate's
flow visualisation).

Edges are the real data-flow pairs ``run.edges`` from the autograd graph; when a run has none (an
ArrayRecorder run) the network is reported unavailable instead of inventing neighbours. Levels are
per-entry RMS gradients (norm / sqrt(numel)) so tensors of different sizes compare. Paths come from
a dynamic programme over the graph in topological order, O(layers + edges); a reused module's
cycles are broken first (``break_cycles``).

Fields of the original crate not carried over, and why:
- ``NetworkMetrics.information_propagation_speed`` (the original crate: efficiency x connectivity). Backprop
  delivers every layer's gradient in the same step, so a recorded run has no propagation speed to
  measure; how much of the gradient reaches the input is ``flow_efficiency`` and the attenuation
  path's ``decades``.
- ``CriticalGradientPath.path_id`` / ``path_length`` (a name and ``len(layers)``), and
  ``GradientDirection.direction_vector`` (the original crate: ``[norm]``, a placeholder: only norms are recorded,
  not gradient vectors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..rules import vanishing_flags
from ..run import METRICS, Run
from .stats import _TINY, STAT_ROWS, Series, _quiet, nanmedian, sample_rows


# --------------------------------------------------------------------------- flow network
@dataclass
class FlowNode:
    layer: str
    node_type: str
    level: float  #: median RMS gradient entry (grad_norm / sqrt(numel))
    gain: float  #: level / largest downstream neighbour's level (backward gain into it)
    in_degree: int  #: upstream neighbours (forward)
    out_degree: int  #: downstream neighbours (forward)
    influence: float  #: level x flow consistency (the original crate's flow visualisation)


@dataclass
class FlowEdge:
    upstream: str
    downstream: str
    gain: float  #: median ratio upstream/downstream RMS level: what survives the backward hop
    consistency: float  #: 1/(1 + std of log10 gain over steps)
    blocked_share: float  #: share of sampled steps no gradient reached the upstream layer (vanishing or dead)
    edge_type: str


@dataclass
class NetworkMetrics:
    flow_efficiency: float  #: geometric mean edge gain
    connectivity: float  #: edges / (L (L - 1))
    bottleneck_density: float  #: share of nodes typed Bottleneck
    flow_stability: float  #: mean edge consistency
    blocked_edges: int


@dataclass
class FlowNetwork:
    available: bool
    reason: str = ""
    nodes: list[FlowNode] = field(default_factory=list)
    edges: list[FlowEdge] = field(default_factory=list)
    metrics: NetworkMetrics | None = None


@dataclass
class CriticalPath:
    kind: str  #: "attenuation" (gradient lost) or "amplification" (gradient grown)
    layers: list[str]  #: in backward order, loss side first: one layer per module (its largest parameter)
    decades: float  #: net decades lost (or gained) between the path's two ends
    bottleneck_layers: list[str]
    worst_hop: tuple[str, str] | None
    criticality: float  #: 1 - 10**(-decades): share of gradient magnitude lost (or added)
    reaches_zero: bool = False  #: a layer on it had exactly zero gradient (decades then only say "all")
    graph_had_cycles: bool = False  #: back edges of a reused module were left out (see ``break_cycles``)
    optimization_potential: float = 0.0  #: share of ``decades`` beyond the tolerated loss per hop (see
    #: ``path_potential``): what fixing its bottleneck hops could recover


def _rms_log(s: Series) -> tuple[np.ndarray, np.ndarray]:
    """(coarse log10 RMS entry per step, median of it per layer): norms made comparable across
    tensors of different sizes."""
    if s._rms is None:
        numel = np.array([max(1, info.numel) for info in s.run.layers], np.float64)
        rms = s.coarse - 0.5 * np.log10(numel)[None, :]
        s._rms = rms, (nanmedian(rms, axis=0) if rms.shape[0] else np.full(len(numel), np.nan))
    return s._rms


def graph_edges(run: Run) -> tuple[np.ndarray, int]:
    """The recorded edges whose two ends are layers of the run (int64 ``(E, 2)``), and how many were
    dropped: a hand-built or truncated run directory can name a layer index that does not exist, and
    one bad pair should not hide the rest of the graph."""
    E = np.asarray(run.edges, np.int64).reshape(-1, 2)
    ok = ((E >= 0) & (E < run.n_layers)).all(axis=1)
    return E[ok], int((~ok).sum())


def dropped_edges_note(run: Run) -> str:
    """A report note when the run's graph names layers it does not have ('' otherwise)."""
    _, bad = graph_edges(run)
    return (
        f"{bad} recorded graph edge{'s' * (bad != 1)} named a layer index outside 0..{run.n_layers - 1} "
        f"and {'were' if bad != 1 else 'was'} left out of the flow network"
        if bad
        else ""
    )


def no_flow_flags(run: Run, rows=None) -> np.ndarray:
    """Boolean (rows, layers): the layer had no usable gradient (vanishing or dead) at that step."""
    t = run.thresholds
    c = run.block(slice(None) if rows is None else rows)  # one gather for both metrics
    with np.errstate(invalid="ignore"):
        return vanishing_flags(c[:, METRICS.index("mean_abs")], t) | (
            c[:, METRICS.index("zero_frac")] >= t.dead_zero_fraction
        )


def flow_network(s: Series, flow: pd.DataFrame) -> FlowNetwork:
    """Nodes and edges over ``run.edges`` (forward data-flow pairs from the autograd graph).

    Node types: Bottleneck (backward gain into it below ``bottleneck_gain``), Amplifier (above its
    inverse), else Source (no downstream layer: the gradient enters here from the loss), Sink (no
    upstream layer: the gradient ends here), else Normal. Edge types: Blocked (no gradient gets
    through to the upstream layer on at least ``critical_issue_ratio`` of steps), Intermittent (at
    least ``minor_issue_ratio``), Weak (median gain below ``bottleneck_gain``), else Strong."""
    run, t = s.run, s.run.thresholds
    E, _ = graph_edges(run)
    if len(E) == 0:
        return FlowNetwork(
            False,
            "the run has no recorded backward graph (record with the torch Recorder to get which layers feed which)",
        )
    names = run.layer_names
    L = run.n_layers
    rms, level = _rms_log(s)
    u, v = E[:, 0], E[:, 1]
    with _quiet(), np.errstate(invalid="ignore"):
        lg = rms[:, u] - rms[:, v]
        gain_log = nanmedian(lg, axis=0) if lg.shape[0] else np.full(len(E), np.nan)
        gstd = np.nanstd(lg, axis=0) if lg.shape[0] else np.full(len(E), np.nan)
    consistency = 1.0 / (1.0 + gstd)
    rows = sample_rows(run.n_steps, min(s.max_rows, STAT_ROWS))
    nf = no_flow_flags(run, rows)
    blocked = nf[:, u].mean(axis=0) if nf.shape[0] else np.zeros(len(E))
    bg = np.log10(t.bottleneck_gain)
    etype = np.where(
        blocked >= t.critical_issue_ratio,
        "Blocked",
        np.where(blocked >= t.minor_issue_ratio, "Intermittent", np.where(gain_log < bg, "Weak", "Strong")),
    )
    edges = [
        FlowEdge(names[a], names[b], float(10**g) if np.isfinite(g) else float("nan"), float(c), float(bl), str(et))
        for a, b, g, c, bl, et in zip(u, v, gain_log, consistency, blocked, etype)
    ]
    indeg = np.bincount(v, minlength=L)
    outdeg = np.bincount(u, minlength=L)
    # backward gain into a node: its level relative to its strongest downstream neighbour
    down_max = np.full(L, -np.inf)
    np.maximum.at(down_max, u, np.where(np.isfinite(level[v]), level[v], -np.inf))
    with np.errstate(invalid="ignore"):
        node_gain = np.where(np.isfinite(down_max), level - down_max, np.nan)
    ntype = np.where(
        node_gain < bg,
        "Bottleneck",
        np.where(
            node_gain > -bg,
            "Amplifier",
            np.where((outdeg == 0) & (indeg > 0), "Source", np.where((indeg == 0) & (outdeg > 0), "Sink", "Normal")),
        ),
    )
    cons = flow["consistency"].to_numpy()
    nodes = [
        FlowNode(
            names[i],
            str(ntype[i]),
            _f(10 ** level[i]),
            _f(10 ** node_gain[i]),
            int(indeg[i]),
            int(outdeg[i]),
            _f(10 ** level[i] * cons[i]),
        )
        for i in range(L)
    ]
    fin = np.isfinite(gain_log)
    metrics = NetworkMetrics(
        flow_efficiency=float(10 ** np.mean(gain_log[fin])) if fin.any() else float("nan"),
        connectivity=len(E) / max(1, L * (L - 1)),
        bottleneck_density=float(np.mean(ntype == "Bottleneck")),
        flow_stability=_finite_mean(consistency),
        blocked_edges=int(np.sum(etype == "Blocked")),
    )
    return FlowNetwork(True, "", nodes, edges, metrics)


def _finite_mean(x: np.ndarray) -> float:
    """Mean of the finite entries; NaN when there are none (no warning: an all-frozen graph is valid)."""
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def _f(x) -> float:
    x = float(x)
    return x if np.isfinite(x) else float("nan")


def module_nodes(run: Run, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One node per module (a weight and its bias act together): the representative layer of each
    module (its largest parameter with a known level) and the module-level forward edges between
    representatives. Modules without any known level are left out."""
    mods = [info.module or info.name.rsplit(".", 1)[0] for info in run.layers]
    rep: dict[str, int] = {}
    for i, m in enumerate(mods):
        if np.isfinite(level[i]) and (m not in rep or run.layers[i].numel > run.layers[rep[m]].numel):
            rep[m] = i
    E, _ = graph_edges(run)
    pairs = {
        (rep[mods[a]], rep[mods[b]]) for a, b in E.tolist() if mods[a] in rep and mods[b] in rep and mods[a] != mods[b]
    }
    return np.array(sorted(rep.values()), np.int64), np.array(sorted(pairs), np.int64).reshape(-1, 2)


def critical_paths(s: Series) -> list[CriticalPath]:
    """The data path with the largest net gradient attenuation (loss side to input side), and the
    one with the largest net amplification, over modules (a weight and its bias together, measured
    by the RMS gradient entry of the module's largest parameter). A path's decades are the net
    change between its ends: what a drop loses and a later recovery regains cancel, as they do for
    the gradient itself. Found by dynamic programming over the module graph in topological order
    (cycles of a reused module broken first, see ``break_cycles``); its hops that lose more than
    ``bottleneck_gain`` are its bottlenecks. Empty when the run has no graph."""
    run, t = s.run, s.run.thresholds
    names = run.layer_names
    _, lvl = _rms_log(s)
    nodes, E = module_nodes(run, lvl)
    if len(E) == 0:
        return []
    E, back = break_cycles(run.n_layers, E)
    on_graph = set(nodes.tolist())
    order = [n for n in (_topological(run.n_layers, E) or []) if n in on_graph]
    down: dict[int, list[int]] = {}
    for a, b in E.tolist():  # forward edges: a feeds b (b is nearer the loss)
        down.setdefault(a, []).append(b)
    # the level a layer gets when its gradient is exactly zero (log10_pos maps 0 to float32 tiny)
    zero = np.log10(_TINY) - 0.5 * np.log10(np.array([max(1, info.numel) for info in run.layers], np.float64))
    tol = -np.log10(t.bottleneck_gain)
    out = []
    for kind, sign in (("attenuation", 1.0), ("amplification", -1.0)):
        # far[n]: the extreme (highest for attenuation) level reachable towards the loss from n
        far = {n: sign * lvl[n] for n in order}
        via = {n: -1 for n in order}
        for n in reversed(order):
            for d in down.get(n, []):
                if d in far and far[d] > far[n]:
                    far[n], via[n] = far[d], d
        gains = {n: far[n] - sign * lvl[n] for n in order if via[n] >= 0}
        if not gains:
            continue
        start = max(gains, key=lambda n: gains[n])
        dec = float(gains[start])
        if dec <= 0:
            continue
        path = [start]
        while via[path[-1]] >= 0:
            path.append(int(via[path[-1]]))
        path = path[::-1]  # backward order: loss side first
        hops = [(path[i], path[i + 1]) for i in range(len(path) - 1)]  # (downstream, upstream)
        change = [sign * (lvl[a] - lvl[b]) for a, b in hops]
        bott = [names[b] for (a, b), x in zip(hops, change) if x > tol]
        worst = hops[int(np.argmax(change))] if hops else None
        out.append(
            CriticalPath(
                kind,
                [names[i] for i in path],
                dec,
                bott,
                (names[worst[0]], names[worst[1]]) if worst else None,
                float(1 - 10 ** (-dec)),
                bool(np.any(lvl[path] <= zero[path] + 1e-6)),
                len(back) > 0,
                path_potential(change, tol),
            )
        )
    return out


def path_potential(hop_decades, tol: float) -> float:
    """Share of a path's lost (or gained) decades that lies beyond ``tol`` decades per hop (the
    bottleneck gain): the part concentrated in its bottleneck hops, which a local fix there (a
    residual connection or normalisation across the hop) could recover. 0 when the loss is spread
    thinly over many hops, 1 - tol/d for a single hop of d decades."""
    h = np.maximum(np.asarray(hop_decades, np.float64), 0.0)
    tot = h.sum()
    return float(np.maximum(h - tol, 0.0).sum() / tot) if tot > 0 else 0.0


def _topological(n: int, E: np.ndarray) -> list[int] | None:
    """Kahn's algorithm over forward edges; None when the graph has a cycle."""
    indeg = np.bincount(E[:, 1], minlength=n).astype(np.int64)
    down = _adjacency(E)
    stack = [i for i in range(n) if indeg[i] == 0]
    order = []
    while stack:
        i = stack.pop()
        order.append(i)
        for j in down.get(i, ()):
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    return order if len(order) == n else None


def _adjacency(E: np.ndarray) -> dict[int, list[int]]:
    down: dict[int, list[int]] = {}
    for a, b in E.tolist():
        down.setdefault(a, []).append(b)
    return down


def strong_components(n: int, E: np.ndarray) -> np.ndarray:
    """Component id per node (iterative Tarjan, O(nodes + edges)): nodes share an id exactly when
    each reaches the other, i.e. they sit on a common cycle."""
    down = _adjacency(E)
    index = np.full(n, -1)
    low = np.zeros(n, np.int64)
    comp = np.full(n, -1)
    on, stack, counter, ncomp = np.zeros(n, bool), [], 0, 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, k = work.pop()
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on[v] = True
            nb = down.get(v, [])
            if k < len(nb):
                work.append((v, k + 1))
                w = nb[k]
                if index[w] < 0:
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:  # v roots a component: pop it
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp[w] = ncomp
                    if w == v:
                        break
                ncomp += 1
            if work:  # hand the low link back to the caller
                u = work[-1][0]
                low[u] = min(low[u], low[v])
    return comp


def break_cycles(n: int, E: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(acyclic edges, back edges). A reused module (weight tying, a recurrent block) feeds its own
    input, so the recorded graph has cycles and no topological order. Inside each strongly connected
    component the edges that run against the model's layer order (``a >= b``: the loop back to an
    earlier layer, or a layer into itself) are the back edges; without them every component follows
    the layer order, so the rest is acyclic and each pass through the block is counted once."""
    if len(E) == 0:
        return E, E
    comp = strong_components(n, E)
    back = (comp[E[:, 0]] == comp[E[:, 1]]) & (E[:, 0] >= E[:, 1])
    return E[~back], E[back]


def cycle_note(run: Run) -> str:
    """A report note naming the reused layers when the recorded graph has cycles ('' otherwise)."""
    E, _ = graph_edges(run)
    _, back = break_cycles(run.n_layers, E)
    if len(back) == 0:
        return ""
    names = run.layer_names
    hops = ", ".join(f"{names[a]} → {names[b]}" for a, b in back[:4].tolist()) + (" …" if len(back) > 4 else "")
    return (
        f"the recorded graph has cycles (a module used more than once, e.g. weight tying or a recurrent "
        f"block): {len(back)} back edge{'s' * (len(back) != 1)} ({hops}) left out of the critical paths, "
        "so each reuse is counted once"
    )
