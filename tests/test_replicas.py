"""The replica check's pieces in one process: the comparison (``disagreement``), the fingerprint,
rank 0's record and the diagnosis read from it. The distributed runs are in test_replicas_dist.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gradwidget.collect._replicas import (
    NO_GRAD,
    ReplicaRecord,
    disagreement,
    fingerprint,
    signature,
)
from gradwidget.thresholds import Thresholds

TOLERANCE = Thresholds.replica_tolerance


def _fp(*per_rank):
    """(W, L, 2) fingerprints: one (weight, grad) pair per layer per rank."""
    return np.array(per_rank, np.float64)


def _odd_ranks(odd, layer, part):
    return np.flatnonzero(odd[:, layer, part]).tolist()


def test_equal_replicas_agree_and_a_difference_names_the_rank_that_differs():
    same = [[1.5, 0.25], [2.0, 0.5]]
    fp = _fp(same, same, same, same)
    codes = np.zeros((4, 2), np.int64)
    odd, rel = disagreement(fp, codes)
    assert not odd.any() and (rel == 0).all()

    fp[2, 1, 1] = 0.4  # rank 2's gradient of layer 1 (clipped, say)
    odd, rel = disagreement(fp, codes)
    assert _odd_ranks(odd, 1, 1) == [2] and odd.sum() == 1
    assert rel[2, 1, 1] == pytest.approx(0.2)


def test_when_rank_0_is_the_odd_one_it_is_named_not_the_others():
    fp = _fp([[1.0, 9.0]], [[1.0, 1.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    odd, _ = disagreement(fp, np.zeros((4, 1), np.int64))
    assert _odd_ranks(odd, 0, 1) == [0] and odd.sum() == 1
    # two ranks: no majority, the one differing from rank 0 is named
    odd, _ = disagreement(fp[:2], np.zeros((2, 1), np.int64))
    assert _odd_ranks(odd, 0, 1) == [1]
    # every rank different from every other: all but rank 0 are named (no majority to trust)
    fp = _fp([[1.0, 1.0]], [[1.0, 2.0]], [[1.0, 3.0]], [[1.0, 4.0]])
    odd, _ = disagreement(fp, np.zeros((4, 1), np.int64))
    assert _odd_ranks(odd, 0, 1) == [1, 2, 3]


def test_tolerance_nan_infinity_and_missing_gradients():
    a = np.array([[[1.0, 1.0], [np.nan, np.inf], [2.0, NO_GRAD], [3.0, NO_GRAD]]])
    b = a.copy()
    b[0, 0, 0] *= 1 + TOLERANCE / 4  # reduction-order noise: within the tolerance
    b[0, 0, 1] *= 1 + TOLERANCE * 4  # beyond it
    b[0, 3, 1] = 0.0  # a zero gradient is not a missing one
    odd, rel = disagreement(np.concatenate([a, b]), np.zeros((2, 4), np.int64))
    assert odd[1].tolist() == [[False, True], [False, False], [False, False], [False, True]]
    assert rel[1, 1].tolist() == [0.0, 0.0]  # NaN == NaN, inf == inf: the nonfinite cause's business
    c = b.copy()
    c[0, 1, 0] = 5.0  # NaN on rank 0 only
    odd, rel = disagreement(np.concatenate([a, c]), np.zeros((2, 4), np.int64))
    assert odd[1, 1, 0] and rel[1, 1, 0] == np.inf


def test_only_ranks_that_hold_the_same_piece_are_compared():
    # layer 0 replicated (code 0 on every rank); layer 1 sharded (-1: never compared); layer 2 an
    # HSDP-like layout: ranks 0, 2 hold shard 1 and ranks 1, 3 hold shard 2
    fp = _fp(
        [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]],
        [[1.0, 1.0], [2.0, 2.0], [5.0, 5.0]],
        [[1.0, 1.0], [3.0, 3.0], [1.0, 1.0]],
        [[1.0, 1.0], [4.0, 4.0], [5.0, 5.5]],
    )
    codes = np.array([[0, -1, 1], [0, -1, 2], [0, -1, 1], [0, -1, 2]])
    odd, rel = disagreement(fp, codes)
    assert not odd[:, :2].any() and np.isnan(rel[:, 1]).all()
    assert _odd_ranks(odd, 2, 0) == [] and _odd_ranks(odd, 2, 1) == [3]  # against rank 1, its replica
    # a layer only one rank holds is compared with nobody
    odd, rel = disagreement(fp, np.array([[0, -1, 1], [0, -1, 2], [0, -1, 3], [0, -1, 4]]))
    assert not odd[:, 2].any() and np.isnan(rel[:, 2]).all()


def test_fingerprint_is_the_weight_and_gradient_norm_of_each_compared_parameter():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1, bias=False))
    m(torch.randn(5, 3)).sum().backward()
    params = list(m.parameters())
    params[1].grad = None  # the first layer's bias has no gradient
    fp = fingerprint(params, np.array([0, 0, -1]))
    assert fp.shape == (3, 2)
    np.testing.assert_allclose(fp[0], [params[0].norm().item(), params[0].grad.norm().item()], rtol=1e-6)
    assert fp[1, 0] == pytest.approx(params[1].norm().item()) and fp[1, 1] == NO_GRAD
    assert fp[2].tolist() == [0.0, 0.0]  # not compared: not computed
    # bit for bit the same on the same values (what healthy DDP replicas hold)
    twin = [nn.Parameter(p.detach().clone()) for p in params]
    for t, p in zip(twin, params):
        t.grad = None if p.grad is None else p.grad.clone()
    assert np.array_equal(fingerprint(twin, np.array([0, 0, -1])), fp)


def test_signature_tells_apart_models_of_other_shapes_or_names():
    a = [torch.zeros(3, 2), torch.zeros(3)]
    assert signature(["w", "b"], a) == signature(["w", "b"], [t.clone() + 1 for t in a])
    assert signature(["w", "b"], a) != signature(["w", "c"], a)
    assert signature(["w", "b"], a) != signature(["w", "b"], [torch.zeros(2, 3), torch.zeros(3)])


def test_record_keeps_one_entry_per_layer_and_part_with_its_first_step():
    rec = ReplicaRecord(["a", "b"], [0, 1, 2], every=1, compared=2, skipped=0)
    codes = np.zeros((3, 2), np.int64)
    ok = _fp([[1.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 2.0]], [[1.0, 1.0], [2.0, 2.0]])
    assert rec.add(10, ok, [0, 1, 2], *disagreement(ok, codes)) is False
    bad = ok.copy()
    bad[2, 1, 1] = 3.0  # rank 2's gradient of b
    assert rec.add(11, bad, [0, 1, 2], *disagreement(bad, codes)) is True
    bad[2, 1, 0] = 2.5  # ... and then its weight
    assert rec.add(12, bad, [0, 1, 2], *disagreement(bad, codes)) is True
    assert rec.add(13, bad, [0, 1, 2], *disagreement(bad, codes)) is False
    d = rec.data
    assert (d["steps_checked"], d["first_step"], d["last_step"]) == (4, 10, 13)
    grad, weight = d["diverged"]
    assert (grad["layer"], grad["part"], grad["first_step"], grad["ranks"], grad["steps"]) == ("b", "grad", 11, [2], 3)
    assert grad["values"] == {"0": 2.0, "1": 2.0, "2": 3.0} and grad["rel_diff"] == pytest.approx(1 / 3)
    assert (weight["part"], weight["first_step"], weight["last_step"]) == ("weight", 12, 13)


# --------------------------------------------------------------------------- the diagnosis
def _record(bad_step: int | None = 11, kinds=None, world: int = 3, odd: int = -1) -> dict:
    """Rank 0's record of ``world`` ranks checked on steps 10-13; rank ``odd``'s (-1: the last)
    gradient of l1.weight, then its weight, differ from ``bad_step`` on (None: a healthy run)."""
    ranks = list(range(world))
    rec = ReplicaRecord(["l0.weight", "l1.weight"], ranks, every=1, compared=2, skipped=0)
    fp = _fp(*[[[1.0, 1.0], [2.0, 2.0]] for _ in ranks])
    codes = np.zeros((world, 2), np.int64)
    for step in range(10, 14):
        if bad_step is not None and step >= bad_step:
            fp[odd, 1, 1] = 3.0
        if bad_step is not None and step > bad_step:
            fp[odd, 1, 0] = 2.5
        rec.add(step, fp, ranks, *disagreement(fp, codes))
    rec.data["kinds"] = kinds or {str(r): "ddp" for r in ranks}
    return rec.data


def test_finding_names_layers_ranks_first_step_and_the_numbers():
    from gradwidget.analysis.replicas import replica_finding

    assert replica_finding(None) is None and replica_finding(_record(None)) is None
    f = replica_finding(_record())
    assert (f.layers, f.ranks, f.first_step, f.weights) == (["l1.weight"], [2], 11, True)
    assert (f.wrapped, f.unwrapped) == ([0, 1, 2], [])
    assert "the gradient norm of l1.weight at step 11: rank 0 2, rank 1 2, rank 2 3" in f.evidence
    assert "rank 2 differs from rank 0 (0.333 relative difference; 2 of 3 ranks agree)" in f.evidence
    assert "weights of 1 layer(s) differ, on up to 2 of 4 checked steps" in f.evidence
    assert "2 replicated layers compared across ranks 0, 1, 2 (tolerance 1e-05 relative)" in f.evidence


@pytest.mark.parametrize("world,odd", [(2, 0), (2, 1), (3, 0), (3, 2), (4, 0)])
def test_the_minority_is_named_and_two_ranks_are_named_both(world, odd):
    """Three or more ranks: the one that differs from the others, rank 0 or the last. Two: no
    majority, so both are named, the evidence says they differ from each other and blames neither,
    and the action copies from no rank in particular."""
    from gradwidget import analyze
    from gradwidget.analysis.replicas import replica_finding

    f = replica_finding(_record(world=world, odd=odd))
    (d,) = [d for d in analyze(_run_with(_record(world=world, odd=odd))).diagnoses if d.cause == "replicas_diverged"]
    if world == 2:
        assert (f.ranks, f.pair, f.reference) == ([0, 1], True, None) and d.ranks == [0, 1]
        assert "rank 0 and rank 1 differ from each other (0.333 relative difference); with two ranks" in f.evidence
        assert "do not say which of them changed" in f.evidence and "(ranks 0, 1)" in d.text
        assert "the rank that holds the intended ones" in d.action and "src=0" not in d.action
    else:
        ref = 1 if odd == 0 else 0
        assert (f.ranks, f.pair, f.reference) == ([odd], False, ref) and d.ranks == [odd]
        assert (
            f"rank {odd} differs from rank {ref} (0.333 relative difference; {world - 1} of {world} ranks agree)"
            in (f.evidence)
        )
        assert f"(rank {odd})" in d.text and f"copy rank {ref}'s weights" in d.action and f"src={ref})" in d.action


def test_two_ranks_set_up_apart_name_the_one_without_ddp():
    from gradwidget.analysis.replicas import replica_finding

    f = replica_finding(_record(world=2, odd=0, kinds={"0": "replicated", "1": "ddp"}))
    assert (f.ranks, f.pair, f.reference) == ([0], False, 1)


def _run_with(record):
    from test_analysis_stats import synth

    T = 20
    run = synth(np.full((T, 2), 0.1), loss=np.linspace(2.0, 0.5, T), steps=np.arange(T))
    if record is not None:
        run.meta["replicas"] = record
    return run


def test_a_healthy_record_raises_nothing_and_a_diverged_one_is_a_critical_diagnosis_naming_the_ranks():
    from gradwidget import analyze

    base = analyze(_run_with(None))
    healthy = analyze(_run_with(_record(None)))
    assert [r.cause for r in healthy.diagnoses] == [r.cause for r in base.diagnoses]
    assert "replicas_diverged" not in [r.cause for r in healthy.diagnoses]

    rep = analyze(_run_with(_record()))
    top = rep.diagnoses[0]
    assert (top.cause, top.priority, top.first_step, top.layers, top.ranks) == (
        "replicas_diverged",
        "Critical",
        11,
        ["l1.weight"],
        [2],
    )
    assert top.text == "Replicas out of sync across ranks (rank 2) in 1 layer since step 11: l1.weight."
    assert "pytorch#104336" in top.action and "checkpoint saved before step 11" in top.action
    assert rep.overall_health == "Critical"
    assert rep.layers.set_index("layer").loc["l1.weight", "health"] == "Critical"


def test_the_action_fits_the_setup():
    from gradwidget import analyze

    mixed = analyze(_run_with(_record(kinds={"0": "ddp", "1": "ddp", "2": "replicated"}))).diagnoses[0]
    assert mixed.action.startswith("wrap the model in DistributedDataParallel on every rank, alike (rank(s) 2 do not)")
    assert "rank(s) 0, 1 wrap the model in DDP, rank(s) 2 do not" in mixed.evidence
    plain = {"0": "replicated", "1": "replicated", "2": "replicated"}
    none = analyze(_run_with(_record(kinds=plain))).diagnoses[0]
    assert none.action.startswith("wrap the model in DistributedDataParallel (nothing averages the gradients")
    assert "for each parameter)" in none.action
    tp = {"0": "tensor_parallel", "1": "tensor_parallel", "2": "tensor_parallel"}
    pieces = analyze(_run_with(_record(kinds=tp))).diagnoses[0]
    assert pieces.action.startswith("give the parameters every tensor-parallel rank holds whole")
    assert "DistributedDataParallel" not in pieces.action and "not the shards" in pieces.action


def test_a_saved_run_folder_shows_it_in_the_report_the_cli_and_the_panel(tmp_path):
    from gradwidget import analyze
    from gradwidget.cli import main
    from gradwidget.panel.table import diagnoses_from_report
    from gradwidget.storage import load_run

    _run_with(_record()).save(tmp_path / "run")
    run = load_run(tmp_path / "run")
    assert run.meta["replicas"] == _record()
    report = analyze(run)
    (diag,) = [d for d in diagnoses_from_report(report, run) if d["cause"] == "replicas_diverged"]
    assert "(rank 2)" in diag["text"] and diag["first_step"] == 11 and diag["layers"] == ["l1.weight"]
    assert main(["report", str(tmp_path / "run"), "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "Replicas out of sync across ranks (rank 2)" in html and "rank 2 3" in html


def test_a_reader_following_the_run_folder_takes_the_record_when_rank_0_writes_it(tmp_path):
    from gradwidget.storage import RunReader
    from gradwidget.storage.writer import RunWriter

    run = _run_with(None)
    writer = RunWriter(tmp_path / "run", run)
    writer.write_meta()
    reader = RunReader(tmp_path / "run")
    assert reader.run.meta.get("replicas") is None
    run.meta["replicas"] = _record()  # what the recorder does on a new divergence
    writer.write_meta()
    reader.poll()
    assert reader.run.meta["replicas"] == _record()
    writer.close()


# --------------------------------------------------------------------------- who is compared with whom
class _Ctx:
    """What ReplicaExchange reads of a rank's DistContext."""

    def __init__(self, rank, world, kind="ddp", ddp_ranks=None):
        self.rank, self.world_size, self.kind = rank, world, kind
        self.ddp_ranks = ddp_ranks if ddp_ranks is not None else (list(range(world)) if kind == "ddp" else None)

    def held_apart(self, name):
        return False


def _simulate(models, ctxs, steps=3, every=1):
    """Every rank's check driven through one HashStore in this process, ranks in lockstep (each
    posts step n before rank 0 takes step n + 1, as DDP's all-reduce orders them); returns rank
    0's record. ``models[r]``: rank r's parameters, changed in place between steps by ``models``'s
    callers."""
    from torch.distributed import HashStore

    from gradwidget.collect._replica_exchange import ReplicaExchange

    store = HashStore()
    seen = []
    checks = [
        ReplicaExchange(ctx, [f"p{i}" for i in range(len(ps))], ps, every, lambda: None, seen.append, store, "t")
        for ctx, ps in zip(ctxs, models)
    ]
    for _ in range(steps):
        for c in checks[::-1]:  # rank 0 last: it reads the others' previous steps
            c.step_hook(None, (), {})
    checks[0].close()
    return checks[0].record.data if checks[0].record is not None else None


def _params(seed, shapes=((3, 2), (3,))):
    g = torch.Generator().manual_seed(seed)
    out = [nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]
    for p in out:
        p.grad = torch.ones_like(p)
    return out


def test_ranks_holding_another_model_are_not_compared():
    # ranks 0 and 1 hold one pipeline stage, ranks 2 and 3 another (other names and shapes): compared
    # in pairs, never across stages, though all four weights differ
    stage2 = _params(5, ((4, 4),))
    rec = _simulate(
        [_params(0), _params(0), stage2, [nn.Parameter(p.detach().clone()) for p in stage2]],
        [_Ctx(r, 4, ddp_ranks=[0, 1] if r < 2 else [2, 3]) for r in range(4)],
    )
    assert rec["ranks"] == [0, 1] and rec["diverged"] == [] and rec["steps_checked"] == 3
    # an ensemble: the same model trained apart by two DDP groups: each group is its own replicas
    rec = _simulate(
        [_params(0), _params(0), _params(1), _params(1)],
        [_Ctx(r, 4, ddp_ranks=[0, 1] if r < 2 else [2, 3]) for r in range(4)],
    )
    assert rec["ranks"] == [0, 1] and rec["diverged"] == []


def test_a_model_no_wrapper_syncs_compares_only_what_started_equal():
    # tensor-parallel pieces written by hand (plain tensors): different on every rank from the start,
    # so never replicas; the replicated bias is compared, and a difference there is found
    pieces = [_params(r, ((3, 2),)) + [nn.Parameter(torch.ones(3))] for r in range(2)]
    for ps in pieces:
        ps[1].grad = torch.ones(3)
    rec = _simulate(pieces, [_Ctx(r, 2, kind="replicated") for r in range(2)])
    assert rec["not_replicas_from_start"] == 1 and rec["layers_compared"] == 1 and rec["diverged"] == []
    pieces[1][1].grad = torch.full((3,), 2.0)
    rec = _simulate(pieces, [_Ctx(r, 2, kind="replicated") for r in range(2)])
    assert [(e["layer"], e["part"], e["ranks"]) for e in rec["diverged"]] == [("p1", "grad", [1])]


def test_close_compares_the_last_step_and_a_rank_that_never_posts_delays_close_at_most_briefly():
    import time

    from gradwidget.collect import _replica_exchange

    twins = [_params(0), _params(0)]
    rec = _simulate(twins, [_Ctx(r, 2) for r in range(2)], steps=4)
    assert rec["steps_checked"] == 4 and rec["diverged"] == []
    # rank 1 never built its recorder: rank 0 compares nothing and says nothing, after a short wait
    from torch.distributed import HashStore

    from gradwidget.collect._replica_exchange import ReplicaExchange

    seen = []
    alone = ReplicaExchange(_Ctx(0, 2), ["p0", "p1"], twins[0], 1, lambda: None, seen.append, HashStore(), "u")
    alone.step_hook(None, (), {})
    t = time.monotonic()
    alone.close()
    assert time.monotonic() - t < _replica_exchange.CLOSE_WAIT_S + 5 and alone.record is None and seen == []
