"""Evidence and causes on small synthetic runs: each fact the causes reason from, alone."""

import numpy as np

from gradwidget import analyze
from gradwidget.analysis import evidence
from gradwidget.analysis.stats import trailing_median
from gradwidget.run import LayerInfo, Run
from test_analysis_stats import synth

T = 120


def test_skip_paths_are_read_from_the_module_graph():
    mods = ["a", "b", "c", "d"]
    layers = [LayerInfo(f"{m}.{p}", module=m) for m in mods for p in ("weight", "bias")]
    w = {m: 2 * i for i, m in enumerate(mods)}  # edges between the weights (biases alongside)
    chain = Run(layers, edges=[(w["a"], w["b"]), (w["b"], w["c"]), (w["c"], w["d"]), (w["a"] + 1, w["b"])])
    assert not evidence.has_skip_path(chain)
    residual = Run(layers, edges=[(w["a"], w["b"]), (w["b"], w["c"]), (w["c"], w["d"]), (w["a"], w["d"])])
    assert evidence.has_skip_path(residual)  # a feeds d directly and through b, c


def test_trailing_median_keeps_missing_steps_out_of_the_trend():
    y = np.array([[1.0, np.nan], [3, 2], [5, 4], [7, 6]])
    np.testing.assert_allclose(trailing_median(y, 2), [[1, 4], [2, 3], [4, 3], [6, 5]])


def test_a_loss_that_swings_is_a_rebound_and_batch_noise_is_not():
    rng = np.random.default_rng(0)
    noisy = 2.0 * np.exp(0.4 * rng.standard_normal(T)) * np.linspace(1, 0.5, T)  # small-batch MSE noise
    L = evidence.loss_evidence(synth(np.full((T, 2), 0.1), loss=noisy))
    assert L.logged and L.rebound_step is None
    swings = np.where(np.arange(T) % 2, 10.5, 0.01)  # 0 <-> 10.5, start 2.3
    swings[:10] = np.linspace(2.3, 1.0, 10)
    rep = analyze(synth(np.full((T, 2), 0.1), loss=swings))
    assert rep.diagnoses[0].cause == "lr_too_high" and rep.diagnoses[0].first_step <= 15


def test_gradients_summed_over_steps_are_missing_zero_grad():
    rng = np.random.default_rng(1)
    h = 0.1 * (1 + 0.3 * rng.standard_normal((T, 3)))  # one step's gradient norm per layer
    acc = np.cumsum(h, axis=0)  # never zeroed: each step adds to the last
    rep = analyze(synth(acc, loss=np.linspace(2.3, 2.0, T)))
    top = rep.diagnoses[0]
    assert top.cause == "missing_zero_grad" and top.first_step == 0 and "added to the last" in top.evidence
    healthy = analyze(synth(h, loss=np.linspace(2.3, 0.5, T)))
    assert not healthy.diagnoses and healthy.overall_health == "Healthy"


def test_a_layer_the_optimizer_never_moves_is_named():
    g = np.full((T, 3), 0.1)
    upd = np.full((T, 3), 1e-3)
    upd[:, 1] = np.nan  # the optimizer does not hold l1
    rep = analyze(synth(g, update=upd, loss=np.linspace(2.3, 0.5, T)))
    (r,) = rep.diagnoses
    assert r.cause == "not_in_optimizer" and r.layers == ["l1.weight"] and r.priority == "High"
    assert "optimizer" in r.action and rep.layers.set_index("layer").loc["l1.weight", "health"] == "Warning"


def test_a_summed_loss_is_named_and_its_symptom_folded():
    g = np.full((T, 2), 50.0)
    loss = np.full(T, 150.0)
    loss[60:] = np.inf  # and it blew up
    rep = analyze(synth(g, loss=loss))
    top = rep.diagnoses[0]
    assert top.cause == "loss_scale" and top.priority == "Critical"
    assert any(x.startswith("nonfinite") for x in top.explains) and "reduction='mean'" in top.action


def test_a_trainer_that_already_clips_is_not_told_to_clip():
    swings = np.where(np.arange(T) % 2, 10.5, 0.01)
    run = synth(np.full((T, 2), 0.1), loss=swings)
    assert "clip_grad_norm_" in analyze(run).diagnoses[0].action
    run.meta["clipped_at"] = 1.0  # written by the trainer callbacks
    action = analyze(run).diagnoses[0].action
    # no exploding gradient was seen: the action names the clipping, and claims it hides nothing
    assert "clips the gradient norm at 1" in action and "clip_grad_norm_" not in action
    assert "hides" not in action


def test_every_cause_module_is_registered_once_in_precedence_order():
    """Adding a cause is adding a module with a RULE and naming it in the registry: a module left
    out of ``RULES`` (or a rule named after another module) fails here."""
    import importlib
    import pkgutil

    from gradwidget.analysis import causes

    mods = [m.name for m in pkgutil.iter_modules(causes.__path__) if not m.name.startswith("_")]
    assert sorted(mods) == sorted(causes.CAUSES) and len(set(causes.CAUSES)) == len(causes.CAUSES)
    for name in mods:
        rule = importlib.import_module(f"gradwidget.analysis.causes.{name}").RULE
        assert rule.name == name and rule.title and rule in causes.RULES
        assert set(rule.explains) <= set(causes.CAUSES) and set(rule.contradicts) <= set(causes.CAUSES)


def test_a_too_high_rate_rules_out_a_too_low_one_and_folds_what_it_explains():
    """Found together, lr_too_high drops lr_too_low (it does not 'explain' it); the exploding
    gradients it caused fold into it, and the NaN that followed (with a traced origin) is kept
    right after it, raising it to Critical."""
    from gradwidget.analysis import causes
    from gradwidget.analysis.causes._engine import settle
    from gradwidget.origin import NonfiniteOrigin

    def d(cause, prio, step, **kw):
        return causes.Diagnosis(cause, prio, ["l0.weight"], step, f"{cause} evidence", 0.5, **kw)

    origin = NonfiniteOrigin(module="l1", module_type="Linear", step=9, phase="forward")
    found = {
        "lr_too_high": d("lr_too_high", "High", 3),
        "lr_too_low": d("lr_too_low", "Medium", 0),
        "exploding": d("exploding", "High", 5),
        "nonfinite": d("nonfinite", "Critical", 9, origin=origin),
    }
    settle(found, causes.RULES)
    assert set(found) == {"lr_too_high", "nonfinite"}
    hi = found["lr_too_high"]
    assert hi.priority == "Critical" and hi.explains == ["exploding: exploding evidence"]
    assert hi.symptom_layers == {"exploding": ["l0.weight"]}  # the summary still lists them as exploding
    assert found["nonfinite"].after == "lr_too_high" and not any("lr_too_low" in e for e in hi.explains)


def test_a_symptom_that_began_after_the_damage_is_not_raised_by_it():
    """Measured damage raises the symptoms that could have done it: one that began before the
    loss went NaN keeps its priority; one that began after it is its consequence and stays Low,
    saying why."""
    from types import SimpleNamespace

    from gradwidget.analysis import causes
    from gradwidget.analysis.causes._engine import cap_symptoms
    from gradwidget.analysis.damage import Damage

    found = {
        "lr_too_high": causes.Diagnosis("lr_too_high", "High", ["l0.weight"], 5, "lr evidence", 0.5),
        "vanishing": causes.Diagnosis("vanishing", "Medium", ["l1.weight"], 12, "vanishing evidence", 0.5),
    }
    nan = Damage("nonfinite", "the loss diverged (NaN/Inf from step 9)", True, 9)
    cap_symptoms(found, SimpleNamespace(damage=nan), causes.RULES)
    assert found["lr_too_high"].priority == "High" and found["lr_too_high"].evidence.endswith(nan.text)
    assert found["vanishing"].priority == "Low"
    assert "began at step 12, after the damage" in found["vanishing"].evidence


def test_a_diagnosis_prints_as_two_readable_lines():
    """``report.diagnoses`` in a notebook: each diagnosis its priority, title, layers (two and how
    many more), since when, and on a second line the action; not the dataclass' field dump."""
    rng = np.random.default_rng(1)
    acc = np.cumsum(0.1 * (1 + 0.3 * rng.standard_normal((T, 3))), axis=0)
    top = analyze(synth(acc, loss=np.linspace(2.3, 2.0, T))).diagnoses[0]
    text = repr(top)
    head, action = text.split("\n")
    assert head.startswith(f"<Diagnosis {top.priority}: {top.title} in ") and "since step 0" in head
    assert action == f"  action: {top.action}>" and top.action
    assert "evidence=" not in text and "symptom_layers" not in text
    assert all(n in head for n in top.layers[:2])
    if len(top.layers) > 2:
        assert f"+{len(top.layers) - 2} more" in head
    listed = repr([top, top])  # how a list of them prints
    assert listed.count("<Diagnosis") == 2
    # a whole-run cause without an action yet (the engine adds it) reads as one line
    from gradwidget.analysis.causes._base import Diagnosis

    bare = Diagnosis("loss_flat", "Low", [], None, "the loss did not move", 0.5)
    assert repr(bare) == "<Diagnosis Low: loss_flat in the whole run>"
    many = Diagnosis("vanishing", "High", ["a", "b", "c", "d"], 7, "", 0.9, title="vanishing gradients", action="x")
    assert repr(many) == "<Diagnosis High: vanishing gradients in a, b +2 more since step 7\n  action: x>"
