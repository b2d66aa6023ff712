"""The notebooks run top to bottom (nbclient, a real kernel), and their HTML exports show the panel
(heatmap image + health table with the model's layer names) with and without saved widget state;
the binder environment matches the package."""

import copy
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest
from exported_html import panel_images, table_layers

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: layers the last panel of each notebook must list (nn.Sequential names, input side first).
EXPECTED = {
    "quickstart": ["0.weight", "0.bias", "10.weight", "22.weight", "22.bias"],
    "diagnosing": ["0.weight", "2.weight", "20.weight", "22.bias"],
    "from_script": ["0.weight", "0.bias", "10.weight", "22.weight", "22.bias"],
}
#: a notebook must run in this many seconds on a loaded 2-core machine.
BUDGET = 240

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run every notebook once (in a copy of notebooks/) and keep the results: name -> (nb, seconds)."""
    from nbclient import NotebookClient

    work = tmp_path_factory.mktemp("notebooks")
    shutil.copytree(NOTEBOOKS, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    old = dict(os.environ)
    os.environ.update(env)  # the kernel inherits it
    out = {}
    try:
        for name in EXPECTED:
            nb = nbformat.read(work / f"{name}.ipynb", as_version=4)
            client = NotebookClient(
                nb, timeout=BUDGET, kernel_name="python3", resources={"metadata": {"path": str(work)}}
            )
            t0 = time.perf_counter()
            client.execute()
            out[name] = (nb, time.perf_counter() - t0)
            nbformat.write(nb, work / f"{name}.executed.ipynb")
    finally:
        os.environ.clear()
        os.environ.update(old)
    return out


def without_state(nb):
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    return nb


@pytest.mark.parametrize("name", list(EXPECTED))
def test_notebook_runs_top_to_bottom(executed, name):
    nb, seconds = executed[name]
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, errors
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code" and c.source.strip())
    assert seconds < BUDGET
    # the panel outputs carry the widget view and its static rendition, and the state was saved
    panels = [o for c in nb.cells for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
    assert panels, "no panel displayed"
    assert all("gradwidget-static" in o.data.get("text/html", "") for o in panels)
    assert "image/png" in panels[-1].data  # the last one, after training, has the panel image
    assert STATE in nb.metadata.get("widgets", {})


@pytest.mark.parametrize("state", [True, False], ids=["widget-state", "no-widget-state"])
@pytest.mark.parametrize("name", list(EXPECTED))
def test_gradwidget_export_shows_heatmap_and_health_table(executed, name, state):
    from gradwidget.export import export_html

    nb = executed[name][0] if state else without_state(executed[name][0])
    html = export_html(nb)
    imgs = panel_images(html)
    assert imgs, "the panel image is in the page"
    layers = table_layers(html)
    for layer in EXPECTED[name]:
        assert layer in layers
    assert (f'<script type="{WIDGET_VIEW}">' in html) == state


@pytest.mark.parametrize("name", list(EXPECTED))
def test_plain_html_export(executed, name):
    """Plain `--to html`: the static rendition shows without widget state, and does not with it
    (why `--to gradwidget` exists)."""
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter().from_notebook_node(without_state(executed[name][0]))
    assert panel_images(html) and set(EXPECTED[name]) <= set(table_layers(html))
    html, _ = HTMLExporter().from_notebook_node(executed[name][0])
    assert not panel_images(html) and f'<script type="{WIDGET_VIEW}">' in html


def test_nbconvert_execute_to_gradwidget_command(tmp_path):
    """What a user types: execute and export in one go (execution saves widget state)."""
    import subprocess
    import sys

    shutil.copy(NOTEBOOKS / "quickstart.ipynb", tmp_path)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1"
    )
    try:
        from importlib.metadata import entry_points

        to = "gradwidget" if "gradwidget" in entry_points(group="nbconvert.exporters").names else None
    except Exception:  # pragma: no cover
        to = None
    to = to or "gradwidget.export.GradwidgetHTMLExporter"  # same class, by import path, if not installed
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            to,
            "--execute",
            "--ExecutePreprocessor.timeout=240",
            "quickstart.ipynb",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    html = (tmp_path / "quickstart.html").read_text()
    assert f'<script type="{WIDGET_VIEW}">' in html and STATE in html  # widget state was saved
    assert panel_images(html) and set(EXPECTED["quickstart"]) <= set(table_layers(html))


@pytest.mark.browser
def test_exported_quickstart_offline_in_chromium(executed, tmp_path):
    from gradwidget.export import export_html
    from gw_browser import IMAGES_JS, TABLE_LAYERS_JS, offline_page

    path = tmp_path / "quickstart.html"
    export_html(executed["quickstart"][0], path)
    with offline_page() as (page, blocked):
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        imgs = [i for i in page.evaluate(IMAGES_JS) if i["cls"] == "gradwidget-panel-image"]
        layers = page.evaluate(TABLE_LAYERS_JS)
    assert imgs and all(i["complete"] and i["w"] > 200 and i["visible"] for i in imgs)
    assert set(EXPECTED["quickstart"]) <= set(layers)


def test_notebooks_are_stored_without_outputs():
    """Committed notebooks are clean: outputs come from running them, not from the repository."""
    for name in EXPECTED:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name
        assert "widgets" not in nb.metadata


def test_binder_environment_matches_the_package():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    req = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    lines = [text.split("#")[0].strip() for text in req if text.split("#")[0].strip()]
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    names = {re.split(r"[<>=!~\[ ]", text)[0].lower() for text in lines if not text.startswith("-")}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for d in deps:
        assert re.split(r"[<>=!~\[ ]", d)[0].lower() in names, f"{d} missing from binder/requirements.txt"
    torch_pin = [text for text in lines if text.startswith("torch")]
    assert torch_pin and "==" in torch_pin[0], "binder pins torch (the CPU wheel)"
    readme = (ROOT / "README.md").read_text()
    assert torch_pin[0].replace(" ", "") in readme.replace(" ", ""), "same torch as the README's install"
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK) and "pip install" in post.read_text() and "--no-deps ." in post.read_text()
