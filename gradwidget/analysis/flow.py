"""How gradient moves: per-layer flow characteristics, temporal direction, the flow network over the
recorded backward graph, critical paths, and vanishing / exploding / dead regions (seed 002).

Fixed from the seed: characteristics are scale-free (relative changes, coefficient of variation),
edges are the real data-flow pairs the Recorder found in the autograd graph (no edges are invented
when the run has none), paths come from a dynamic programme over that graph, and regions are
contiguous runs of layers in backward order with their real parameter counts and durations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..run import Run
from .stats import Series, _quiet, lstsq_slope, runs_of_true, sample_rows

DIRECTIONS = ("Forward", "Backward", "Oscillating", "Stagnant")
NODE_TYPES = ("Source", "Sink", "Bottleneck", "Amplifier", "Normal")
EDGE_TYPES = ("Strong", "Weak", "Intermittent", "Blocked")


# --------------------------------------------------------------------------- per-layer characteristics
def flow_characteristics(s: Series) -> pd.DataFrame:
    """One row per layer, over the recent window of gradient norms (``Series.recent``):

    - ``consistency`` 1/(1 + mean |Δx|/x_prev) (seed 000), 1 for a constant series;
    - ``smoothness`` 1/(1 + mean |Δ²x| / mean x) (the seed's was not scale-free);
    - ``oscillation`` share of consecutive differences that flip sign (1 for an alternating series);
    - ``stability`` 1/(1 + std/mean) (seed); NaN when the layer never had a gradient;
    - ``bottleneck_score`` 1 - min/mean (seed 002): how deep the norm dips below its usual level;
    - ``flow_rate`` mean |Δx| / mean x: relative change per step (information flow rate);
    - ``trend_slope`` least-squares slope of log10 norm per user step over the whole run (block-averaged
      copy), ``trend_decades`` the change it implies across the run, ``trend_r2`` its fit;
    - ``direction`` / ``direction_stability`` at the current step (last 3 / 5 recorded steps).
    """
    run, t = s.run, s.run.thresholds
    x = s.recent
    n, L = x.shape
    with _quiet(), np.errstate(invalid="ignore", divide="ignore"):
        mean = np.nanmean(x, axis=0)
        std = np.nanstd(x, axis=0)
        d = np.diff(x, axis=0)
        prev = x[:-1]
        rel = np.where(prev > 0, np.abs(d) / np.where(prev > 0, prev, 1.0), np.nan)
        consistency = 1.0 / (1.0 + np.nanmean(rel, axis=0)) if n >= 2 else np.ones(L)
        consistency = np.where(np.isfinite(consistency), consistency, np.where(mean == 0, 1.0, np.nan))
        d2 = np.abs(np.diff(x, n=2, axis=0)) if n >= 3 else np.zeros((0, L))
        smooth = np.where(mean > 0, 1.0 / (1.0 + np.nanmean(d2, axis=0) / mean), np.where(mean == 0, 1.0, np.nan)) \
            if n >= 3 else np.ones(L)
        sg = np.sign(d)
        prod = sg[1:] * sg[:-1]
        valid = np.sum(np.isfinite(prod), axis=0)
        osc = np.where(valid > 0, np.sum(prod < 0, axis=0) / np.maximum(valid, 1), 0.0) if n >= 4 else np.zeros(L)
        flow_rate = np.where(mean > 0, np.nanmean(np.abs(d), axis=0) / mean, 0.0) if n >= 2 else np.zeros(L)
        cv = std / mean
        stability = np.where(mean > 0, 1.0 / (1.0 + cv), np.nan)
        bottleneck = np.where(mean > 0, 1.0 - np.minimum(np.nanmin(x, axis=0) / mean, 1.0),
                              np.where(mean == 0, 1.0, np.nan)) if n else np.full(L, np.nan)
    slope, r2 = lstsq_slope(s.coarse, s.coarse_steps)
    span = float(run.steps[-1] - run.steps[0]) if run.n_steps > 1 else 0.0
    decades = slope * span
    oscillating = (osc > t.oscillation) & (flow_rate > t.oscillation_amplitude)
    trend = np.where(~np.isfinite(decades), "n/a",
                     np.where(oscillating, "oscillating",
                              np.where(decades > t.trend_decades, "rising",
                                       np.where(decades < -t.trend_decades, "falling", "flat"))))
    direction, dstab = temporal_direction(x, t.plateau_rel_change)
    return pd.DataFrame({
        "layer": run.layer_names, "consistency": consistency, "smoothness": smooth,
        "oscillation": osc, "oscillating": oscillating, "stability": stability,
        "bottleneck_score": bottleneck, "flow_rate": flow_rate, "trend_slope": slope,
        "trend_decades": decades, "trend_r2": r2, "trend": trend,
        "direction": direction, "direction_stability": dstab,
        "magnitude": x[-1] if n else np.full(L, np.nan),
    })


def temporal_direction(x: np.ndarray, stagnant_rel: float) -> tuple[np.ndarray, np.ndarray]:
    """Direction of each column's norm at its last row (seed 002 ``get_latest_flow_direction``):
    over the last 3 values, Oscillating when the two differences have opposite signs, else
    Forward (growing) / Backward (shrinking), Stagnant when the change is below ``stagnant_rel``
    of the level. Stability: 1/(1 + CV) of the last 5 values (the seed used the raw variance).
    Fewer than 3 rows: Stagnant with stability NaN."""
    n, L = x.shape
    if n < 3:
        return np.full(L, "Stagnant", dtype=object), np.full(L, np.nan)
    a, b, c = x[-3], x[-2], x[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        level = np.abs(np.nanmean(x[-3:], axis=0))
        change = c - a
        stag = ~(np.abs(change) > stagnant_rel * level)
        osc = (b - a) * (c - b) < 0
        out = np.where(stag, "Stagnant", np.where(osc, "Oscillating", np.where(change > 0, "Forward", "Backward")))
        last = x[-5:]
        m = np.nanmean(last, axis=0)
        stab = np.where(m > 0, 1.0 / (1.0 + np.nanstd(last, axis=0) / np.where(m > 0, m, 1)), np.nan)
    out = np.where(np.isfinite(change) | stag, out, "Stagnant")
    return out.astype(object), stab


# --------------------------------------------------------------------------- flow network
@dataclass
class FlowNode:
    layer: str
    node_type: str
    level: float            #: median RMS gradient entry (grad_norm / sqrt(numel))
    gain: float             #: level / largest downstream neighbour's level (backward gain into it)
    in_degree: int          #: upstream neighbours (forward)
    out_degree: int         #: downstream neighbours (forward)
    influence: float        #: level x flow consistency (seed 002)


@dataclass
class FlowEdge:
    upstream: str
    downstream: str
    gain: float             #: median ratio upstream/downstream RMS level: what survives the backward hop
    consistency: float      #: 1/(1 + std of log10 gain over steps)
    blocked_share: float    #: share of sampled steps the upstream layer had no gradient but downstream did
    edge_type: str


@dataclass
class NetworkMetrics:
    flow_efficiency: float      #: geometric mean edge gain
    connectivity: float         #: edges / (L (L - 1))
    bottleneck_density: float   #: share of nodes typed Bottleneck
    flow_stability: float       #: mean edge consistency
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
    kind: str                  #: "attenuation" (gradient lost) or "amplification" (gradient grown)
    layers: list[str]          #: in backward order: loss side first
    decades: float             #: total decades lost (or gained), recoveries not counted
    bottleneck_layers: list[str]
    worst_hop: tuple[str, str] | None
    criticality: float         #: 1 - 10**(-decades): share of gradient magnitude lost (or added)


def _rms_log(s: Series) -> tuple[np.ndarray, np.ndarray]:
    """(coarse log10 RMS entry per step, median of it per layer): norms made comparable across
    tensors of different sizes."""
    numel = np.array([max(1, l.numel) for l in s.run.layers], np.float64)
    rms = s.coarse - 0.5 * np.log10(numel)[None, :]
    with _quiet():
        return rms, np.nanmedian(rms, axis=0) if rms.shape[0] else np.full(len(numel), np.nan)


def no_flow_flags(run: Run, rows=None) -> np.ndarray:
    """Boolean (rows, layers): the layer had no usable gradient (vanishing or dead) at that step."""
    t = run.thresholds
    rows = slice(None) if rows is None else rows
    with np.errstate(invalid="ignore"):
        return (run.metric("mean_abs")[rows] < t.vanishing) | (run.metric("zero_frac")[rows] >= t.dead_zero_fraction)


def flow_network(s: Series, flow: pd.DataFrame) -> FlowNetwork:
    """Nodes and edges over ``run.edges`` (forward data-flow pairs from the autograd graph).

    Node types: Bottleneck (backward gain into it below ``bottleneck_gain``), Amplifier (above its
    inverse), else Source (no downstream layer: the gradient enters here from the loss), Sink (no
    upstream layer: the gradient ends here), else Normal. Edge types: Blocked (upstream starved
    while downstream flows on at least ``critical_issue_ratio`` of steps), Intermittent (at least
    ``minor_issue_ratio``), Weak (median gain below ``bottleneck_gain``), else Strong."""
    run, t = s.run, s.run.thresholds
    E = run.edges
    if len(E) == 0:
        return FlowNetwork(False, "the run has no recorded backward graph (record with the torch Recorder "
                                  "to get layer adjacency); network analysis is unavailable")
    names = run.layer_names
    L = run.n_layers
    rms, level = _rms_log(s)
    u, v = E[:, 0].astype(np.int64), E[:, 1].astype(np.int64)
    with _quiet(), np.errstate(invalid="ignore"):
        lg = rms[:, u] - rms[:, v]
        gain_log = np.nanmedian(lg, axis=0) if lg.shape[0] else np.full(len(E), np.nan)
        gstd = np.nanstd(lg, axis=0) if lg.shape[0] else np.full(len(E), np.nan)
    consistency = 1.0 / (1.0 + gstd)
    rows = sample_rows(run.n_steps, s.max_rows)
    nf = no_flow_flags(run, rows)
    blocked = (nf[:, u] & ~nf[:, v]).mean(axis=0) if nf.shape[0] else np.zeros(len(E))
    bg = np.log10(t.bottleneck_gain)
    etype = np.where(blocked >= t.critical_issue_ratio, "Blocked",
                     np.where(blocked >= t.minor_issue_ratio, "Intermittent",
                              np.where(gain_log < bg, "Weak", "Strong")))
    edges = [FlowEdge(names[a], names[b], float(10 ** g) if np.isfinite(g) else float("nan"),
                      float(c), float(bl), str(et))
             for a, b, g, c, bl, et in zip(u, v, gain_log, consistency, blocked, etype)]
    indeg = np.bincount(v, minlength=L)
    outdeg = np.bincount(u, minlength=L)
    # backward gain into a node: its level relative to its strongest downstream neighbour
    down_max = np.full(L, -np.inf)
    np.maximum.at(down_max, u, np.where(np.isfinite(level[v]), level[v], -np.inf))
    with np.errstate(invalid="ignore"):
        node_gain = np.where(np.isfinite(down_max), level - down_max, np.nan)
    ntype = np.where(node_gain < bg, "Bottleneck",
                     np.where(node_gain > -bg, "Amplifier",
                              np.where((outdeg == 0) & (indeg > 0), "Source",
                                       np.where((indeg == 0) & (outdeg > 0), "Sink", "Normal"))))
    cons = flow["consistency"].to_numpy()
    nodes = [FlowNode(names[i], str(ntype[i]), _f(10 ** level[i]), _f(10 ** node_gain[i]),
                      int(indeg[i]), int(outdeg[i]), _f(10 ** level[i] * cons[i])) for i in range(L)]
    fin = np.isfinite(gain_log)
    metrics = NetworkMetrics(
        flow_efficiency=float(10 ** np.mean(gain_log[fin])) if fin.any() else float("nan"),
        connectivity=len(E) / max(1, L * (L - 1)),
        bottleneck_density=float(np.mean(ntype == "Bottleneck")),
        flow_stability=float(np.nanmean(consistency)) if len(E) else float("nan"),
        blocked_edges=int(np.sum(etype == "Blocked")))
    return FlowNetwork(True, "", nodes, edges, metrics)


def _f(x) -> float:
    x = float(x)
    return x if np.isfinite(x) else float("nan")


def critical_paths(s: Series) -> list[CriticalPath]:
    """The input-to-output path with the largest gradient attenuation, and the one with the largest
    amplification, by dynamic programming over the recorded graph in topological order. A path's
    cost counts only the hops that lose (or gain) gradient, so a drop followed by a recovery is not
    cancelled out. Empty when the run has no graph."""
    run, t = s.run, s.run.thresholds
    E = run.edges
    if len(E) == 0:
        return []
    names = run.layer_names
    _, level = _rms_log(s)
    lvl = np.where(np.isfinite(level), level, np.nanmin(level) if np.isfinite(level).any() else 0.0)
    order = _topological(run.n_layers, E)
    if order is None:
        return []
    down: dict[int, list[int]] = {}
    for a, b in E.tolist():
        down.setdefault(a, []).append(b)
    out = []
    for kind, sign in (("attenuation", 1.0), ("amplification", -1.0)):
        best = np.full(run.n_layers, -np.inf)
        nxt = np.full(run.n_layers, -1)
        for n in reversed(order):  # loss side first
            ds = down.get(n)
            if not ds:
                best[n] = 0.0
                continue
            w = [best[d] + max(0.0, sign * (lvl[d] - lvl[n])) for d in ds]
            k = int(np.argmax(w))
            best[n], nxt[n] = w[k], ds[k]
        starts = [n for n in range(run.n_layers) if nxt[n] >= 0]
        if not starts:
            continue
        start = max(starts, key=lambda n: best[n])
        path = [start]
        while nxt[path[-1]] >= 0:
            path.append(int(nxt[path[-1]]))
        path = path[::-1]  # backward order: loss side first
        hops = [(path[i], path[i + 1]) for i in range(len(path) - 1)]  # (downstream, upstream)
        loss = [sign * (lvl[a] - lvl[b]) for a, b in hops]
        dec = float(best[start])
        if dec <= 0:
            continue
        bott = [names[b] for (a, b), x in zip(hops, loss) if x > -np.log10(t.bottleneck_gain)]
        worst = hops[int(np.argmax(loss))] if hops else None
        out.append(CriticalPath(kind, [names[i] for i in path], dec, bott,
                                (names[worst[0]], names[worst[1]]) if worst else None,
                                float(1 - 10 ** (-dec))))
    return out


def _topological(n: int, E: np.ndarray) -> list[int] | None:
    """Kahn's algorithm over forward edges; None when the recorded graph has a cycle."""
    indeg = np.bincount(E[:, 1], minlength=n).astype(np.int64)
    down: dict[int, list[int]] = {}
    for a, b in E.tolist():
        down.setdefault(a, []).append(b)
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


# --------------------------------------------------------------------------- regions
@dataclass
class Region:
    kind: str                 #: "vanishing", "exploding" or "dead"
    layers: list[str]         #: in backward order (loss side first)
    start_layer: str          #: first layer in backward order
    end_layer: str            #: last layer in backward order
    parameters: int           #: sum of the layers' numel
    duration_steps: int       #: recorded steps in which at least one of its layers was flagged
    first_step: int
    last_step: int
    active_now: bool          #: flagged at the last recorded step
    share: float              #: mean share of steps its layers were flagged
    severity: str             #: "Critical" or "Moderate"
    recovery: str = ""        #: dead zones: "Low" / "Medium" / "High" (seed RecoveryPotential)
    intervention_required: bool = False


def _step_flags(run: Run, kind: str, cols) -> np.ndarray:
    t = run.thresholds
    with np.errstate(invalid="ignore"):
        if kind == "vanishing":
            return run.metric("mean_abs")[:, cols] < t.vanishing
        if kind == "exploding":
            return (run.metric("max_abs")[:, cols] > t.exploding) | (run.metric("nonfinite")[:, cols] > 0)
        return run.metric("zero_frac")[:, cols] >= t.dead_zero_fraction


def regions(s: Series) -> list[Region]:
    """Vanishing regions, exploding regions and dead zones: maximal runs of adjacent trainable layers
    (depth order, reported in backward order) flagged on at least ``minor_issue_ratio`` of steps
    (exploding: on any step, since one explosion is enough to derail training)."""
    run, t = s.run, s.run.thresholds
    ex = s.exact
    tr = s.trainable
    shares = {"vanishing": ex["vanishing_share"], "exploding": ex["exploding_share"], "dead": ex["dead_share"]}
    out = []
    for kind, share in shares.items():
        member = (share > 0) if kind == "exploding" else (share >= max(t.minor_issue_ratio, 1e-12))
        member = member & tr
        for a, b in runs_of_true(member):
            cols = np.arange(a, b)
            f = _step_flags(run, kind, cols).any(axis=1)
            hit = np.flatnonzero(f)
            if hit.size == 0:
                continue
            names = [run.layer_names[i] for i in cols[::-1]]
            sh = float(share[cols].mean())
            critical = sh >= t.critical_issue_ratio or (kind == "exploding" and ex["nonfinite_share"][cols].max() > 0)
            r = Region(kind, names, names[0], names[-1], int(sum(run.layers[i].numel for i in cols)),
                       int(hit.size), int(run.steps[hit[0]]), int(run.steps[hit[-1]]), bool(f[-1]), sh,
                       "Critical" if critical else "Moderate")
            if kind == "dead":
                r.recovery = "High" if not f[-1] else ("Low" if sh > t.dead_recovery_share else "Medium")
                r.intervention_required = bool(f[-1] and sh >= t.critical_issue_ratio)
            out.append(r)
    return out
