"""A panel's lifetime in a notebook: re-running the cell that made it (a new model, a new optimizer,
a new panel) leaves nothing of the previous run alive, neither the model, its optimizer's state nor
the widget; a panel never keeps a model alive by itself."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("IPython")

from IPython.core.interactiveshell import InteractiveShell  # noqa: E402
from ipywidgets.widgets.widget import _instances  # noqa: E402  (ipywidgets' registry: Widget.widgets)

CELL = """
import torch
from gradwidget import GradientPanel
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
panel = GradientPanel(model, opt)
for _ in range(4):
    opt.zero_grad()
    model(torch.randn(16, 8)).pow(2).mean().backward()
    opt.step()
panel
"""


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    yield ip
    ip.run_cell("panel.close()", store_history=False)
    ip.reset()


def _alive(refs) -> list:
    gc.collect()
    return [name for name, r in refs if r() is not None]


def test_a_rerun_cell_leaves_no_model_optimizer_state_or_widget_of_the_previous_run(shell):
    registry_before = set(_instances)
    runs = []
    for _ in range(3):
        result = shell.run_cell(CELL, store_history=True, cell_id="cell-with-the-panel")
        assert result.success, result.error_in_exec
        ns = shell.user_ns
        state = next(iter(ns["opt"].state.values()))["exp_avg"]
        runs.append(
            {
                "refs": [
                    ("model", weakref.ref(ns["model"])),
                    ("optimizer", weakref.ref(ns["opt"])),
                    ("Adam state", weakref.ref(state)),
                ],
                "panel": ns["panel"],
                "widgets": {ns["panel"].model_id, ns["panel"].layout.model_id},
            }
        )
        del state, ns
    current = runs[-1]
    # the last run's panel is alive and in the registry; nothing else it made is
    assert set(_instances) - registry_before == current["widgets"]
    assert _alive(current["refs"]) == ["model", "optimizer", "Adam state"]
    for old in runs[:2]:
        assert _alive(old["refs"]) == [], "a re-run kept the previous run's model alive"
        assert old["panel"].comm is None  # closed: the page dropped its view
        assert old["panel"].run.n_steps == 4  # what it recorded stays readable
        assert not old["panel"].recorder  # and its hooks are gone with its model
    assert current["panel"].run.n_steps == 4 and current["panel"].recorder.attached
    runs.clear()


def test_a_panel_does_not_keep_its_model_alive_after_detach(shell):
    shell.run_cell(CELL, store_history=False, cell_id="another-cell")
    ns = shell.user_ns
    panel = ns["panel"]
    refs = [("model", weakref.ref(ns["model"])), ("optimizer", weakref.ref(ns["opt"]))]
    panel.detach()
    shell.run_cell("del model, opt", store_history=False)
    del ns
    assert _alive(refs) == []
    assert panel.run.n_steps == 4 and panel.report.run.n_steps == 4
