"""Flow characteristics, temporal direction, regions, flow network and critical paths on synthetic
runs whose answers are known by construction."""

import numpy as np
import pytest

from gradwidget.analysis import flow, network
from gradwidget.analysis.stats import Series
from test_analysis_stats import synth

T = 60


def chars(g, **kw):
    s = Series(synth(g, **kw))
    return s, flow.flow_characteristics(s)


def test_constant_series():
    _, f = chars(np.full((T, 1), 0.5))
    r = f.iloc[0]
    assert r.consistency == pytest.approx(1) and r.smoothness == pytest.approx(1)
    assert r.oscillation == 0 and not r.oscillating and r.stability == pytest.approx(1)
    assert r.bottleneck_score == pytest.approx(0, abs=1e-9) and r.flow_rate == pytest.approx(0)
    assert r.trend_slope == pytest.approx(0, abs=1e-9) and r.trend == "flat"
    assert r.direction == "Stagnant" and r.direction_stability == pytest.approx(1)


def test_alternating_series_oscillates():
    g = np.where(np.arange(T) % 2 == 0, 1.0, 3.0)[:, None]
    _, f = chars(g)
    r = f.iloc[0]
    assert r.oscillation == pytest.approx(1.0) and r.oscillating and r.trend == "oscillating"
    assert r.direction == "Oscillating"
    assert r.flow_rate == pytest.approx(2 / 2.0)  # |Δ| = 2 around a mean of 2
    # CV = 1/2 around its trend (the median of 1 and 3), less over the first steps' partial windows
    assert r.stability == pytest.approx(1 / (1 + 0.5), abs=0.02)
    assert r.bottleneck_score == pytest.approx(0.5)  # min 1 vs mean 2


def test_small_noise_is_not_oscillation():
    rng = np.random.default_rng(0)
    _, f = chars(1 + 0.05 * rng.standard_normal((T, 1)))
    assert f.iloc[0].oscillation > 0.4 and not f.iloc[0].oscillating


def test_exponential_decay_and_growth_trends():
    steps = np.arange(T)
    g = np.column_stack([10 ** (-0.1 * steps), 10 ** (0.05 * steps)])
    _, f = chars(g)
    dec, grow = f.iloc[0], f.iloc[1]
    assert dec.trend_slope == pytest.approx(-0.1, rel=1e-4) and dec.trend_r2 == pytest.approx(1)
    assert dec.trend_decades == pytest.approx(-0.1 * (T - 1), rel=1e-4) and dec.trend == "falling"
    assert dec.direction == "Backward" and grow.direction == "Forward" and grow.trend == "rising"
    assert dec.consistency == pytest.approx(1 / (1 + (1 - 10**-0.1)), rel=1e-4)


def test_trend_uses_user_steps():
    g = 10 ** (-0.1 * np.arange(T))[:, None]
    _, f = chars(g, steps=np.arange(T) * 10)
    assert f.iloc[0].trend_slope == pytest.approx(-0.01, rel=1e-4)


def test_linear_decay_is_falling_but_not_oscillating():
    g = np.linspace(1.0, 0.001, T)[:, None]
    _, f = chars(g)
    assert f.iloc[0].trend == "falling" and f.iloc[0].oscillation == 0 and f.iloc[0].direction == "Backward"


def _regions(**kw):
    return flow.regions(Series(synth(**kw)))


def test_vanishing_region_is_contiguous_in_backward_order_with_real_sizes():
    g = np.full((T, 6), 1.0)
    g[:, 1:4] = 1e-9
    regs = _regions(g=g, numel=[10, 20, 30, 40, 50, 60])
    (r,) = [x for x in regs if x.kind == "vanishing"]
    assert r.layers == ["l3.weight", "l2.weight", "l1.weight"]
    assert (r.start_layer, r.end_layer) == ("l3.weight", "l1.weight")
    assert r.parameters == 20 + 30 + 40 and r.duration_steps == T
    assert r.severity == "Critical" and r.active_now and (r.first_step, r.last_step) == (0, T - 1)
    ma = 1e-9 / np.sqrt(30)  # synth: mean |g| = norm / sqrt(numel); the median of l3, l2, l1 is l2's
    assert r.mitigation_suggestions == [
        f"re-initialise l3.weight … l1.weight with a gain that matches the activation: median mean |g| {ma:.3g} "
        "is below 1e-07",
        "add residual (skip) connections or normalisation across the 3 layers l3.weight … l1.weight",
    ]


def test_a_frozen_layer_splits_regions():
    g = np.full((T, 5), 1e-9)
    regs = _regions(g=g, status=["trainable", "trainable", "frozen", "trainable", "trainable"])
    van = [r for r in regs if r.kind == "vanishing"]
    assert [r.layers for r in van] == [["l1.weight", "l0.weight"], ["l4.weight", "l3.weight"]]


def test_exploding_tail_has_its_real_duration():
    g = np.full((T, 3), 1.0)
    mx = np.full((T, 3), 1.0)
    mx[-5:, 2] = 1e5
    regs = _regions(g=g, max_abs=mx)
    (r,) = regs
    assert r.kind == "exploding" and r.layers == ["l2.weight"] and r.duration_steps == 5
    assert r.first_step == T - 5 and r.active_now and r.severity == "Moderate"
    assert r.mitigation_suggestions[0] == (
        "clip gradients (torch.nn.utils.clip_grad_norm_): |g| reached 1e+05 in l2.weight (> 1000)"
    )
    assert f"flagged on 5 steps ({T - 5}–{T - 1})" in r.mitigation_suggestions[1]


def test_dead_zone_and_its_recovery():
    g = np.full((T, 3), 1.0)
    z = np.zeros((T, 3))
    z[:, 0] = 1.0  # dead all along: Low recovery
    z[: T // 2, 2] = 1.0  # dead for the first half, then recovered: High
    regs = {tuple(r.layers): r for r in _regions(g=g, zero_frac=z) if r.kind == "dead"}
    low, high = regs[("l0.weight",)], regs[("l2.weight",)]
    assert low.recovery == "Low" and low.intervention_required and low.duration_steps == T
    assert high.recovery == "High" and not high.intervention_required and high.last_step == T // 2 - 1
    assert low.mitigation_suggestions[0].startswith("units in l0.weight are dead (100% of steps")
    assert "recovered" in high.mitigation_suggestions[1] and "lower the learning rate" in low.mitigation_suggestions[1]
    z2 = np.zeros((T, 1))
    z2[T // 4 :] = 1.0  # dead on 75% of steps and still dead: Medium
    (mid,) = [r for r in _regions(g=np.ones((T, 1)), zero_frac=z2) if r.kind == "dead"]
    assert mid.recovery == "Medium" and mid.intervention_required


def test_no_recorded_graph_means_no_network():
    s = Series(synth(np.ones((T, 3))))
    net = network.flow_network(s, flow.flow_characteristics(s))
    assert not net.available and "no recorded backward graph" in net.reason and net.edges == []
    assert network.critical_paths(s) == []


def chain(levels, edges=None, zero_frac=None):
    L = len(levels)
    g = np.tile(np.asarray(levels, float), (T, 1))
    edges = edges if edges is not None else [(i, i + 1) for i in range(L - 1)]
    s = Series(synth(g, numel=1, edges=edges, zero_frac=zero_frac))
    return s, network.flow_network(s, flow.flow_characteristics(s))


def test_node_and_edge_types_from_levels_on_the_recorded_graph():
    # input side first: l0 -> l1 -> l2 -> l3 -> loss. The gradient enters at l3 (Source) and drops
    # 1000x going back into l1 (Bottleneck); l0 gets 100x more than l1 (Amplifier).
    s, net = chain([1e-2, 1e-4, 1e-1, 1e-1])
    types = {n.layer: n.node_type for n in net.nodes}
    assert types == {"l0.weight": "Amplifier", "l1.weight": "Bottleneck", "l2.weight": "Normal", "l3.weight": "Source"}
    edges = {(e.upstream, e.downstream): e for e in net.edges}
    assert edges[("l1.weight", "l2.weight")].edge_type == "Weak"
    assert edges[("l1.weight", "l2.weight")].gain == pytest.approx(1e-3, rel=1e-3)
    assert edges[("l2.weight", "l3.weight")].edge_type == "Strong"
    assert edges[("l2.weight", "l3.weight")].consistency == pytest.approx(1)
    assert net.metrics.bottleneck_density == pytest.approx(0.25)
    assert net.metrics.connectivity == pytest.approx(3 / 12)
    _, net2 = chain([1e-1, 1e-1, 1e-1])
    assert {n.layer: n.node_type for n in net2.nodes}["l0.weight"] == "Sink"


def test_blocked_and_intermittent_edges():
    z = np.zeros((T, 3))
    z[:, 0] = 1.0  # l0 starved on every step while l1 flows: Blocked
    z[: T // 4, 1] = 1.0  # l1 starved on a quarter of steps while l2 flows: Intermittent
    _, net = chain([1.0, 1.0, 1.0], zero_frac=z)
    et = {(e.upstream, e.downstream): e.edge_type for e in net.edges}
    assert et[("l0.weight", "l1.weight")] == "Blocked"
    assert et[("l1.weight", "l2.weight")] == "Intermittent"
    assert net.metrics.blocked_edges == 1


def test_critical_path_follows_the_largest_attenuation_not_the_columns():
    # two branches into l3: l0 -> l1 -> l3 loses 4 decades, l2 -> l3 loses 1
    s, _ = chain([1e-5, 1e-3, 1e-2, 1e-1], edges=[(0, 1), (1, 3), (2, 3)])
    (att,) = [p for p in network.critical_paths(s) if p.kind == "attenuation"]
    assert att.layers == ["l3.weight", "l1.weight", "l0.weight"]
    assert att.decades == pytest.approx(4, rel=1e-4)
    assert att.bottleneck_layers == ["l1.weight", "l0.weight"]
    assert att.worst_hop == ("l1.weight", "l0.weight")
    assert att.criticality == pytest.approx(1 - 1e-4, rel=1e-6) and not att.reaches_zero
    # hops of 2 decades each against a tolerance of 1 (bottleneck gain 0.1): half is excess
    assert att.optimization_potential == pytest.approx(0.5, rel=1e-4)


def test_path_potential():
    assert network.path_potential([3.0], 1.0) == pytest.approx(2 / 3)
    assert network.path_potential([0.5] * 8, 1.0) == 0  # spread thinly: no single hop to fix
    assert network.path_potential([2.0, -1.0, 0.0], 1.0) == pytest.approx(0.5)  # recoveries do not count
    assert network.path_potential([], 1.0) == 0


def test_a_drop_and_recovery_is_not_cancelled_out():
    s, _ = chain([1e-1, 1e-3, 1e-1])  # backward: 1e-1 -> 1e-3 (lose 2) -> 1e-1 (gain 2)
    paths = {p.kind: p for p in network.critical_paths(s)}
    assert paths["attenuation"].decades == pytest.approx(2, rel=1e-4)
    assert paths["amplification"].decades == pytest.approx(2, rel=1e-4)


def test_non_finite_makes_an_exploding_region_critical():
    nf = np.zeros((T, 2))
    nf[10, 1] = 1
    (r,) = _regions(g=np.ones((T, 2)), nonfinite=nf)
    assert r.kind == "exploding" and r.severity == "Critical" and r.duration_steps == 1 and not r.active_now


def test_minibatch_noise_is_not_oscillation():
    """Trendless noise as large as its level (the demo's minibatch noise flips sign on ~2/3 of steps
    and moves the norm by more than half its level) is not oscillating in any of 300 layers: the
    turning-point test at 2 standard deviations let ~2% of noisy layers through."""
    rng = np.random.default_rng(0)
    g = np.exp(rng.standard_normal((300, 300)))
    _, f = chars(g)
    assert (f.flow_rate > 0.5).all() and f.oscillation.between(0.55, 0.8).all()
    assert not f.oscillating.any(), f[f.oscillating]
    assert (f.trend != "oscillating").all()


def test_alternation_above_the_noise_oscillates():
    """An alternating norm (x1.5 / x0.5 around a falling level) with batch noise of 10% is oscillating;
    the same noise without the alternation is not."""
    rng = np.random.default_rng(1)
    n = 300
    level = 10 ** (-np.arange(n) / n)
    noise = np.exp(0.1 * rng.standard_normal(n))
    alt = np.where(np.arange(n) % 2, 1.5, 0.5)
    _, f = chars(np.column_stack([level * alt * noise, level * noise, level * np.exp(rng.standard_normal(n))]))
    assert list(f.oscillating) == [True, False, False]
    assert f.autocorr_lag1[0] < -0.5 and abs(f.autocorr_lag1[2]) < 0.25


@pytest.mark.parametrize("tail", [[1, 3, 1, 3, 1, 3], [3, 1, 3, 1, 3, 1], [2, 2, 1, 3, 1], [5, 5, 5, 1, 3]])
def test_direction_checks_alternation_before_stagnation(tail):
    """The last three values up-down (or down-up) by more than the stagnation band are Oscillating,
    even when the net change over them is zero (which alone reads Stagnant)."""
    direction, _ = flow.temporal_direction(np.asarray(tail, float)[:, None], 1e-3)
    assert direction[0] == "Oscillating"


def test_a_reused_block_keeps_its_critical_path_and_says_the_graph_had_cycles():
    # l0 -> l1 -> l2 -> l3 with l2 feeding back into l1 (a block applied twice): the back edge
    # (2, 1) runs against the layer order and is left out; the path still loses 4 decades.
    s, net = chain([1e-5, 1e-3, 1e-2, 1e-1], edges=[(0, 1), (1, 2), (2, 1), (2, 3)])
    assert net.available and len(net.edges) == 4
    dag, back = network.break_cycles(4, network.graph_edges(s.run)[0])
    assert back.tolist() == [[2, 1]] and network._topological(4, dag) is not None
    (att,) = [p for p in network.critical_paths(s) if p.kind == "attenuation"]
    assert att.layers == ["l3.weight", "l2.weight", "l1.weight", "l0.weight"]
    assert att.decades == pytest.approx(4, rel=1e-4) and att.graph_had_cycles
    assert "1 back edge (l2.weight → l1.weight)" in network.cycle_note(s.run)
    s2, _ = chain([1e-5, 1e-3, 1e-2, 1e-1])
    assert network.cycle_note(s2.run) == "" and not network.critical_paths(s2)[0].graph_had_cycles


def test_break_cycles_leaves_an_acyclic_graph():
    rng = np.random.default_rng(0)
    for n in (1, 5, 40):
        E = rng.integers(0, n, (3 * n, 2))  # random digraph with self-loops and many cycles
        comp = network.strong_components(n, E)
        dag, back = network.break_cycles(n, E)
        assert network._topological(n, dag) is not None and len(dag) + len(back) == len(E)
        assert all(comp[a] == comp[b] and a >= b for a, b in back.tolist())
        reach = np.eye(n, dtype=bool)  # brute-force transitive closure: same component iff mutual reach
        reach[E[:, 0], E[:, 1]] = True
        for k in range(n):
            reach |= reach[:, [k]] & reach[[k], :]
        assert ((comp[:, None] == comp[None, :]) == (reach & reach.T)).all()


def test_a_graph_without_any_gradient_warns_nothing(recwarn):
    import warnings

    warnings.simplefilter("error")  # 'Mean of empty slice' leaked from the network metrics
    s = Series(synth(np.ones((T, 3)), edges=[(0, 1), (1, 2)], status=["frozen"] * 3))
    net = network.flow_network(s, flow.flow_characteristics(s))
    assert net.available and np.isnan(net.metrics.flow_stability) and np.isnan(net.metrics.flow_efficiency)
    from gradwidget.analysis import analyze

    assert analyze(s.run).overall_health == "Unknown"


def test_per_step_direction_series():
    g = np.array([1.0, 1.0, 2.0, 4.0, 2.0, 4.0, 4.0, 4.0, 2.0, 1.0])
    run = synth(np.column_stack([g, g]), steps=np.arange(10) * 5)
    d = flow.direction_series(run, "l0.weight")
    assert d.step.tolist() == list(range(0, 50, 5)) and d.magnitude.tolist() == g.tolist()
    assert d.direction.tolist() == [
        "Stagnant",
        "Stagnant",
        "Forward",
        "Forward",
        "Oscillating",
        "Oscillating",
        "Forward",
        "Stagnant",
        "Backward",
        "Backward",
    ]
    assert d.consistency.tolist() == pytest.approx(
        [1, 1, 1 - 1 / 3, 1 - 2 / 6, 1 - 2 / 6, 1 - 2 / 6, 1, 1, 1 - 2 / 6, 1 - 1 / 3]
    )
    # the last row agrees with the current direction of flow_characteristics
    assert d.direction.iloc[-1] == flow.flow_characteristics(Series(run)).direction.iloc[0]
    assert flow.direction_series(run, 1).direction.tolist() == d.direction.tolist()
    from gradwidget.analysis import analyze

    assert analyze(run).direction_series("l0.weight").equals(d)


def test_a_recurrent_block_recorded_from_torch_keeps_its_paths():
    torch = pytest.importorskip("torch")
    from torch import nn

    from gradwidget import Recorder
    from gradwidget.analysis import analyze

    torch.manual_seed(0)

    class Loop(nn.Module):  # a and b applied twice: b's output feeds a again (a cycle in the graph)
        def __init__(self):
            super().__init__()
            self.inp, self.a, self.b, self.out = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)

        def forward(self, x):
            x = self.inp(x)
            for _ in range(2):
                x = torch.tanh(self.b(torch.tanh(self.a(x))))
            return self.out(x)

    m = Loop()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rec = Recorder(m, opt)
    for _ in range(20):
        opt.zero_grad()
        m(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
    rep = analyze(rec.run)
    assert rep.network.available and rep.critical_paths
    assert all(p.graph_had_cycles for p in rep.critical_paths)
    assert any("the recorded graph has cycles" in n and "b.weight → a.weight" in n for n in rep.notes)
