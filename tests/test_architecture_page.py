"""The architecture page's table of layers is the one tests/test_layers.py enforces: the same layers
in the same order, and every module placed on the page where the test places it."""

from __future__ import annotations

import re
from pathlib import Path

from test_layers import LAYERS, PLACE

PAGE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def page_table() -> list[tuple[str, list[str]]]:
    """(layer, its modules) for each row of the page's layer table, in order."""
    rows = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 3:
            rows.append((cells[0].strip("`"), re.findall(r"`([\w.]+)`", cells[1])))
    return rows


def test_the_page_lists_the_layers_in_order():
    assert [layer for layer, _ in page_table()] == list(LAYERS)


def test_the_page_places_every_module_where_the_test_does():
    on_page = {module: layer for layer, modules in page_table() for module in modules}
    assert on_page == PLACE
