"""The notebooks' prose describes the panel as it is drawn (its defaults live in widget.py)."""

from pathlib import Path

import nbformat

from gradwidget.plots import metric_label
from gradwidget import GradientPanel

ROOT = Path(__file__).resolve().parents[1]


def markdown(name: str) -> str:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    return " ".join(c.source.replace("\n", " ") for c in nb.cells if c.cell_type == "markdown")


def test_quickstart_describes_the_panels_orientation_and_default_metric():
    text = markdown("quickstart.ipynb")
    assert "loss side at the top" not in text
    assert "input side at the top" in text  # as the front end's legend, the report and the tables
    default = GradientPanel.class_traits()["metric"].default_value
    assert f"{metric_label(default)} by default" in text
