"""The README's screenshots come from the demo, made by docs/screenshots.py: the static report (in
Chromium, offline) and the live panel (in JupyterLab). Set GRADWIDGET_UPDATE_DOCS=1 to write them
into docs/ (what the README shows); otherwise they go to a temporary folder and are only checked."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gw_browser import need_chromium

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _out(tmp_path) -> Path:
    return ROOT / "docs" if os.environ.get("GRADWIDGET_UPDATE_DOCS") == "1" else tmp_path


def _run(args, tmp_path) -> dict:
    need_chromium()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "screenshots.py"), "--out", str(_out(tmp_path)), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _png_size(path) -> tuple[int, int]:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_report_screenshot(tmp_path):
    try:
        from gradwidget.analysis import analyze  # noqa: F401
    except ImportError:
        pytest.skip("gradwidget.analysis.analyze is not in this tree yet")
    info = _run(["--only", "report", "--steps", "150"], tmp_path)
    assert info["blocked"] == [] and info["report_images"] >= 6
    w, h = _png_size(info["report_png"])
    assert w >= 1000 and h >= 1000


def test_live_panel_screenshot(tmp_path):
    try:
        from gradwidget.widget import GradientPanel  # noqa: F401
    except ImportError:
        pytest.skip("gradwidget.widget is not in this tree yet")
    if not shutil.which("jupyter", path=str(Path(sys.executable).parent)):
        pytest.skip("jupyter lab is not installed next to this Python")
    info = _run(["--only", "panel", "--steps", "150"], tmp_path)
    assert info["canvases"], "the widget drew on a canvas"
    assert max(c["painted"] for c in info["canvases"]) > 1000, info["canvases"]
    w, h = _png_size(info["panel_png"])
    assert w >= 400 and h >= 200


def test_gpt2_panel_screenshot_shows_its_diagnosis(tmp_path):
    """A diagnosis on a real model: the zoo's Hugging Face GPT-2 (tiny config) with a learning rate
    30x too high, in the live panel."""
    pytest.importorskip("transformers")
    if not shutil.which("jupyter", path=str(Path(sys.executable).parent)):
        pytest.skip("jupyter lab is not installed next to this Python")
    info = _run(["--only", "gpt2"], tmp_path)
    shot = info["gpt2"]
    assert max(c["painted"] for c in shot["canvases"]) > 1000, shot["canvases"]
    assert any(d.startswith("lr too high") for d in shot["diagnoses"]), shot["diagnoses"]
    w, h = _png_size(shot["panel_png"])
    assert w >= 400 and h >= 300


def test_exported_static_panel_screenshot(tmp_path):
    """The README's workflow executed headless and exported with plain --to html, no widget state:
    the static panel of the trained run, every layer named, its diagnosis and health table."""
    info = _run(["--only", "static"], tmp_path)
    seen = info["static"]
    assert seen["names"] == 24 and seen["rows"] == 24 and seen["diagnoses"] >= 1 and seen["image"] >= 400, seen
    w, h = _png_size(info["static_png"])
    assert w >= 600 and h >= 500
