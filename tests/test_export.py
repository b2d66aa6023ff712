"""The nbconvert exporter: a widget output's static rendition survives HTML export, offline, with
and without saved widget state; and the live widget replaces it where the widget manager loads."""

import base64
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbconvert import HTMLExporter
from nbformat.v4 import new_code_cell, new_notebook, new_output

from gradwidget import plots
from gradwidget.export import WIDGET_VIEW, GradwidgetHTMLExporter, StaticFallbackPreprocessor, export_html
from gradwidget.report import health_table_html, static_fallback_html
from gw_browser import IMAGES_JS, TABLE_LAYERS_JS, offline_page
from test_plots import LAYERS, pathological_run
from exported_html import panel_images, table_layers

ROOT = Path(__file__).resolve().parents[1]
STATE = "application/vnd.jupyter.widget-state+json"
MODEL_ID = "5d0b7c2e8a7f4c1f9d3e2b1a0c9d8e7f"


class TableOnly:
    """Enough of an analysis Report for the health table: a per-layer frame."""

    def __init__(self, run):
        self.layers = pd.DataFrame({"layer": run.layer_names, "health": ["Healthy"] * run.n_layers})


def panel_output(run):
    png = plots.figure_to_png(plots.panel_figure(run), dpi=50)
    return new_output(
        "display_data",
        data={
            "text/plain": "GradientPanel(5 layers)",
            "image/png": base64.b64encode(png).decode(),
            "text/html": static_fallback_html(png, health_table_html(TableOnly(run))),
            WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": MODEL_ID},
        },
    )


def notebook(with_state: bool):
    run = pathological_run(20)
    nb = new_notebook(
        cells=[
            new_code_cell("panel = GradientPanel(model)\npanel", outputs=[panel_output(run)]),
            new_code_cell("1 + 1", outputs=[new_output("execute_result", data={"text/plain": "2"}, execution_count=2)]),
        ]
    )
    if with_state:
        nb.metadata["widgets"] = {
            STATE: {
                "version_major": 2,
                "version_minor": 0,
                "state": {
                    MODEL_ID: {
                        "model_name": "AnyModel",
                        "model_module": "anywidget",
                        "model_module_version": "~0.9.*",
                        "state": {"_anywidget_id": "gradwidget.widget.GradientPanel"},
                    }
                },
            }
        }
    return nb


def test_plain_html_export_loses_the_panel_once_widget_state_is_saved():
    """The nbconvert behaviour the exporter exists for (measured with nbconvert 7.17)."""
    without, _ = HTMLExporter().from_notebook_node(notebook(False))
    with_state, _ = HTMLExporter().from_notebook_node(notebook(True))
    assert len(panel_images(without)) == 1 and table_layers(without) == list(LAYERS)
    assert panel_images(with_state) == [] and table_layers(with_state) == []
    assert f'<script type="{WIDGET_VIEW}">' in with_state and "html-manager" in with_state


@pytest.mark.parametrize("with_state", [False, True], ids=["no-widget-state", "widget-state"])
def test_gradwidget_exporter_keeps_the_static_rendition(with_state):
    html = export_html(notebook(with_state))
    imgs = panel_images(html)
    assert len(imgs) == 1 and base64.b64decode(imgs[0])[:4] == b"\x89PNG"
    assert table_layers(html) == list(LAYERS)
    assert (f'<script type="{WIDGET_VIEW}">' in html) == with_state  # the live widget is kept where it can load
    assert ">2</pre>" in html  # other outputs untouched


def test_widget_outputs_without_a_static_rendition_are_left_alone():
    nb = notebook(True)
    nb.cells[0].outputs = [
        new_output(
            "display_data",
            data={
                "text/plain": "IntSlider(value=3)",
                WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": MODEL_ID},
            },
        )
    ]
    nb2, _ = StaticFallbackPreprocessor().preprocess(nb, {})
    assert set(nb2.cells[0].outputs[0].data) == {"text/plain", WIDGET_VIEW}
    assert "gradwidget-export" not in export_html(nb)


def test_a_foreign_widget_with_an_image_gets_the_same_treatment():
    nb = notebook(True)
    data = nb.cells[0].outputs[0].data
    data["text/html"] = "<b>other widget</b>"
    html = export_html(nb)
    assert len(panel_images(html)) == 1 and "<b>other widget</b>" in html


def stale_notebook():
    """A panel displayed before training: its output says "no step recorded yet", while the saved
    widget state holds the final image and health table (``static_png``, ``static_html``)."""
    run = pathological_run(20)
    png = plots.figure_to_png(plots.panel_figure(run), dpi=50)
    nb = notebook(True)
    nb.cells[0].outputs = [
        new_output(
            "display_data",
            data={
                "text/plain": "GradientPanel(no step recorded yet)",
                "text/html": '<div class="gradwidget-static"><p>GradientPanel: no step recorded yet</p></div>',
                WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": MODEL_ID},
            },
        )
    ]
    state = nb.metadata["widgets"][STATE]["state"][MODEL_ID]["state"]
    state["static_png"] = "data:image/png;base64," + base64.b64encode(png).decode()
    state["static_html"] = health_table_html(TableOnly(run))
    return nb, png


def test_the_saved_widget_states_latest_rendition_wins_over_the_stale_output():
    nb, png = stale_notebook()
    html = export_html(nb)
    assert [base64.b64decode(i) for i in panel_images(html)] == [png]
    assert table_layers(html) == list(LAYERS)
    assert "GradientPanel: no step recorded yet</p>" not in html


def test_static_only_uses_the_saved_widget_states_rendition_too():
    nb, png = stale_notebook()
    html, _ = HTMLExporter(preprocessors=["gradwidget.export.StaticOnly"]).from_notebook_node(nb)
    assert [base64.b64decode(i) for i in panel_images(html)] == [png]
    assert f'<script type="{WIDGET_VIEW}">' not in html


README_CELLS = [
    """import torch
from gradwidget import GradientPanel
m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(m.parameters(), 0.1)
panel = GradientPanel(m, opt)
panel""",
    """for i in range(30):
    opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()""",
]


def test_readme_workflow_executed_by_nbclient_exports_the_trained_panel(monkeypatch):
    """Panel shown in one cell, training in the next (the README's workflow): the export shows the
    panel after training, with its health table, although the output was made before any step."""
    from nbclient import NotebookClient

    nb = new_notebook(cells=[new_code_cell(c) for c in README_CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    html = export_html(nb)
    assert len(panel_images(html)) == 1, "the panel image is missing from the export"
    assert "GradientPanel: no step recorded yet</p>" not in html  # the stale output's note
    assert table_layers(html) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    # the output itself was updated when the training cell ended: plain --to html without the
    # saved widget state (GitHub, a notebook saved by a front end that drops it) shows the trained panel
    nb.metadata.pop("widgets", None)
    plain, _ = HTMLExporter().from_notebook_node(nb)
    assert len(panel_images(plain)) == 1 and "cursor at step 29" in plain
    assert table_layers(plain) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def _fake_install(tmp_path) -> dict:
    """Environment in which importlib.metadata sees gradwidget's nbconvert entry point exactly as
    pyproject.toml declares it (as `pip install .` would register it), plus the source tree."""
    env = dict(os.environ)
    try:
        from importlib.metadata import entry_points

        if "gradwidget" in entry_points(group="nbconvert.exporters").names:
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
            return env
    except Exception:  # pragma: no cover - metadata backends vary
        pass
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["nbconvert.exporters"]
    dist = tmp_path / "site" / "gradwidget_nbconvert-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gradwidget-nbconvert\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[nbconvert.exporters]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "site"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("with_state", [False, True], ids=["no-widget-state", "widget-state"])
def test_jupyter_nbconvert_to_gradwidget_command(tmp_path, with_state):
    nbformat.write(notebook(with_state), tmp_path / "nb.ipynb")
    cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "gradwidget", "nb.ipynb"]
    p = subprocess.run(cmd, cwd=tmp_path, env=_fake_install(tmp_path), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "nb.html").read_text()
    assert len(panel_images(html)) == 1 and table_layers(html) == list(LAYERS)


def test_static_only_preprocessor_with_plain_html(tmp_path):
    nbformat.write(notebook(True), tmp_path / "nb.ipynb")
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "nbconvert",
        "--to",
        "html",
        "--HTMLExporter.preprocessors=gradwidget.export.StaticOnly",
        "nb.ipynb",
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "nb.html").read_text()
    assert len(panel_images(html)) == 1 and table_layers(html) == list(LAYERS)
    assert f'<script type="{WIDGET_VIEW}">' not in html


def test_exporter_is_an_html_exporter_with_its_template():
    e = GradwidgetHTMLExporter()
    assert isinstance(e, HTMLExporter) and e.template_name == "gradwidget" and e.file_extension == ".html"
    assert any(p.endswith(os.path.join("nbconvert", "gradwidget")) for p in e.template_paths)


#: put an element into the live widget's container, as html-manager would.
INSERT_LIVE_JS = """([cls, height, text]) => {
  const live = document.querySelector('.gradwidget-export').nextElementSibling;
  const el = document.createElement('div');
  el.className = cls; el.style.height = height + 'px'; el.textContent = text;
  live.insertBefore(el, live.firstChild);
}"""
FALLBACK_DISPLAY_JS = "() => getComputedStyle(document.querySelector('.gradwidget-export')).display"


@pytest.mark.browser
@pytest.mark.parametrize("with_state", [False, True], ids=["no-widget-state", "widget-state"])
def test_exported_panel_is_visible_offline_in_chromium(tmp_path, with_state):
    path = tmp_path / "nb.html"
    export_html(notebook(with_state), path)
    with offline_page() as (page, blocked):
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        page.wait_for_timeout(300)
        imgs = [i for i in page.evaluate(IMAGES_JS) if i["cls"] == "gradwidget-panel-image"]
        layers = page.evaluate(TABLE_LAYERS_JS)
        if with_state:
            # the static copy gets the output's full width (it does not share the row with the
            # empty live-widget container)
            ratio = page.evaluate("""() => { const f = document.querySelector('.gradwidget-export');
              return f.getBoundingClientRect().width / f.closest('.jp-OutputArea-child').getBoundingClientRect().width; }""")
            assert ratio > 0.8, ratio
            # where html-manager loads but the widget fails, it shows an error: the static copy stays
            page.evaluate(INSERT_LIVE_JS, ["jupyter-widgets-error-widget", 60, "Error"])
            page.wait_for_timeout(200)
            assert page.evaluate(FALLBACK_DISPLAY_JS) != "none"
            page.evaluate("() => document.querySelector('.jupyter-widgets-error-widget').remove()")
            # where html-manager loads and draws the widget into the live container, the static
            # copy makes way for it
            page.evaluate(INSERT_LIVE_JS, ["widget-subarea", 200, "live panel"])
            page.wait_for_function(f"() => ({FALLBACK_DISPLAY_JS})() === 'none'", timeout=5000)
    assert len(imgs) == 1 and imgs[0]["complete"] and imgs[0]["w"] > 200 and imgs[0]["visible"]
    assert layers == list(LAYERS)
    if with_state:
        assert any("html-manager" in u for u in blocked), "the widget manager was wanted and refused"


#: widget state and an output made to run script where the page shows them: the checks below find
#: none of these marks set
HOSTILE = (
    '<svg onload="window.__pwned=1"><rect/></svg>'
    '<script>window.__pwned=2</script><img src=x onerror="window.__pwned=3">'
    '<a href="javascript:window.__pwned=4">x</a><iframe srcdoc="<script>parent.__pwned=5</script>"></iframe>'
    '<img class="gradwidget-panel-image" src="data:image/png;base64,AAAA&quot; onerror=&quot;window.__pwned=8">'
)


def with_hostile(html: str, mark: str = "__pwned") -> str:
    """A static rendition with the marks above put in it."""
    return html.replace(
        'class="gradwidget-static">', 'class="gradwidget-static">' + HOSTILE.replace("__pwned", mark), 1
    )


def hostile_notebook():
    """The test notebook with its saved widget state (and the output's HTML) rewritten by an attacker:
    a static panel that runs script, an image URL that breaks out of its attribute, the widget's code."""
    nb = notebook(True)
    png = nb.cells[0].outputs[0].data["image/png"]
    state = nb.metadata["widgets"][STATE]["state"][MODEL_ID]["state"]
    state["static_html"] = with_hostile(out_html := nb.cells[0].outputs[0].data["text/html"])
    state["static_png"] = "data:image/png;base64," + png
    state["_esm"] = "export default { render() { window.__pwned = 6; } }"
    out = nb.cells[0].outputs[0]
    out.data["text/html"] = with_hostile(out_html, "__pwned_out")
    nb.cells.append(
        new_code_cell(
            "other",
            outputs=[
                new_output(
                    "display_data",
                    data={
                        "text/plain": "x",
                        "image/png": 'AAAA"><script>window.__pwned=7</script>',
                        "text/html": with_hostile(out_html, "__pwned_other"),
                        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": "0" * 32},
                    },
                )
            ],
        )
    )
    return nb


def test_sanitize_html_leaves_no_script_of_the_notebook_in_the_page(tmp_path):
    nbformat.write(hostile_notebook(), tmp_path / "nb.ipynb")
    cmd = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "gradwidget", "--HTMLExporter.sanitize_html=True"]
    p = subprocess.run([*cmd, "nb.ipynb"], cwd=tmp_path, env=_fake_install(tmp_path), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "nb.html").read_text()
    for mark in ("onload", "onerror", "javascript:", "<iframe", "__pwned", "html-manager", "_esm", WIDGET_VIEW):
        assert mark not in html, mark
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', html)) == 1  # the state's panel image shows
    # without sanitize_html (a trusted notebook) the live widget and its manager stay
    trusted = export_html(hostile_notebook())
    assert "html-manager" in trusted and WIDGET_VIEW in trusted


@pytest.mark.browser
def test_a_sanitized_export_of_hostile_widget_state_runs_no_script_in_chromium(tmp_path):
    path = tmp_path / "nb.html"
    export_html(hostile_notebook(), path, sanitize_html=True)
    with offline_page() as (page, blocked):
        errors: list = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_load_state("load")
        page.wait_for_timeout(500)
        marks = page.evaluate(
            "() => [window.__pwned, window.__pwned_out, window.__pwned_other].map(v => v === undefined ? null : v)"
        )
        imgs = [i for i in page.evaluate(IMAGES_JS) if i["complete"] and i["w"] > 0]
        handlers = page.evaluate(
            "() => Array.from(document.querySelectorAll('main *'))"
            ".flatMap(e => Array.from(e.attributes).map(a => a.name)).filter(n => n.startsWith('on'))"
        )
    assert marks == [None, None, None], marks
    assert handlers == [] and errors == []
    assert not any("html-manager" in u for u in blocked)  # the widget manager was not even asked for
    assert len(imgs) == 1 and imgs[0]["complete"] and imgs[0]["w"] > 200 and imgs[0]["visible"]
