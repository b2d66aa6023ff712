import numpy as np
import pytest

from gradwidget.rules import nearest_index, reduce_blocks
from gradwidget.run import METRICS, N_BINS, Run
from gradwidget import outputs
from gradwidget.outputs import summary, to_ascii


def filled(n=20, L=3, max_steps=None, history_capacity=2048):
    r = Run([f"l{i}" for i in range(L)], max_steps=max_steps, history_capacity=history_capacity)
    for s in range(n):
        v = np.full((len(METRICS), L), float(s), np.float32)
        r.append(s, v, {"loss": 1.0 / (s + 1)}, hist=np.full((L, N_BINS), s, np.uint32) if s % 5 == 0 else None)
    return r


def test_append_and_views():
    r = filled()
    assert r.n_steps == 20 and r.metric("grad_norm").shape == (20, 3)
    assert r.hist.shape == (4, 3, N_BINS) and r.hist_steps.tolist() == [0, 5, 10, 15]
    assert r.histogram_at("l1", 12)[0] == 10
    assert r.step_position(12) == 12 and r.step_position(1000) == 19
    with pytest.raises(ValueError, match="steps must increase"):
        r.append(3, np.zeros((len(METRICS), 3)))
    with pytest.raises(ValueError, match="shape"):
        r.append(30, np.zeros((2, 3)))
    with pytest.raises(KeyError, match="unknown metric"):
        r.metric("nope")
    with pytest.raises(KeyError, match="no layer named"):
        r.layer_index("zz")


def test_duplicate_layer_names_rejected():
    with pytest.raises(ValueError, match="unique"):
        Run(["a", "a"])


def test_slice_and_downsample():
    r = filled()
    s = r.slice(slice(5, 10), layers=["l2", "l0"])
    assert s.layer_names == ["l0", "l2"] and s.steps.tolist() == [5, 6, 7, 8, 9]
    assert s.hist_steps.tolist() == [5] and s.hist.shape == (1, 2, N_BINS)
    d = r.downsample(5)
    assert d.n_steps == 5 and d.steps.tolist() == [0, 4, 8, 12, 16]
    np.testing.assert_allclose(d.metric("grad_norm")[:, 0], [1.5, 5.5, 9.5, 13.5, 17.5])
    np.testing.assert_allclose(d.metric("max_abs")[:, 0], [3, 7, 11, 15, 19])  # max, not mean


def test_reduce_blocks_uneven_tail():
    a = np.arange(7, dtype=np.float32)
    assert reduce_blocks(a, 3).tolist() == [1.0, 4.0, 6.0]
    assert reduce_blocks(a, 3, "max").tolist() == [2.0, 5.0, 6.0]
    assert reduce_blocks(a, 3, "first").tolist() == [0.0, 3.0, 6.0]
    with pytest.raises(ValueError, match="how must be"):
        reduce_blocks(a, 3, "median")


def test_downsample_a_missing_step_does_not_blank_its_block():
    """One fold for the Run and the panel: NaN is "not recorded", so a block's mean is over the
    steps a layer did record, and a block with none stays NaN."""
    r = Run(["a", "b"])
    for s in range(4):
        v = np.full((len(METRICS), 2), float(s + 1), np.float32)
        if s == 1:
            v[:, 0] = np.nan  # layer a got no gradient at step 1
        v[:, 1] = np.nan  # layer b never got one
        v[METRICS.index("nonfinite")] = 0
        r.append(s, v)
    d = r.downsample_by(2)
    np.testing.assert_allclose(d.metric("grad_norm")[:, 0], [1.0, 3.5])
    assert np.isnan(d.metric("grad_norm")[:, 1]).all() and np.isnan(d.metric("max_abs")[:, 1]).all()
    np.testing.assert_allclose(d.metric("max_abs")[:, 0], [1.0, 4.0])


def test_nearest_index_ties_to_the_earlier_step():
    steps = np.array([0, 10, 20])
    assert [nearest_index(steps, s) for s in (-5, 4, 5, 6, 15, 99)] == [0, 0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        nearest_index(steps[:0], 3)


def test_rolling_window_memory_is_bounded():
    small = filled(200, L=4, max_steps=50, history_capacity=16)
    big = filled(5000, L=4, max_steps=50, history_capacity=16)
    assert big.n_steps == 50 and big.steps[0] == 4950
    assert big.history.n_steps <= 17
    assert big.history.steps[0] == 0  # the start of training is still summarised
    assert big.nbytes() <= small.nbytes() * 1.5
    # histograms that fell out of the window are dropped with their steps
    assert big.hist_steps.min() >= big.steps[0]


def test_to_frame_long_table():
    r = filled(4, L=2)
    df = r.to_frame()
    assert len(df) == 8 and list(df.layer.cat.categories) == ["l0", "l1"]
    assert {"step", "grad_norm", "is_vanishing", "is_exploding", "flow_intensity"} <= set(df.columns)


@pytest.mark.parametrize(
    "step,scalars,match",
    [
        ("x", {}, "step must be a whole number.*'x'"),
        (2.5, {}, "step must be a whole number.*2.5"),
        (float("nan"), {}, "step must be a whole number"),
        (30, {"loss": "x"}, "loss must be a number \\(or None\\), got 'x'"),
        (30, {"lr": [1, 2]}, "lr must be a number"),
        (30, {"accuracy": 0.9}, "unknown scalar 'accuracy'"),
    ],
)
def test_bad_step_or_scalar_is_a_clear_error_that_changes_nothing(step, scalars, match):
    r = filled(n=10, max_steps=10)  # a full window: a step that is accepted evicts the oldest
    steps, version = r.steps.tolist(), r.version
    with pytest.raises(ValueError, match=match):
        r.append(step, np.zeros((len(METRICS), 3)), scalars)
    assert r.steps.tolist() == steps and r.version == version and r.history is None


def test_whole_float_and_numpy_steps_are_accepted():
    r = Run(["a"])
    r.append(np.int64(3), np.zeros((len(METRICS), 1)), {"loss": np.float32(0.5)})
    r.append(4.0, np.zeros((len(METRICS), 1)))
    assert r.steps.tolist() == [3, 4] and r.steps.dtype == np.int64


@pytest.mark.parametrize("max_steps", [0, True, "x", 2.0])
def test_bad_max_steps_rejected(max_steps):
    with pytest.raises(ValueError, match="max_steps must be a positive int"):
        Run(["a"], max_steps=max_steps)


def test_summary_of_an_empty_run_says_nothing_was_recorded():
    from gradwidget.analysis import analyze
    from gradwidget.outputs import GradientHealth

    run = Run(["a", "b"])
    s = summary(run)
    assert s.overall_health == GradientHealth.UNKNOWN == analyze(run).overall_health
    assert s.total_steps == 0 and s.first_step is None
    assert "No steps were recorded" in s.recommendations[-1]
    text = str(s)
    assert "Unknown" in text and "healthy" not in text.lower()
    assert s.to_dict()["overall_health"] == "Unknown"


def test_repr_mentions_the_history_of_a_rolling_window():
    r = filled(n=50, max_steps=10)
    assert repr(r).endswith("steps 40..49), 2 histograms, 40 older rows in history>")
    assert "history" not in repr(filled(n=5))


@pytest.mark.parametrize("layers", [5, "abc"])
def test_layers_that_are_not_a_list_are_a_clear_error(layers):
    with pytest.raises(TypeError, match="layers must be a list of layer names"):
        Run(layers)


@pytest.mark.parametrize("width", [0, -3, "x", 2.5, True])
def test_to_ascii_refuses_a_bad_width(width):
    with pytest.raises(ValueError, match="width must be a positive number of columns"):
        to_ascii(filled(n=5), width=width)


@pytest.mark.parametrize("export", ["export_json", "export_csv"])
def test_exporting_onto_a_folder_is_a_clear_error(tmp_path, export):
    with pytest.raises(IsADirectoryError, match=f"{tmp_path} is a directory; give the file to write"):
        getattr(outputs, export)(filled(n=3), tmp_path)


@pytest.mark.parametrize("export", ["export_json", "export_csv"])
def test_a_failed_export_keeps_the_previous_file(tmp_path, monkeypatch, export):
    import gradwidget.outputs as frames_mod

    out = tmp_path / "out"
    out.write_text("an earlier export")

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(frames_mod, "frames", boom)
    monkeypatch.setattr(frames_mod.csv, "writer", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        getattr(outputs, export)(filled(n=3), out, force=True)  # replacing it, as asked
    assert out.read_text() == "an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
