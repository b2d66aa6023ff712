"""The screenshots in the README and docs/exporting.md, made by docs/screenshots.py and checked for
what each shows: the report (Chromium, offline), the live panel in JupyterLab (the demo, and a
GPT-2 with its diagnosis) and the static panel of exported notebooks (the demo's and the GPT-2's,
plain --to html without widget state and --to gradwidget), read from the exported page's DOM. Set
GRADWIDGET_UPDATE_DOCS=1 to write them into docs/; otherwise they go to a temporary folder and are
only checked."""

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
    info = _run(["--only", "report", "--steps", "150"], tmp_path)
    assert info["blocked"] == [] and info["report_images"] >= 6
    w, h = _png_size(info["report_png"])
    assert w >= 1000 and h >= 1000


def test_live_panel_screenshot(tmp_path):
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
    assert any(d.startswith("learning rate too high") for d in shot["diagnoses"]), shot["diagnoses"]
    w, h = _png_size(shot["panel_png"])
    assert w >= 400 and h >= 300


def test_bert_trainer_panel_screenshots_healthy_and_lr_too_high(tmp_path):
    """A small random-init BERT-style classifier trained by the Hugging Face Trainer, in the live
    panel: at a learning rate that works (99% accuracy) the verdict says healthy; at 50x it (the
    model stays at chance) the panel names the learning rate, not the data; the table's labels tell
    the layers apart (the three embeddings, the three dense layers of a block)."""
    pytest.importorskip("transformers")
    if not shutil.which("jupyter", path=str(Path(sys.executable).parent)):
        pytest.skip("jupyter lab is not installed next to this Python")
    info = _run(["--only", "bert"], tmp_path)
    good, bad = info["bert"], info["bert_lr"]
    assert good["trained"]["accuracy"] >= 0.95 and bad["trained"]["accuracy"] <= 0.65, (good["trained"], bad["trained"])
    assert good["verdict"].startswith("Healthy: nothing found in 150 recorded steps"), good["verdict"]
    assert good["diagnoses"] == [], good["diagnoses"]
    assert bad["verdict"].startswith(("Critical: learning rate too high", "High: learning rate too high")), bad[
        "verdict"
    ]
    assert not any(d.startswith("the model learns nothing") for d in bad["diagnoses"]), bad["diagnoses"]
    for shot in (good, bad):
        shown = [label for label, _ in shot["names"]]
        whole = [name for _, name in shot["names"]]
        assert len(shown) == len(set(shown)) and len(whole) == len(set(whole)), shot["names"]
        assert any("word_embeddings" in label for label in shown), shown
        w, h = _png_size(shot["panel_png"])
        assert w >= 400 and h >= 300


@pytest.fixture(scope="module")
def demo_exports(tmp_path_factory) -> dict:
    """The README's workflow executed headless and exported both ways (static.png, exported.png)."""
    return _run(["--only", "exports"], tmp_path_factory.mktemp("exports"))["exports"]


@pytest.fixture(scope="module")
def gpt2_exports(tmp_path_factory) -> dict:
    """A notebook opening the zoo's GPT-2 lr_too_high run, executed headless and exported both ways
    (static_gpt2.png, exported_gpt2.png)."""
    pytest.importorskip("transformers")
    return _run(["--only", "exports_gpt2"], tmp_path_factory.mktemp("exports_gpt2"))["exports_gpt2"]


def _check_export_shot(exports: dict, stem: str, cause: str) -> None:
    """What a photographed static panel shows, read from the exported page's DOM: the trained run
    (its last step under the cursor), every layer named beside the heatmap in model order and in the
    health table, the diagnosis whole with its action and evidence, a heatmap image tall enough for
    every row; ``exported`` (``--to gradwidget``) is the page made with the saved widget state, whose
    static copy stands in for the live widget, ``static`` (plain ``--to html``) the one without."""
    expect, shot = exports["expect"], exports[stem]
    seen, layers = shot["seen"], expect["layers"]
    last = expect["last_step"]
    assert f"steps 0–{last}" in seen["title"] and f"cursor at step {last}" in seen["title"], seen["title"]
    assert seen["names"] == layers, seen["names"]
    assert sorted(seen["rows"]) == sorted(layers), seen["rows"]
    found = [d for d in seen["diagnoses"] if d["head"].startswith(cause)]
    assert found, seen["diagnoses"]
    d = found[0]
    assert "since step" in d["head"] and d["action"].startswith("→ ") and len(d["action"]) > 30, d
    assert d["whole"] and d["evidence"], d
    image = seen["image"]
    assert image["w"] >= 600 and image["shown_w"] >= 600 and image["shown_h"] >= 12 * len(layers), image
    assert shot["widget_state"] is (stem == "exported") and seen["in_export_wrap"] is (stem == "exported")
    w, h = _png_size(shot["png"])
    assert abs(w - seen["box"]["w"]) <= 2 and abs(h - seen["box"]["h"]) <= 2 and h > image["shown_h"], (w, h, seen)


@pytest.mark.parametrize("stem", ["static", "exported"])
def test_demo_export_screenshot(demo_exports, stem):
    _check_export_shot(demo_exports, stem, "vanishing")


@pytest.mark.parametrize("stem", ["static", "exported"])
def test_gpt2_export_screenshot(gpt2_exports, stem):
    _check_export_shot(gpt2_exports, stem, "lr too high")
