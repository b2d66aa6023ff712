"""GradientPanel in Jupyter Notebook 7 (``jupyter notebook``, the notebook package): a real server,
a real kernel, Debian's Chromium driven by Playwright; the panel must draw its canvas there too, and
the output it was shown in before training must hold the trained run when the training cell ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: lab
from lab import HEAT_PIXELS_JS, KERNEL_IDLE_JS, OUTPUT_HTML_JS, RUN_CELL_JS, VIEW, notebook_page  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = [
    """import torch
torch.set_num_threads(1)
from gradwidget import GradientPanel
from gradwidget.demo import build_demo, train_demo
model, opt, data = build_demo()
panel = GradientPanel(model, opt, max_rate=4)
panel""",
    "train_demo(40, recorder=panel, model=model, optimizer=opt, data=data);  # not shown again here",
]


def test_panel_draws_in_notebook_7(tmp_path):
    pytest.importorskip("notebook", minversion="7")
    with notebook_page(tmp_path, CELLS, app="notebook") as page:
        assert page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
        page.evaluate(RUN_CELL_JS, 0)
        page.wait_for_function(
            "() => { const r = document.querySelector('.gw-root'); return r && r.parentElement.gradwidget; }"
        )
        page.wait_for_function(KERNEL_IDLE_JS)
        page.evaluate(RUN_CELL_JS, 1)
        page.wait_for_function(f"() => {VIEW}.meta.n_steps === 40 && {VIEW}.image.canvas !== null")
        # the first cell's output gets the static panel of the trained run (an update from cell 1)
        page.wait_for_function("(i) => (" + OUTPUT_HTML_JS + ")(i).some(h => h.includes('cursor at step 39'))", arg=0)
        page.wait_for_timeout(300)
        px = page.evaluate(HEAT_PIXELS_JS)
        assert px["opaque"] == px["total"] > 1000 and px["colours"] >= 20, px
        # readable width: the panel fills the output area and the table is filled in
        width = page.evaluate(f"() => [{VIEW}.layout.width, {VIEW}.root.clientWidth]")
        assert width[0] > 600 and width[0] <= width[1], width
        assert page.locator("table.gw-health tbody tr").count() == page.evaluate(f"() => {VIEW}.meta.n_layers")
