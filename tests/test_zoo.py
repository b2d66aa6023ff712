"""The diagnosis zoo trains what it says: every FAST case's labels hold on its recorded Run (fault
layers exist, healthy losses fall, no-gradient/frozen layers got none, NaN cases recorded NaN)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import zoo  # noqa: E402 (skipped without torch)
from zoo.case import CAUSES  # noqa: E402 (skipped without torch)
from zoo.fast import first_per_cause  # noqa: E402 (skipped without torch)


@pytest.mark.slow
@pytest.mark.parametrize("case", zoo.FAST, ids=lambda c: c.id)
def test_fast_case_labels_hold(case, zoo_cache):
    run = zoo.load_or_run(case, zoo_cache)
    zoo.check(case, run, zoo_cache)


@pytest.mark.slow
def test_heldout_labels_hold(zoo_cache):
    """One held-out case per cause and one healthy, the cheapest (the whole third runs in
    bench/diagnosis.py --heldout): labels checked as for FAST, ids distinct from CASES."""
    assert not {c.id for c in zoo.HELDOUT} & {c.id for c in zoo.CASES}
    assert {c.cause for c in zoo.HELDOUT} == set(CAUSES) | {None}
    for case in first_per_cause(zoo.HELDOUT):
        try:
            run = zoo.load_or_run(case, zoo_cache)
        except zoo.PendingCase:
            continue  # gradwidget cannot record it yet (a head replaced after the optimizer)
        zoo.check(case, run, zoo_cache)


@pytest.mark.slow
def test_cache_returns_the_saved_run(zoo_cache):
    case = next(c for c in zoo.FAST if c.arch == "mlp" and c.healthy)
    first = zoo.load_or_run(case, zoo_cache)
    again = zoo.load_or_run(case, zoo_cache)
    assert again.layer_names == first.layer_names
    assert (again.scalar("loss") == first.scalar("loss")).all()
    assert again.meta["zoo_case"] == case.id


def test_fast_covers_every_cause_and_every_arch():
    assert {c.cause for c in zoo.FAST if not c.healthy} == set(CAUSES)
    assert {c.arch for c in zoo.FAST if c.healthy} == {c.arch for c in zoo.CASES}


def test_the_corpus_looks_like_the_field():
    """12+ architectures, 60+ healthy calibration runs, every cause on 4+ architectures
    (calibration and held out together) and on 2+ in calibration, a held-out share near a third."""
    every = zoo.CASES + zoo.HELDOUT
    assert len({c.arch for c in every}) >= 12
    assert sum(c.healthy for c in zoo.CASES) >= 60
    for cause in CAUSES:
        assert len({c.arch for c in every if c.cause == cause}) >= 4, cause
        assert len({c.arch for c in zoo.CASES if c.cause == cause}) >= 2, cause
    assert 0.25 <= len(zoo.HELDOUT) / len(every) <= 0.4


def test_real_data_keeps_what_is_stored_and_what_the_user_does():
    from zoo import real

    digits = real.digits_images(0)
    assert digits.x.dtype == torch.uint8 and int(digits.x.max()) == 255
    x = digits.prepare(digits.x)
    assert abs(float(x.mean())) < 1e-3 and abs(float(x.std()) - 1) < 1e-2
    assert float(digits.raw(digits.x).max()) == 255.0
    wine = real.wine(0)
    assert float(wine.raw(wine.x).max()) > 1000 and abs(float(wine.prepare(wine.x).mean())) < 1e-3
    text = real.text_lm(0)
    assert text.x.shape[1] == 32 and torch.equal(text.x[:, 1:], text.y[:, :-1])
    assert int(text.x.max()) < real.TEXT_VOCAB and len(real.reference_text()) > 100_000


def test_chance_loss_is_the_entropy_of_the_targets():
    from zoo import real
    from zoo.checks import chance_loss

    case = next(c for c in zoo.CASES if c.id == "tabular-sgd-s0-lr_too_high-wine")
    y = real.wine(0).y
    p = torch.bincount(y).double() / len(y)
    assert chance_loss(case) == pytest.approx(float(-(p * p.log()).sum()))


def test_case_ids_are_unique_and_labels_consistent():
    ids = [c.id for c in zoo.CASES]
    assert len(ids) == len(set(ids))
    for c in zoo.CASES:
        assert c.healthy == (c.mistake == zoo.HEALTHY)
        if c.cause == "nonfinite":
            assert c.mistake in ("nonfinite_loss", "nonfinite_module")
    with pytest.raises(ValueError, match="unknown cause"):
        zoo.Case("x", "mlp", "sgd", 0, "oops", "not_a_cause")


def test_run_case_refuses_what_is_not_a_zoo_case():
    with pytest.raises(TypeError, match="zoo Case"):
        zoo.run_case("mlp-sgd-s0-healthy")
    with pytest.raises(KeyError, match="no zoo recipe"):
        zoo.run_case(zoo.Case("mlp-sgd-s9-healthy", "mlp", "sgd", 9, "healthy", None))


@pytest.mark.slow
def test_diagnosis_script_prints_findings_and_totals(zoo_cache, capsys):
    import diagnosis

    rc = diagnosis.main(["--case", "mlp-sgd-s0-", "--cache-dir", str(zoo_cache)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "mlp-sgd-s0-healthy  [healthy]" in out and "mlp-sgd-s0-frozen" not in out
    for head in ("== healthy runs:", "== mistakes (", "== confusion", "== analyse time per run"):
        assert head in out
    with pytest.raises(SystemExit):
        diagnosis.main(["--case", "no-such-case", "--cache-dir", str(zoo_cache)])
    assert diagnosis.main(["--table", "--case", "mlp-sgd-s0-healthy", "--cache-dir", str(zoo_cache)]) == 0
    row = capsys.readouterr().out.splitlines()[0]
    assert row.startswith("mlp-sgd-s0-healthy") and "(falls" in row and "non-finite" not in row


@pytest.mark.slow
def test_run_case_is_deterministic():
    case = next(c for c in zoo.CASES if c.id == "mlp-adamw-s0-nonfinite_module")
    a, b = zoo.run_case(case), zoo.run_case(case)
    assert np.array_equal(a.scalar("loss"), b.scalar("loss"), equal_nan=True)
    assert np.array_equal(a.metric("grad_norm"), b.metric("grad_norm"), equal_nan=True)


def test_params_under_orders_by_prefix_and_rejects_typos():
    from zoo.mistakes import params_under
    from zoo.models import MLP

    m = MLP(depth=3)
    assert params_under(m, ["net.2", "net.0.weight"]) == ("net.2.weight", "net.2.bias", "net.0.weight")
    with pytest.raises(AttributeError):
        params_under(m, ["net.9"])


def test_dividing_schedule_turns_non_finite_at_its_step():
    from zoo.mistakes import DividingSchedule

    mod = DividingSchedule(torch.nn.ReLU(), at=3)
    x = torch.ones(2, 4)
    outs = [mod(x) for _ in range(4)]
    assert all(torch.isfinite(o).all() for o in outs[:3]) and torch.isinf(outs[3]).all()
    mod.eval()
    assert torch.isfinite(mod(x)).all()  # evaluation is not annealed


def test_detach_output_handles_tensors_and_tuples():
    from zoo.mistakes import _detached

    t = torch.ones(2, requires_grad=True) * 2
    assert not _detached(t).requires_grad
    out = _detached((t, "cache"))
    assert not out[0].requires_grad and out[1] == "cache"
    with pytest.raises(TypeError, match="cannot detach"):
        _detached({"x": t})
