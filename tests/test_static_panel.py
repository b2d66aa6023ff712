"""The static panel: what a GradientPanel's output shows where no widget runs. It is
readable (every layer named, a step axis on round numbers, the colour scale and the marks, the
diagnoses whole, the health table), made from the run and its analysis alone (the same bytes
whatever thread finished first), and the outputs a panel was shown in before training are updated
when the training cell ends."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pytest

from gradwidget import GradientPanel
from gradwidget.panel import background
from gradwidget.panel.rendition import fmt, nice_ticks, run_rendition
from test_widget import FakeRecorder, synthetic_run


def trained(n_steps: int = 40) -> FakeRecorder:
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    for s in range(100, 100 + n_steps):
        rec.step(s)
    return rec


def gutter_names(html: str) -> list[str]:
    return re.findall(r"<text [^>]*><title>([^<]*)</title>", html)


def test_every_layer_is_named_with_the_full_name_on_hover_and_steps_on_round_numbers():
    run = synthetic_run(120)
    html = run_rendition(run)
    assert gutter_names(html) == run.layer_names
    ticks = [float(t) for t in re.findall(r'<text x="[\d.]+" y="15" [^>]*>([-\d.e+]+)</text>', html)]
    gaps = set(np.diff(ticks).tolist())
    assert len(ticks) >= 3 and len(gaps) == 1 and gaps.pop() in (10, 20, 25, 50, 100) and ticks[0] % 10 == 0, ticks
    assert "one scale for all steps" in html and "vanishing (mean|g| &lt; 1.00e-7)" in html
    assert 'class="gradwidget-panel-image"' in html and 'table class="gradwidget-health"' in html


def test_gpt2_names_keep_their_block_index():
    from gradwidget.run import LayerInfo, Run

    names = [f"transformer.h.{i}.attn.c_attn.{p}" for i in range(12) for p in ("weight", "bias")]
    run = Run([LayerInfo(n, module=n.rsplit(".", 1)[0], module_type="Conv1D", shape=(4,), numel=4) for n in names])
    for s in range(5):
        run.append(s, np.full((8, len(names)), 0.01, np.float32))
    html = run_rendition(run)
    shown = re.findall(r"</title>([^<]*)</text>", html)
    assert len(shown) == len(names) and len(set(shown)) == len(names)
    assert all(f"h.{i}" in shown[2 * i] for i in range(12)), shown[:4]


def test_the_diagnoses_are_shown_whole_with_their_evidence():
    run = synthetic_run(60)  # layer 0 vanishes
    html = run_rendition(run)
    assert '<div class="gradwidget-diagnoses"' in html, "no diagnosis in the static panel"
    text = html.split('<div class="gradwidget-diagnoses"')[1].split('<div style="font-weight:600;margin:6px')[0]
    assert "vanishing" in text and "since step" in text and "→ " in text and "<summary>evidence</summary>" in text
    assert "…" not in re.sub(r"<details.*?</details>", "", text, flags=re.S)  # nothing cut


def test_nice_ticks_and_numbers_match_the_page():
    assert nice_ticks(0, 99, 5) == [0, 20, 40, 60, 80]
    assert nice_ticks(3, 17, 4) == [5, 10, 15]
    assert [fmt(v) for v in (0, 12, 0.5, 1e-7, 12345.5, 12345.0, float("nan"))] == [
        "0",
        "12",
        "0.5",
        "1.00e-7",
        "1.23e+4",
        "12345",
        "NaN",
    ]


def test_the_static_panel_is_the_same_whichever_thread_finishes_first(monkeypatch):
    """A slow analysis (it finishes after the cell's own work) and a fast one give the same bytes:
    the end of the cell waits for the analysis of the final state and makes the panel from it."""
    fast = GradientPanel(trained())
    fast_panel = fast._repr_mimebundle_()[0]["text/html"]
    real = background.analyse

    def slow(run):
        time.sleep(0.5)
        return real(run)

    monkeypatch.setattr(background, "analyse", slow)
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=1000)
    for s in range(100, 140):
        rec.step(s)
    p._after_cell()  # the post_run_cell hook
    html = p._repr_mimebundle_()[0]["text/html"]
    assert html == fast_panel
    assert "gradwidget-diagnoses" in html and 'table class="gradwidget-health"' in html
    assert "cursor at step 139" in html


@pytest.fixture
def published(monkeypatch) -> list:
    """IPython's display and its handles' update, recorded: ("display" | "update", data, thread name)."""
    import IPython.display

    got: list = []

    class Handle:
        def update(self, data, metadata=None, raw=False):
            got.append(("update", data, threading.current_thread().name))

    def display(data, metadata=None, raw=False, display_id=None):
        got.append(("display", data, threading.current_thread().name))
        return Handle()

    monkeypatch.setattr(IPython.display, "display", display)
    return got


def test_a_panel_shown_before_training_updates_its_output_when_the_cell_ends(published):
    """``panel`` in one cell, training in the next: the output made before any step is updated
    (IPython's update_display) with the static panel of the trained run."""
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=1000)
    rec.run = synthetic_run(0)  # nothing recorded yet when the panel is shown
    p._ipython_display_()
    assert "no step recorded yet" in published[0][1]["text/html"]
    rec.run = synthetic_run(20, hist_every=5)
    for s in range(100, 120):
        rec.step(s)
    p._after_cell()
    kind, data, _ = published[-1]
    assert kind == "update" and data["application/vnd.jupyter.widget-view+json"]["model_id"] == p.model_id
    assert "cursor at step 119" in data["text/html"] and "gradwidget-diagnoses" in data["text/html"]
    n = len(published)
    p._after_cell()  # a cell that recorded nothing: no update
    assert len(published) == n


def test_training_in_a_thread_makes_the_static_panel_when_it_goes_idle():
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=50)
    th = threading.Thread(target=lambda: [rec.step(s) for s in range(100, 130)])
    th.start()
    th.join()
    deadline = time.monotonic() + 20
    while "cursor at step 129" not in p.static_html and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "cursor at step 129" in p.static_html and "gradwidget-health" in p.static_html


@pytest.mark.parametrize("n", [1, 3])
def test_a_run_of_few_steps_gets_an_axis(n):
    html = run_rendition(synthetic_run(n))
    assert re.findall(r'<text x="[\d.]+" y="15" [^>]*>(\d+)</text>', html)


def test_where_a_front_end_draws_the_panel_the_cell_end_waits_for_nothing(monkeypatch):
    """The page said it drew the panel: the end of a cell sends the final view and returns; the
    static panel of the final state follows from the analysis thread (into the widget state)."""
    real = background.analyse
    go = threading.Event()
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=1000)
    monkeypatch.setattr(background, "analyse", lambda run: (go.wait(30), real(run))[1])  # held until go
    p._on_page_message(p, {"kind": "rendered"}, [])
    for s in range(100, 120):
        rec.step(s)
    p._after_cell()  # would wait for the held analysis (30 s) if it waited
    assert p.meta["last_step"] == 119 and "cursor at step 119" not in p.static_html
    go.set()
    deadline = time.monotonic() + 30
    while "cursor at step 119" not in p.static_html and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "cursor at step 119" in p.static_html and "gradwidget-diagnoses" in p.static_html


def test_where_a_front_end_draws_the_panel_the_analysis_thread_updates_its_outputs(published):
    """JupyterLab and Notebook 7 draw the panel shown before training; they apply an update from a
    later cell to it too (their kernel connection forwards an update to every cell that showed its
    display id). The end of the training cell waits for nothing; the analysis thread updates the
    output once it has made the static panel of the final state, once a cell."""
    rec = FakeRecorder(synthetic_run(0))
    p = GradientPanel(rec, max_rate=1000)
    p._ipython_display_()
    p._on_page_message(p, {"kind": "rendered"}, [])
    rec.run = synthetic_run(20, hist_every=5)
    for s in range(100, 120):
        rec.step(s)
    p._after_cell()
    assert p._analysis.wait(60)
    updates = [(data["text/html"], thread) for kind, data, thread in published if kind == "update"]
    assert len(updates) == 1 and updates[0][1] == "gradwidget-analysis"
    assert "cursor at step 119" in updates[0][0] and "gradwidget-diagnoses" in updates[0][0]
    p._after_cell()  # a cell that recorded nothing: no update
    assert p._analysis.wait(60) and len(published) == 2


def test_a_panel_shown_again_in_the_training_cell_updates_its_first_output_too(monkeypatch):
    """``train_demo(..., recorder=panel)`` as a cell's last line shows the panel again: the output
    made before training is updated too when the cell ends."""
    import IPython.display

    updated = []

    class Handle:
        def __init__(self, k):
            self.k = k

        def update(self, data, metadata=None, raw=False):
            updated.append((self.k, data["text/html"]))

    handles = iter(range(10))
    shown = []

    def display(data, **kw):
        shown.append(data["text/html"])
        return Handle(next(handles))

    monkeypatch.setattr(IPython.display, "display", display)
    rec = FakeRecorder(synthetic_run(0))
    p = GradientPanel(rec, max_rate=1000)
    p._ipython_display_()
    rec.run = synthetic_run(20, hist_every=5)
    for s in range(100, 110):
        rec.step(s)
    p._ipython_display_()  # the training cell's last line
    p._after_cell()
    # the first output is updated; the second was made from the final state and is left alone
    assert [k for k, html in updated if "cursor at step 109" in html] == [0] and "cursor at step 109" in shown[1]


def test_an_output_made_after_training_in_the_same_cell_is_not_updated_again(monkeypatch):
    """``train(); panel`` in one cell: the output is made after training, from the final state;
    the cell's end leaves it alone (an update would render the live view a second time)."""
    import IPython.display

    updated = []

    class Handle:
        def update(self, data, metadata=None, raw=False):
            updated.append(data)

    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: Handle())
    rec = FakeRecorder(synthetic_run(20, hist_every=5))
    p = GradientPanel(rec, max_rate=1000)
    for s in range(100, 110):
        rec.step(s)
    p._ipython_display_()
    p._after_cell()
    assert updated == [] and "cursor at step 109" in p.static_html


@pytest.mark.slow
def test_an_executed_notebook_keeps_the_trained_panel_in_the_output_shown_before_training(tmp_path):
    """A real kernel (nbclient): the panel shown in one cell, trained in the next; the first cell's
    saved output, read without widget state (plain ``--to html``), is the run as it ended: its last
    step and its diagnoses."""
    import html as html_lib

    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import torch\ntorch.set_num_threads(1)\nfrom gradwidget import GradientPanel\n"
            "from gradwidget.demo import build_demo, train_demo\n"
            "model, opt, data = build_demo()\npanel = GradientPanel(model, opt)\npanel"
        ),
        nbformat.v4.new_code_cell("train_demo(60, recorder=panel, model=model, optimizer=opt, data=data)"),
        nbformat.v4.new_code_cell("print(int(panel.run.steps[-1]))\nfor d in panel.diagnoses: print(d['action'])"),
    ]
    NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    last, *actions = nb.cells[2].outputs[0]["text"].splitlines()
    shown = nb.cells[0].outputs[0]["data"]
    assert f"cursor at step {last}" in shown["text/html"] and "image/png" in shown
    assert actions and all(html_lib.escape(a) in shown["text/html"] for a in actions)
    nb.metadata.pop("widgets", None)
    page, _ = HTMLExporter().from_notebook_node(nb)
    assert f"cursor at step {last}" in page and "no step recorded yet" not in page
