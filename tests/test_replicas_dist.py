"""Replicas out of sync, reproduced with real DDP on 2-4 gloo processes.

Each broken pattern must be found on the step it begins, naming the rank(s) at fault (of two ranks
both, blaming neither, unless one alone is set up differently; of three or more the minority); the healthy
runs must raise nothing (DDP, FSDP2, FSDP1, HSDP and a plain model at 2 processes are checked in
test_distributed.py's ``test_two_process_run_equals_single_process``, DDP at 4 here).
"""

from __future__ import annotations

import pytest

from gradwidget import analyze
from gradwidget.storage import load_run
from test_distributed import launch  # noqa: F401 (the fixture)

pytestmark = pytest.mark.slow  # each test starts processes

LAYERS = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]


def _replicas(tmp_path, mode, pattern, world, launch, model="mlp", extra=()):  # noqa: F811
    extra = (["--pattern", pattern, "--model", model] if pattern else ["--model", model]) + list(extra)
    launch(mode, tmp_path / "run", tmp_path / "out", *extra, world=world).wait()
    run = load_run(tmp_path / "run")
    found = [r for r in analyze(run).diagnoses if r.cause == "replicas_diverged"]
    return run.meta["replicas"], found


@pytest.mark.parametrize(
    "mode,pattern,world,first,ranks",
    [
        # pytorch#104336 on CPU: moved (cast) and back after wrapping, DDP's hooks never fire again
        # (on both ranks: two that differ are both named)
        ("ddp", "to-dtype", 2, 0, [0, 1]),
        # the last rank skips step 2's all-reduce under no_sync(), the others step 3's (else one waits)
        ("ddp", "no-sync", 2, 2, [0, 1]),
        # the last rank clips its gradients after the sync from step 2 on; the other three agree
        ("ddp", "clip", 4, 2, [3]),
        # rank 0 wraps in DDP (over a group of itself), rank 1 trains the plain model
        ("ddp", "ddp-one-rank", 2, 0, [1]),
        # no wrapper on any rank, each on its own data: nothing averages the gradients
        ("plain", "own-data", 2, 0, [0, 1]),
    ],
)
def test_each_broken_pattern_is_found_on_its_first_step_naming_the_rank(
    mode,
    pattern,
    world,
    first,
    ranks,
    launch,  # noqa: F811
    tmp_path,
):
    record, found = _replicas(tmp_path, mode, pattern, world, launch)
    assert record["ranks"] == list(range(world)) and record["layers_compared"] == 6
    assert record["steps_checked"] == 4  # every recorded step, the last one compared at close
    (rec,) = found
    assert (rec.priority, rec.first_step, rec.ranks) == ("Critical", first, ranks)
    assert sorted(rec.layers) == sorted(LAYERS)  # every layer trains apart
    named = f"(rank {ranks[0]})" if len(ranks) == 1 else f"(ranks {', '.join(map(str, ranks))})"
    assert named in rec.text and f"since step {first}" in rec.text
    # the gradients differ first; the weights follow from the next step on
    parts = {(e["layer"], e["part"]): e["first_step"] for e in record["diverged"]}
    assert all(parts[(n, "grad")] == first for n in LAYERS)
    assert all(parts[(n, "weight")] == first + 1 for n in LAYERS)
    if pattern == "ddp-one-rank":
        assert rec.action.startswith("wrap the model in DistributedDataParallel on every rank, alike (rank(s) 1")
    if pattern == "own-data":
        assert rec.action.startswith("wrap the model in DistributedDataParallel (nothing averages")


@pytest.mark.parametrize("world,odd", [(2, 0), (2, 1), (3, 0), (3, 2)])
def test_a_checkpoint_loaded_on_one_rank_names_the_minority_or_both_of_two(world, odd, launch, tmp_path):  # noqa: F811
    """Step 0's weights loaded at step 2 on rank ``odd`` only (rank 0, or the last): the weights
    differ from step 2 on, the gradients never (DDP averages them). Three ranks: that rank is named,
    against the others' agreement. Two: both, and the text says neither is the majority."""
    record, found = _replicas(tmp_path, "ddp", "load", world, launch, extra=["--odd-rank", str(odd)])
    (rec,) = found
    assert {e["part"] for e in record["diverged"]} == {"weight"}
    assert all(e["first_step"] == 2 for e in record["diverged"]) and rec.first_step == 2
    if world == 2:
        assert rec.ranks == [0, 1] and "(ranks 0, 1)" in rec.text
        assert "differ from each other" in rec.evidence and "do not say which of them changed" in rec.evidence
        assert "the rank that holds the intended ones" in rec.action
    else:
        ref = 1 if odd == 0 else 0
        assert rec.ranks == [odd] and f"(rank {odd})" in rec.text
        assert f"rank {odd} differs from rank {ref}" in rec.evidence and "2 of 3 ranks agree" in rec.evidence
        assert f"copy rank {ref}'s weights" in rec.action


@pytest.mark.parametrize("pattern,world,compared", [("", 4, 6), ("ignored", 2, 5)])
def test_healthy_ddp_raises_nothing(pattern, world, compared, launch, tmp_path):  # noqa: F811
    """4 processes agree bit for bit; a parameter DDP was told to ignore differs on every rank by
    design (each trains its own) and is not compared."""
    record, found = _replicas(tmp_path, "ddp", pattern, world, launch)
    assert found == [] and record["diverged"] == []
    assert record["ranks"] == list(range(world)) and record["steps_checked"] == 4
    assert (record["layers_compared"], record["layers_not_compared"]) == (compared, 6 - compared)


def test_tensor_parallel_replicated_parts_are_still_checked(launch, tmp_path):  # noqa: F811
    """Under tensor parallelism the head is a plain parameter every rank holds whole: rank 1 clipping
    its gradient from step 2 on is found there, at step 2 (both ranks named: two have no majority); the shards (different by design) are never
    compared, the row-wise layer's replicated bias is."""
    record, found = _replicas(tmp_path, "tp", "clip", 2, launch, model="even")
    assert (record["layers_compared"], record["layers_not_compared"]) == (3, 3)
    (rec,) = found
    assert (rec.first_step, rec.ranks) == (2, [0, 1])  # two ranks: both named
    assert rec.action.startswith("give the parameters every tensor-parallel rank holds whole")
    parts = {(e["layer"], e["part"]): e["first_step"] for e in record["diverged"]}
    assert parts[("4.weight", "grad")] == parts[("4.bias", "grad")] == 2
    assert parts[("4.weight", "weight")] == 3
    assert {layer for layer, _ in parts} <= {"2.bias", "4.weight", "4.bias"}  # never a shard
