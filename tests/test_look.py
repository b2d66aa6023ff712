"""The colours the page, the static copy and the figures share (``gradwidget._look``) are the
colour maps they name: viridis, rounded to 8 bits; and the live panel reaches none of them through
matplotlib."""

import subprocess
import sys

import numpy as np
from matplotlib import colormaps

from gradwidget._look import DIFF_STOPS, VIRIDIS_HEX
from gradwidget.plots import DIFF_CMAP


def test_the_shared_viridis_is_matplotlibs_rounded_to_8_bits():
    ours = np.frombuffer(bytes.fromhex(VIRIDIS_HEX), np.uint8).reshape(256, 3)
    theirs = (colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)
    assert np.array_equal(ours, theirs)


def test_the_difference_maps_stops_are_the_figures_colour_map():
    rgb = colormaps[DIFF_CMAP](np.linspace(0, 1, len(DIFF_STOPS)))[:, :3]
    assert list(DIFF_STOPS) == ["#%02x%02x%02x" % tuple(int(round(c * 255)) for c in row) for row in rgb]


def test_a_panel_that_records_and_makes_its_static_copy_loads_no_matplotlib():
    """Recording into a GradientPanel, its payloads, its analysis thread and the static copy kept
    in saved notebooks: numpy only (matplotlib is for the figures a user asks for, and for the
    image beside the widget in an exported notebook)."""
    code = """
import sys
from gradwidget import GradientPanel
from gradwidget.demo import build_demo, train_demo
model, opt, data = build_demo()
panel = GradientPanel(model, opt)
train_demo(30, recorder=panel, model=model, optimizer=opt, data=data)
panel._final_static(60)
assert "gradwidget-diagnoses" in panel.static_html, panel.static_html[:200]
print(sorted(m for m in sys.modules if m.split(".")[0] == "matplotlib"))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]
