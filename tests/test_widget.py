"""GradientPanel, Python side: traits, throttling, decimation bounds, two-way sync, bad input."""

from __future__ import annotations

import base64
import time
import warnings

import numpy as np
import pytest
import traitlets

from gradwidget.panel.payload import MAX_HISTS
from gradwidget.rules import reduce_blocks
from gradwidget.run import METRICS, N_BINS, Run
from gradwidget import GradientPanel
from gradwidget.panel.payload import column_block
from gradwidget.panel.protocol import FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING, PANEL_MAX_COLUMNS
from gradwidget.panel.table import table_from_run

L_NAMES = ["0.weight", "0.bias", "2.weight", "2.bias"]


def synthetic_run(n_steps=50, layers=L_NAMES, hist_every=10, nonfinite_at=None, seed=0) -> Run:
    """Depth-ordered layers whose gradients shrink toward the input (layer 0 vanishes)."""
    rng = np.random.default_rng(seed)
    run = Run(layers)
    L = len(layers)
    scale = np.logspace(-9, -1, L)  # input side tiny, output side large
    for s in range(n_steps):
        g = scale * (1 + 0.1 * rng.standard_normal(L))
        vals = np.zeros((len(METRICS), L), np.float32)
        vals[METRICS.index("grad_norm")] = g * 10
        vals[METRICS.index("mean_abs")] = g
        vals[METRICS.index("max_abs")] = g * 3
        vals[METRICS.index("std")] = g
        vals[METRICS.index("weight_norm")] = 1.0
        vals[METRICS.index("update_norm")] = np.nan
        if nonfinite_at is not None and s == nonfinite_at:
            vals[METRICS.index("nonfinite")][L - 1] = 5
            vals[METRICS.index("grad_norm")][L - 1] = np.nan
        hist = None
        if hist_every and s % hist_every == 0:
            hist = np.zeros((L, N_BINS), np.uint32)
            hist[:, 20 + s % 7] = 100
        run.append(s * 2, vals, {"loss": 1.0 / (s + 1)}, hist=hist)
    return run


def f32(b) -> np.ndarray:
    return np.frombuffer(b, np.float32)


class FakeRecorder:
    """What GradientPanel needs of a Recorder: on_step, run, log, attached."""

    def __init__(self, run):
        self.run = run
        self.on_step = []
        self.attached = True
        self.logged = []

    def log(self, **kw):
        self.logged.append(kw)

    def step(self, s, value: float = 0.01):
        """A step whose every gradient statistic is ``value`` (none non-finite)."""
        vals = np.full((len(METRICS), self.run.n_layers), value, np.float32)
        vals[METRICS.index("nonfinite")] = 0
        self.run.append(s, vals)
        for fn in self.on_step:
            fn(self.run)


# --------------------------------------------------------------------------- traits
def test_traits_of_a_run():
    run = synthetic_run(50)
    p = GradientPanel(run)
    m = p.meta
    assert (m["rows"], m["cols"], m["n_steps"], m["n_layers"]) == (4, 50, 50, 4)
    assert [layer["name"] for layer in m["layers"]] == L_NAMES
    assert m["metric"] == "mean_abs" and m["metrics"] == list(METRICS)
    assert m["thresholds"] == {"vanishing": 1e-7, "exploding": 1e3}
    heat = f32(p.heat).reshape(4, 50)
    np.testing.assert_allclose(heat, run.metric("mean_abs").T)  # one column per step, depth order
    flags = np.frombuffer(p.flags, np.uint8).reshape(4, 50)
    assert (flags[0] & FLAG_VANISHING).all() and not (flags[3] & FLAG_VANISHING).any()
    np.testing.assert_array_equal(np.frombuffer(p.col_steps, np.float64), run.steps)
    np.testing.assert_allclose(f32(p.loss), run.scalar("loss"), rtol=1e-6)
    # follows the newest step; exact values there; the most flagged layer is selected
    assert p.step == 98 and p.follow
    assert p.detail_step == 98
    np.testing.assert_allclose(
        np.frombuffer(p.detail, np.float64).reshape(len(METRICS), 4), np.stack([run.metric(m)[-1] for m in METRICS])
    )
    assert p.layer == 0 and p.layer_name == "0.weight"
    assert p.hist_layer == 0
    hs = np.frombuffer(p.hist_steps, np.float64)
    np.testing.assert_array_equal(hs, run.hist_steps)
    assert np.frombuffer(p.hists, np.float64).reshape(len(hs), N_BINS).sum() == 100 * len(hs)
    assert len(p.table) == 4 and {r["layer"] for r in p.table} == set(L_NAMES)
    assert p.table[0]["health"] in ("Healthy", "Warning", "Critical", "Unknown")
    assert not p.live
    assert repr(p) == "GradientPanel(4 layers, 50 steps)"


def test_metric_change_recomputes_the_heatmap():
    run = synthetic_run(20)
    p = GradientPanel(run)
    p.metric = "max_abs"
    assert p.meta["metric"] == "max_abs"
    np.testing.assert_allclose(f32(p.heat).reshape(4, 20), run.metric("max_abs").T)
    with pytest.raises(traitlets.TraitError, match="unknown metric 'nope'"):
        p.metric = "nope"


def test_metric_without_data_says_so():
    p = GradientPanel(synthetic_run(10), metric="update_norm")
    assert p.meta["level"] == "warning" and "update_norm" in p.meta["message"]
    assert np.isnan(f32(p.heat)).all()
    assert (np.frombuffer(p.flags, np.uint8) & FLAG_NODATA).sum() == 0  # mean |g| exists: not "no gradient"


# --------------------------------------------------------------------------- decimation
def test_block_reduce():
    a = np.array([[1, np.nan], [3, np.nan], [np.inf, 2], [5, 4]], np.float32)
    np.testing.assert_allclose(reduce_blocks(a, 2, "mean"), [[2, np.nan], [5, 3]])
    np.testing.assert_allclose(reduce_blocks(a, 2, "max"), [[3, np.nan], [np.inf, 4]])
    f = np.array([[1], [4], [0], [2]], np.uint8)
    np.testing.assert_array_equal(reduce_blocks(f, 2, "or"), [[5], [2]])
    np.testing.assert_array_equal(reduce_blocks(f, 1, "or"), f)
    assert reduce_blocks(np.zeros((0, 3), np.float32), 4).shape == (0, 3)
    assert column_block(100_000, 1024) == 98 and column_block(5, 1024) == 1


@pytest.fixture(scope="module")
def long_run():
    run = synthetic_run(100_000, layers=[f"l{i}.weight" for i in range(8)], hist_every=1000, nonfinite_at=54_321)
    return run


def test_payload_is_bounded_for_100k_steps(long_run):
    p = GradientPanel(long_run, columns=2048)
    m = p.meta
    assert m["n_steps"] == 100_000
    assert m["cols"] <= 2048 and m["block"] == 49
    data_bytes = sum(
        len(getattr(p, k)) for k in ("heat", "flags", "col_steps", "loss", "detail", "hists", "hist_steps")
    )
    # heat + flags, col_steps + loss, the histograms (float64 counts) and their steps, detail
    assert data_bytes <= 8 * 2048 * 5 + 2048 * 12 + MAX_HISTS * (N_BINS + 1) * 8 + 8 * len(METRICS) * 4
    # the single non-finite step is still marked in its column, and the run's message says so
    flags = np.frombuffer(p.flags, np.uint8).reshape(8, m["cols"])
    col = np.flatnonzero(flags[7] & FLAG_NONFINITE)
    assert len(col) == 1 and col[0] == (54_321 // 49)
    assert m["level"] == "error" and "Non-finite" in m["message"]
    # the browser asks for the columns its screen shows: the payload follows
    p.columns = 300
    assert p.meta["cols"] <= 300 and len(p.heat) == 8 * p.meta["cols"] * 4
    p.columns = 10**6
    assert p.columns == PANEL_MAX_COLUMNS


def test_exploding_and_histograms_are_thinned(long_run):
    p = GradientPanel(long_run, columns=512)
    assert len(np.frombuffer(p.hist_steps, np.float64)) <= 129  # 100 histograms: all of them fit
    run = synthetic_run(30)
    run._M3[5, METRICS.index("max_abs"), 2] = 1e5
    p2 = GradientPanel(run, columns=64)
    fl = np.frombuffer(p2.flags, np.uint8).reshape(4, 30)
    assert fl[2, 5] & FLAG_EXPLODING


# --------------------------------------------------------------------------- two-way sync
def until(condition, timeout: float = 30.0) -> None:
    """Wait for ``condition()`` (a timer thread's work), failing only after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


def rate_limit_passed(panel) -> None:
    """The next step's update goes out at once: the throttle's last update is long past (a sleep
    would depend on how long an update took to build, i.e. on the machine's load)."""
    panel._sync.throttle.cancel()
    panel._sync.throttle.last = float("-inf")


def test_step_snaps_to_recorded_steps_and_sends_detail():
    run = synthetic_run(50)  # steps 0, 2, ..., 98
    p = GradientPanel(run)
    p.step = 37
    assert p.step in (36, 38) and not p.follow
    assert p.detail_step == p.step
    np.testing.assert_allclose(
        np.frombuffer(p.detail, np.float64).reshape(len(METRICS), 4),
        np.stack([run.metric(m)[p.step // 2] for m in METRICS]),
    )
    p.step = 10**9
    assert p.step == 98 and p.follow


def test_front_end_messages_move_the_kernel_state():
    """What the browser sends (an ipywidgets update message) lands in the traits."""
    run = synthetic_run(50)
    p = GradientPanel(run)
    p.set_state({"step": 20, "follow": False})
    assert p.step == 20 and p.detail_step == 20
    p.set_state({"layer": 3})
    assert p.layer == 3 and p.hist_layer == 3 and p.layer_name == "2.bias"
    p.set_state({"metric": "grad_norm"})
    assert p.meta["metric"] == "grad_norm"
    # new steps do not yank a scrubbed cursor
    p2 = GradientPanel(FakeRecorder(synthetic_run(10)), max_rate=1000)
    p2.set_state({"step": 4, "follow": False})
    rate_limit_passed(p2)
    p2.recorder.step(100)
    assert p2.step == 4 and p2.meta["last_step"] == 100
    p2.set_state({"step": 100, "follow": True})
    rate_limit_passed(p2)
    p2.recorder.step(101)
    rate_limit_passed(p2)
    p2.recorder.step(102)
    assert p2.step == 102


def test_a_page_choice_older_than_the_last_applied_is_dropped():
    """The page numbers its choices of step, follow and layer; a late one (an earlier drag position
    arriving after the last) is dropped, and the kernel says which choice it applied."""
    p = GradientPanel(synthetic_run(50))
    p.set_state({"step": 40, "follow": False, "choice": 2})
    assert (p.step, p.choice_applied) == (40, 2)
    p.set_state({"step": 10, "follow": False, "choice": 1})  # sent before choice 2, arrived after it
    assert (p.step, p.follow, p.detail_step, p.choice_applied) == (40, False, 40, 2)
    p.set_state({"layer": 2, "metric": "max_abs", "choice": 2})  # an old choice: only the cursor keys drop
    assert p.layer != 2 and p.metric == "max_abs"
    p.set_state({"layer": 2, "choice": 3})
    assert (p.layer, p.choice_applied) == (2, 3)
    p.set_state({"step": 20, "follow": False})  # a front end that does not number its choices
    assert p.step == 20
    p.step = 30  # from Python: the kernel's own write, applied as it comes
    assert p.step == 30 and p.choice_applied == 3


def test_select_layer_by_name_and_bad_layers():
    p = GradientPanel(synthetic_run(10))
    p.select("2.weight")
    assert p.layer == 2 and p.hist_layer == 2
    with pytest.raises(KeyError, match="no layer named"):
        p.select("nope")
    with pytest.raises(traitlets.TraitError, match="column index below 4"):
        p.layer = 4
    with pytest.raises(traitlets.TraitError):
        p.step = "ten"
    assert GradientPanel(synthetic_run(10), layer="0.bias").layer == 1


# --------------------------------------------------------------------------- throttling
def test_updates_are_throttled_with_a_trailing_update():
    rec = FakeRecorder(synthetic_run(5))
    p = GradientPanel(rec, max_rate=4)
    assert p.live
    start = p.push_count
    rate_limit_passed(p)  # the first step's update goes out at once
    t0 = time.monotonic()
    s = 100
    while s < 400:  # a burst of steps, however long the machine takes for them
        rec.step(s)
        s += 1
    elapsed = time.monotonic() - t0
    sent = p.push_count - start
    # at most 4 a second over the burst, +1 for the first step's update and +1 for a second begun
    assert 1 <= sent <= 2 + int(elapsed * 4), (sent, elapsed)
    assert sent < 300 // 10  # throttled: far fewer updates than steps
    until(lambda: p.meta["last_step"] == s - 1)  # the trailing update carries the last step
    assert p.step == s - 1


def test_idle_panel_sends_table_and_static_image():
    rec = FakeRecorder(synthetic_run(20))
    p = GradientPanel(rec, max_rate=20)
    assert p.static_png == ""
    for s in range(100, 110):
        rec.step(s)
    deadline = time.monotonic() + 20
    while not p.static_png and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.static_png.startswith("data:image/png;base64,")
    assert p.meta["last_step"] == 109


# --------------------------------------------------------------------------- inputs and outputs
def test_bad_inputs_raise_clear_errors(tmp_path):
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        GradientPanel(42)
    with pytest.raises(TypeError, match="no optimizer"):
        GradientPanel(synthetic_run(3), optimizer=object())
    with pytest.raises(ValueError, match="max_rate"):
        GradientPanel(synthetic_run(3), max_rate=0)
    with pytest.raises(ValueError, match="live=True follows a run directory"):
        GradientPanel(synthetic_run(3), live=True)
    from gradwidget.storage import RunFormatError

    with pytest.raises(RunFormatError):
        GradientPanel.from_run(tmp_path / "missing")
    with pytest.raises(TypeError, match="log\\(\\) needs"):
        GradientPanel(synthetic_run(3)).log(loss=1.0)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"metric": "foo"}, ValueError, r"unknown metric 'foo'; choose one of \['grad_norm'"),
        ({"columns": 0}, ValueError, "columns must be a positive int"),
        ({"columns": "wide"}, ValueError, "columns must be a positive int"),
        ({"layer": "zzz"}, ValueError, "no layer named 'zzz'; layers are '0.weight', '0.bias'"),
        ({"layer": 3.5}, TypeError, "layer must be a layer name .* got float 3.5"),
        ({"layer": 4}, ValueError, "layer 4 is out of range: -1 .* below 4"),
        ({"max_rate": -1}, ValueError, "max_rate must be a positive number"),
        ({"step": 10}, TypeError, "takes no step argument: set panel.step"),
    ],
)
def test_bad_options_are_refused_before_anything_is_attached(kwargs, error, match):
    """A failed constructor must not leave its callback on the recorder (every later step would
    warn "on_step callback failed")."""
    rec = FakeRecorder(synthetic_run(5))
    with pytest.raises(error, match=match):
        GradientPanel(rec, **kwargs)
    assert rec.on_step == []
    with pytest.raises(error, match=match):
        GradientPanel(synthetic_run(5), **kwargs)


def test_a_failed_panel_on_a_model_leaves_no_hooks():
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), 0.1)
    for kwargs in ({"metric": "foo"}, {"layer": "zzz"}, {"layer": 2}, {"layer": 3.5}):
        with pytest.raises((ValueError, TypeError)):
            GradientPanel(m, opt, **kwargs)
    assert all(not p._post_accumulate_grad_hooks and not p._backward_hooks for p in m.parameters())
    assert not m._forward_hooks and not m._forward_pre_hooks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "on_step callback failed" from a zombie recorder
        m(torch.randn(4, 3)).sum().backward()
        opt.step()
    p = GradientPanel(m, opt, layer="bias")
    m(torch.randn(4, 3)).sum().backward()
    opt.step()
    p.flush()
    assert p.layer == 1 and p.meta["n_steps"] == 1
    p.detach()


def test_a_path_or_a_number_as_source_is_explained(tmp_path):
    from gradwidget.storage import RunFormatError

    with pytest.raises(RunFormatError, match="no run at .*does not exist"):
        GradientPanel(str(tmp_path / "no" / "such" / "path"))
    with pytest.raises(TypeError, match="needs a torch.nn.Module .* got int"):
        GradientPanel(5)
    assert GradientPanel(synthetic_run(5), layer=-1).layer == GradientPanel(synthetic_run(5)).layer


def all_nonfinite_run(n_steps=6, layers=("a", "b")) -> Run:
    run = Run(list(layers))
    for s in range(n_steps):
        vals = np.full((len(METRICS), len(layers)), np.nan, np.float32)
        vals[METRICS.index("nonfinite")] = 16
        run.append(s, vals)
    return run


def test_empty_run_and_non_finite_messages():
    p = GradientPanel(Run(["a", "b"]))
    assert p.meta["n_steps"] == 0 and p.heat == b"" and "empty" in p.meta["message"]
    p2 = GradientPanel(synthetic_run(12, nonfinite_at=3))
    assert p2.meta["level"] == "error" and "3.bias" not in p2.meta["message"] and "2.bias" in p2.meta["message"]
    # every value non-finite: an error naming the layers, and the flags mark every cell
    p3 = GradientPanel(all_nonfinite_run())
    assert p3.meta["level"] == "error" and "12 layer-steps, 2 layer(s): a, b" in p3.meta["message"]
    assert (np.frombuffer(p3.flags, np.uint8) & FLAG_NONFINITE).all()
    assert p3.meta["scale"] == [0.0, 1.0]
    data, _ = p3._repr_mimebundle_()  # the static rendition copes too
    assert data["image/png"]


def test_mimebundle_carries_a_static_fallback():
    p = GradientPanel(synthetic_run(30))
    data, _ = p._repr_mimebundle_()
    assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == p.model_id
    assert data["image/png"] and "gradwidget-static" in data["text/html"]
    assert 'class="gradwidget-panel-image"' in data["text/html"]
    assert "<table" in data["text/html"]
    assert p.static_png == "data:image/png;base64," + data["image/png"]


def view_png(p, step) -> bytes:
    """The static image of the heatmap ``p`` sent, with the cursor at ``step``."""
    from gradwidget.panel.static import heat_png

    rows, cols = p.meta["rows"], p.meta["cols"]
    col = int(np.searchsorted(np.frombuffer(p.col_steps, np.float64), step, side="right")) - 1
    return heat_png(
        f32(p.heat).reshape(rows, cols), np.frombuffer(p.flags, np.uint8).reshape(rows, cols), p.meta["scale"], col
    )


def test_static_image_is_made_at_the_last_step_when_following():
    """Training under a panel, then showing it: the rate limit may still hold the last steps back;
    the mime bundle (and ``static_png``) must show the newest step, not the last one sent."""

    rec = FakeRecorder(synthetic_run(5))
    p = GradientPanel(rec, max_rate=1)
    for s in range(100, 160):
        rec.step(s)
    assert p.meta["last_step"] < 159  # held back by the rate limit
    data, _ = p._repr_mimebundle_()
    assert p.static_step == 159 and p.step == 159 and p.meta["last_step"] == 159
    assert data["image/png"] == base64.b64encode(view_png(p, 159)).decode("ascii")
    # scrubbed (not following): the image is made at the scrubbed step
    p.set_state({"step": 120, "follow": False})
    rec.step(160)
    p._repr_mimebundle_()
    assert p.static_step == 120


def test_after_a_cell_the_panel_sends_the_last_step_and_its_static_image():
    """IPython's post_run_cell: when a cell that trained finishes, the panel sends its final view
    and re-renders ``static_png`` (saved in the notebook's widget state) at the newest step."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.user_ns["rec"] = FakeRecorder(synthetic_run(5))
        shell.run_cell("from gradwidget import GradientPanel\npanel = GradientPanel(rec, max_rate=1)")
        p = shell.user_ns["panel"]
        shell.run_cell("for s in range(100, 140): rec.step(s)")
        assert p.meta["last_step"] == 139 and p.step == 139 and p.static_step == 139
        assert p.static_png == "data:image/png;base64," + base64.b64encode(view_png(p, 139)).decode("ascii")
        # the health table of that final state follows from the analysis thread (an export shows both)
        assert p._analysis.wait(30)
        assert "gradwidget-health" in p.static_html and 'data-layer="0.weight"' in p.static_html
        pushes = p.push_count
        shell.run_cell("x = 1")  # nothing recorded: nothing sent
        assert p.push_count == pushes
    finally:
        InteractiveShell.clear_instance()


def test_colour_scale_is_the_static_figures_one():
    """One definition of the colour range: the kernel sends ``plots.color_range`` of the values it
    shows; the matplotlib figures use the same function."""
    from gradwidget import plots

    run = synthetic_run(40, nonfinite_at=7)
    p = GradientPanel(run)
    for metric in ("mean_abs", "grad_norm", "max_abs"):
        p.metric = metric
        assert p.meta["scale"] == pytest.approx(list(plots.color_scale(run, metric)))
        assert p.meta["scale"] == pytest.approx(list(plots.color_range(run.metric(metric))))
    # robust: the 1st..99th percentile of log10 of the finite, non-zero cells, not min..max
    v = run.metric("max_abs")
    lv = np.log10(v[np.isfinite(v) & (v > 0)])
    assert p.meta["scale"] == pytest.approx(list(np.percentile(lv, [1, 99])))
    assert lv.min() < p.meta["scale"][0] and p.meta["scale"][1] < lv.max()


def test_rolling_window_static_image_and_panel_share_the_colour_scale():
    """A Run(max_steps=100) fed 1,000 steps: the live panel shows (and scales over) history and
    window; the PNG must use the same range and show the same steps."""
    from gradwidget import plots

    run = Run(["a", "b"], max_steps=100)
    for s in range(1000):
        v = np.full((len(METRICS), 2), 10.0 ** (-s / 100), np.float32)
        v[METRICS.index("nonfinite")] = 0
        run.append(s, v)
    p = GradientPanel(run)
    everything = np.concatenate([run.history.metric("mean_abs"), run.metric("mean_abs")])
    assert p.meta["scale"] == pytest.approx(list(plots.color_range(everything)))
    assert p.meta["scale"] == pytest.approx(list(plots.color_scale(run, "mean_abs")))
    assert plots.color_scale(run, "mean_abs") != pytest.approx(plots.color_range(run.metric("mean_abs")))
    fig = plots.flow_heatmap(run, "mean_abs")
    image = fig.axes[0].images[0]
    assert image.get_extent()[0] == pytest.approx(-0.5)  # the history's first step, as in the panel
    assert fig.axes[1].get_ylim() == pytest.approx(tuple(p.meta["scale"]))  # the colour bar


def test_every_layers_newest_histogram_is_sent():
    run = synthetic_run(45, hist_every=10)
    p = GradientPanel(run)
    assert p.meta["hist_all_step"] == int(run.hist_steps[-1]) == 80
    np.testing.assert_array_equal(np.frombuffer(p.hist_all, np.float64).reshape(4, N_BINS), run.hist[-1])
    assert GradientPanel(synthetic_run(5, hist_every=0)).hist_all == b""


def test_a_page_message_waits_for_an_update_in_flight_and_is_not_written_over():
    """An update on a training thread reads the selection and writes it back under the panel's
    lock; a page message that landed in between (a click on a layer) was written over by it (the
    two-way test below failed 5 times in 190). The message now waits for the update to end."""
    import threading

    p = GradientPanel(synthetic_run(20, hist_every=5))
    p.set_state({"layer": 1})
    holding, done = threading.Event(), threading.Event()

    def update_in_flight():  # what an update does (LiveSync.push): read the layer, work, write it back, all locked
        with p._lock:
            layer = p.layer
            holding.set()
            time.sleep(0.2)
            p._set({"layer": layer})
        done.set()

    th = threading.Thread(target=update_in_flight)
    th.start()
    holding.wait()
    p.set_state({"layer": 2})  # the page's click, while the update holds the lock
    assert done.is_set()  # it waited for the update
    assert p.layer == 2 and p.hist_layer == 2  # and stands, with its detail
    th.join()


def test_training_in_a_thread_keeps_two_way_sync():
    """What the docstring advises: with training in a thread the kernel handles the browser's
    messages while steps arrive (set_state is what ipywidgets calls for a browser message)."""
    import threading

    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=20)
    stop = threading.Event()

    def train():
        s = 100
        while not stop.is_set():
            rec.step(s)
            s += 1
            time.sleep(0.002)

    th = threading.Thread(target=train)
    th.start()
    try:
        time.sleep(0.2)
        p.set_state({"layer": 2})
        assert p.layer == 2 and p.hist_layer == 2
        p.set_state({"step": 10, "follow": False})
        assert p.step == 10 and p.detail_step == 10 and not p.follow
        n = p.meta["n_steps"]
        until(lambda: p.meta["n_steps"] > n)
        assert p.step == 10  # steps keep coming; the scrub stands
    finally:
        stop.set()
        th.join()


def test_table_without_the_analysis_shows_statistics_and_marks_ungraded():
    """The fallback rows (the analysis failed) carry the run's numbers and flag marks, and no grade:
    grades come from the analysis engine alone (tests/test_panel_table.py)."""
    rows = table_from_run(synthetic_run(20, nonfinite_at=4))
    by = {r["layer"]: r for r in rows}
    assert {r["health"] for r in rows} == {"Unknown"}
    assert "vanishing" in by["0.weight"]["flags"] and "nonfinite" in by["2.bias"]["flags"]
    assert by["2.bias"]["nonfinite_total"] > 0 and by["2.weight"]["flags"] == ""


def test_infinite_table_values_travel_as_infinity_not_as_1e308():
    """JSON has no infinity: +-Inf become "Infinity"/"-Infinity" (the front end shows "Inf"), NaN
    is missing (null); the rows stay valid JSON."""
    import json

    run = Run(["a", "b"])
    v = np.full((len(METRICS), 2), 0.01, np.float32)
    v[METRICS.index("max_abs"), 0] = np.inf
    v[METRICS.index("nonfinite")] = [3, 0]
    run.append(0, v)
    rows = {r["layer"]: r for r in table_from_run(run)}
    assert rows["a"]["max_abs_max"] == "Infinity" and rows["b"]["max_abs_max"] == pytest.approx(0.01)
    json.loads(json.dumps(rows, allow_nan=False))
    from gradwidget.jsonsafe import jsonable as _jsonable

    assert [_jsonable(x) for x in (np.float32(-np.inf), float("nan"), 2.5)] == ["-Infinity", None, 2.5]
    p = GradientPanel(run)
    assert any("Infinity" in json.dumps(r, allow_nan=False) for r in p.table)


def test_report_is_the_analysis():
    pytest.importorskip("gradwidget.analysis")
    import gradwidget

    run = synthetic_run(30)
    p = GradientPanel(run)
    rep = p.report
    assert list(rep.layers["layer"]) == L_NAMES
    assert rep is p.report  # cached while the run is unchanged
    assert {r["layer"]: r["health"] for r in p.table} == dict(zip(rep.layers["layer"], rep.layers["health"]))
    assert type(rep) is type(gradwidget.analyze(run))


# --------------------------------------------------------------------------- real training
torch = pytest.importorskip("torch")


def test_panel_on_a_model_updates_while_training():
    from gradwidget.demo import build_demo, train_demo

    model, opt, data = build_demo(depth=4, width=16)
    p = GradientPanel(model, opt, max_rate=50)
    assert p.run is None and "No step recorded yet" in p.meta["message"]
    assert repr(p) == "GradientPanel(no step recorded yet)"
    seen = []
    train_demo(
        40,
        recorder=p,
        model=model,
        optimizer=opt,
        data=data,
        # each step's update goes out (the rate limit is the throttle tests' subject, not this one's)
        callback=lambda i, loss: (rate_limit_passed(p), seen.append(p.meta["n_steps"])),
    )
    assert p.live and p.push_count >= 3
    assert len(set(seen)) >= 3  # the browser saw the run grow during training
    until(lambda: p.meta["n_steps"] == 40)
    assert p.step == int(p.run.steps[-1])
    assert np.isfinite(np.frombuffer(p.loss, np.float32)).all()
    p.detach()
    assert not p.live and not p.recorder.attached


def test_static_image_after_training_a_model_is_made_at_the_last_step():
    from gradwidget.demo import build_demo, train_demo

    n = 30
    model, opt, data = build_demo(depth=3, width=8)
    p = GradientPanel(model, opt, max_rate=1)
    train_demo(n, recorder=p, model=model, optimizer=opt, data=data)
    p._repr_mimebundle_()
    assert p.run.n_steps == n and p.static_step == int(p.run.steps[-1]) == n - 1
    p.detach()


def test_from_run_follows_a_directory(tmp_path):
    from gradwidget.collect.torch import Recorder
    from gradwidget.demo import build_demo

    model, opt, data = build_demo(depth=3, width=8)
    rec = Recorder(model, opt, log_dir=tmp_path / "run")

    def train(n):
        for _ in range(n):
            x, y = next(data)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

    train(5)
    p = GradientPanel.from_run(tmp_path / "run", live=True, poll_interval=0.05, max_rate=100)
    assert p.live and p.meta["n_steps"] == 5
    train(7)
    deadline = time.monotonic() + 10
    while p.meta["n_steps"] < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.meta["n_steps"] == 12
    p.stop()
    assert not p.live
    rec.detach()


def test_a_run_without_layers_shows_the_empty_message():
    run = Run([])
    for s in range(5):
        run.append(s, np.zeros((len(METRICS), 0), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no analysis failure, no failed static rendition
        p = GradientPanel(run)
        data, _ = p._repr_mimebundle_()
    assert p.meta["level"] == "info" and "no layers" in p.meta["message"]
    assert p.layer == -1 and p.meta["rows"] == 0 and p.table == []
    assert "gradwidget-static" in data["text/html"] and "no layers" in data["text/html"]  # the message, no empty image


# --------------------------------------------------------------------------- off the training thread
def test_diagnoses_are_the_reports_top_diagnoses():
    pytest.importorskip("gradwidget.analysis")
    run = synthetic_run(40)
    p = GradientPanel(run)
    recs = p.report.diagnoses
    assert recs, "the synthetic run's vanishing layer should be diagnosed"
    assert 1 <= len(p.diagnoses) <= min(5, len(recs))
    d = p.diagnoses[0]
    assert d["cause"] == recs[0].cause
    assert d["text"] == recs[0].text and d["action"] == recs[0].action
    assert d["layers"] == list(recs[0].layers)[:20]
    assert d["layer_index"] == run.layer_index(recs[0].layers[0])
    assert d["first_step"] == getattr(recs[0], "first_step", None)
    # the verdict line names the top diagnosis by its title, where and since when
    assert d["title"] == recs[0].title
    assert p.verdict.startswith(f"{recs[0].priority}: {recs[0].title} in {recs[0].layers[0]}")


def test_the_top_diagnosis_first_layer_is_selected_until_a_user_selects_one():
    pytest.importorskip("gradwidget.analysis")
    run = synthetic_run(40)
    p = GradientPanel(run)
    assert p.diagnoses and p.layer == p.diagnoses[0]["layer_index"] >= 0
    assert p.hist_layer == p.layer  # its histograms came with it
    p.select("2.bias")
    run.append(int(run.steps[-1]) + 1, np.stack([run.metric(m)[-1] for m in METRICS]))
    p.flush()
    assert p.layer_name == "2.bias"  # the new analysis left the user's choice alone


def test_a_run_with_nothing_found_says_so_in_its_verdict():
    from gradwidget.panel.table import verdict_line

    assert verdict_line([], 315) == "Healthy: nothing found in 315 recorded steps"
    d = {"priority": "High", "title": "learning rate too high", "layers": ["fc.weight"], "first_step": 12}
    assert verdict_line([d, d], 40) == "High: learning rate too high in fc.weight since step 12 (+1 more below)"
    assert GradientPanel(Run(["a"])).verdict == ""  # no step: nothing analysed, no verdict
    said = verdict_line([], 315, "cross entropy over 10 classes")
    assert said == "Healthy: nothing found in 315 recorded steps · the loss read as cross entropy over 10 classes"


def test_the_analysis_runs_on_a_copy_off_the_training_thread(monkeypatch):
    """The recorder's thread only copies the run (when the analysis is due); analyze() runs on the
    panel's analysis thread over that copy, so appends cannot tear it."""
    import threading

    import gradwidget.panel.background as W

    seen = []
    real = W.analyse

    def spy(run):
        seen.append((threading.current_thread().name, run))
        return real(run)

    monkeypatch.setattr(W, "analyse", spy)
    rec = FakeRecorder(synthetic_run(20))
    p = GradientPanel(rec, max_rate=50)
    seen.clear()
    for s in range(100, 160):
        rec.step(s)
    p._analysis.submit(rec.run, False, force=True)
    assert p._analysis.wait(30)
    assert seen and all(name == "gradwidget-analysis" for name, _ in seen)
    assert all(r is not rec.run for _, r in seen)
    assert seen[-1][1].n_steps == rec.run.n_steps and seen[-1][1].version == rec.run.version
    assert {r["layer"] for r in p.table} == set(L_NAMES)


def test_a_big_run_paints_first_and_its_table_follows():
    from gradwidget.panel.background import SYNC_ANALYSIS_CELLS

    names = [f"l{i}.weight" for i in range(100)]
    run = synthetic_run(SYNC_ANALYSIS_CELLS // 100 + 10, layers=names, hist_every=0)
    p = GradientPanel(run)
    assert p.meta["n_steps"] == run.n_steps and p.heat  # the heatmap is there at once
    assert p._analysis.wait(120)
    assert len(p.table) == 100 and p.static_html


def test_after_a_cell_no_figure_is_drawn(monkeypatch):
    """The post-cell hook sends the final view and a static image made from the heatmap arrays:
    matplotlib's panel figure is never drawn on the way."""
    from IPython.core.interactiveshell import InteractiveShell

    from gradwidget import plots

    def boom(*a, **k):
        raise AssertionError("panel_figure drawn after a cell")

    monkeypatch.setattr(plots, "panel_figure", boom)
    shell = InteractiveShell.instance()
    try:
        shell.user_ns["rec"] = FakeRecorder(synthetic_run(5))
        shell.run_cell("from gradwidget import GradientPanel\npanel = GradientPanel(rec, max_rate=1)")
        p = shell.user_ns["panel"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            shell.run_cell("for s in range(100, 140): rec.step(s)")
        assert p.static_step == 139 and p.static_png.startswith("data:image/png;base64,")
    finally:
        InteractiveShell.clear_instance()


def test_while_training_only_new_columns_travel():
    """A live update after new steps sends the columns from the first one that changed (a custom
    message the page splices in), not the whole heatmap; the traits here hold the whole heatmap;
    the next full update (after the cell, or a metric change) sends everything."""
    rec = FakeRecorder(synthetic_run(50))
    p = GradientPanel(rec, max_rate=1000)
    sent = []
    real_send = p.send
    p.send = lambda content, buffers=None: (sent.append((content, buffers)), real_send(content, buffers))
    seq = p.meta["seq"]
    rate_limit_passed(p)
    rec.step(200)
    assert len(sent) == 1
    msg, bufs = sent[0]
    assert msg["kind"] == "patch" and msg["base"] == seq and msg["start"] == 50
    assert msg["values"]["meta"]["seq"] == seq + 1 and msg["values"]["meta"]["cols"] == 51
    by = dict(zip(msg["buffers"], bufs))
    assert len(by["heat"]) == 4 * 1 * 4 and len(by["flags"]) == 4 and len(by["col_steps"]) == 8
    np.testing.assert_array_equal(f32(by["heat"]), rec.run.metric("mean_abs")[-1])
    # the traits hold the whole heatmap (a re-opened page asks the kernel for it)
    np.testing.assert_allclose(f32(p.heat).reshape(4, 51), rec.run.metric("mean_abs").T)
    assert p.meta["seq"] == seq + 1 and p.meta["last_step"] == 200
    # a changed view is a full update again
    n = len(sent)
    p.metric = "grad_norm"
    assert len(sent) == n and p.meta["metric"] == "grad_norm" and p.meta["seq"] == seq + 2
    # the page missed an update: it asks for everything
    p._on_page_message(p, {"kind": "resend"}, [])
    assert p.meta["seq"] == seq + 3


def test_table_updates_carry_the_rows_that_changed():
    from gradwidget.panel.table import changed_rows

    old = [{"index": 0, "v": 1.0}, {"index": 1, "v": 2.0}]
    assert changed_rows(old, [{"index": 0, "v": 1.0}, {"index": 1, "v": 3.0}]) == [1]
    assert changed_rows(old, old) == []
    assert changed_rows(old, old[:1]) is None and changed_rows([], old) is None
    assert changed_rows(old, [{"index": 1, "v": 2.0}, {"index": 0, "v": 1.0}]) is None


def test_panel_flags_follow_the_runs_flag_rules():
    """The heatmap's flag bits are the Run's vanishing()/exploding()/nonfinite(), not a copy of them."""
    from gradwidget.panel.payload import cell_flags

    run = synthetic_run(n_steps=30, nonfinite_at=12)
    f = cell_flags(run, run.metric("mean_abs"), run.metric("max_abs"), run.metric("nonfinite"))
    assert ((f & FLAG_VANISHING) > 0).any()
    np.testing.assert_array_equal((f & FLAG_VANISHING) > 0, run.vanishing())
    np.testing.assert_array_equal((f & FLAG_NONFINITE) > 0, run.nonfinite())
    np.testing.assert_array_equal((f & (FLAG_EXPLODING | FLAG_NONFINITE)) > 0, run.exploding())


def test_the_histogram_sent_for_a_step_is_the_one_at_or_before_it():
    """Past MAX_HISTS histograms a layer's are thinned; the one at or before the cursor's step is
    always among them (never only a later one: cursor 8 showed the histogram of step 10)."""
    from gradwidget.panel import payload as P

    run = synthetic_run(1200, hist_every=3)
    for step in (16, 400, 1202, 2396):
        _, arrays = P.detail_view(run, step, 1)
        hs = arrays["hist_steps"]
        assert len(hs) <= P.MAX_HISTS + 1
        assert run.hist_steps[run.hist_steps <= step][-1] in hs.tolist(), step


def test_following_sent_with_a_stale_step_follows_the_newest_step():
    """End pressed while a cell trains: the page sends follow with the newest step *it* had; the
    kernel reads it when the cell ends, steps later. Following wins (it was the user's last action)."""
    rec = FakeRecorder(synthetic_run(10))
    p = GradientPanel(rec, max_rate=1000)
    p.set_state({"step": 4, "follow": False})
    for s in range(100, 130):
        rec.step(s)
    p.set_state({"step": 110, "follow": True})  # stale: the run is at 129 now
    assert p.follow and p.step == 129
    p.set_state({"step": 110, "follow": False})  # a scrub to 110 stays there
    assert not p.follow and p.step == 110


def test_the_panels_time_on_the_training_thread_is_counted():
    rec = FakeRecorder(synthetic_run(10))
    p = GradientPanel(rec, max_rate=1000)
    assert p.training_thread_s == 0.0
    for s in range(100, 105):
        rec.step(s)
    assert p.training_thread_s > 0.0


def test_the_throttle_keeps_updates_to_a_twentieth_of_the_training_thread():
    from gradwidget.panel.schedule import TRAINING_SHARE, Throttle

    th = Throttle(4.0, lambda: None, lambda: None)
    th.cost = 0.001
    assert th.interval() == 0.25  # cheap updates: the rate limit
    th.cost = 0.1
    assert th.interval() == pytest.approx(0.1 / TRAINING_SHARE) and TRAINING_SHARE <= 0.05
