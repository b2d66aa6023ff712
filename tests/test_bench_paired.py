"""bench/paired.py's ratios: full collections' time taken out of each group's ratio and counted,
the ratio of all CPU time kept with them in, and ``timed`` seeing a collection in its block."""

import gc

import pytest
from paired import interleaved_rounds, ratio_summary, timed


def _block(wall, cpu, gc_s=0.0, collections=0):
    return (wall, cpu, gc_s, gc_s, collections)


def test_a_full_collection_in_one_block_leaves_the_median_and_is_counted_in_all_cpu_time():
    base = [_block(1.0, 1.0) for _ in range(20)]
    rec = [_block(1.04, 1.04) for _ in range(20)]
    rec[3] = _block(1.04 + 0.15, 1.04 + 0.15, 0.15, 1)  # a 150 ms collection landed in this block
    s = ratio_summary(rec, base, group=2)
    assert s["cpu"]["median"] == pytest.approx(1.04)
    assert s["wall"]["median"] == pytest.approx(1.04)
    assert s["cpu"]["n"] == 10
    assert s["all"]["ratio"] == pytest.approx((20 * 1.04 + 0.15) / 20)
    assert s["all"]["lo"] <= s["all"]["ratio"] <= s["all"]["hi"]
    assert (s["all"]["collections"], s["all"]["base_collections"]) == (1, 0)


def test_a_bias_in_every_round_is_the_median_whatever_the_drift():
    drift = [1.0 + 0.3 * (k % 7) / 7 for k in range(40)]  # the machine's load, shared by each pair
    base = [_block(d, d) for d in drift]
    rec = [_block(1.05 * d, 1.05 * d) for d in drift]
    s = ratio_summary(rec, base)
    assert s["cpu"]["median"] == pytest.approx(1.05)
    assert s["cpu"]["lo"] == pytest.approx(1.05) and s["cpu"]["hi"] == pytest.approx(1.05)


def test_too_few_groups_is_refused():
    with pytest.raises(ValueError, match="too few"):
        ratio_summary([_block(1, 1)] * 3, [_block(1, 1)] * 3, group=2)


def test_timed_sees_the_full_collection_its_block_ran():
    block = timed(lambda: gc.collect())
    wall, cpu, gc_wall, gc_cpu, n = block(2)
    assert n == 2
    assert 0 < gc_wall <= wall and 0 <= gc_cpu <= cpu
    quiet = timed(lambda: None)(3)
    assert quiet[2:] == (0.0, 0.0, 0)


def test_rounds_alternate_the_order_of_the_variants():
    order = []
    blocks = {v: (lambda n, v=v: order.append(v) or _block(n, n)) for v in "ab"}
    out = interleaved_rounds(blocks, rounds=3, per_block=2)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert out["a"] == [_block(2, 2)] * 3
