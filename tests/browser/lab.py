"""A real JupyterLab (or Notebook 7) server for browser tests, and helpers to drive a notebook in
it from Playwright.

Headless Debian Chromium (``tests/gw_browser.py``) against ``jupyter lab`` or ``jupyter notebook``
started on a free port with no token; the kernel imports gradwidget from this source tree
(``PYTHONPATH``) and needs the built front end (``gradwidget/static/widget.js``, made by
``pip install -e .``). Both front ends expose ``window.jupyterapp`` (a JupyterLab application whose
``shell.currentWidget`` is the open notebook), so the same helpers drive either.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: stdout of a code string run in the notebook's kernel (not in a cell: nothing shows in the page).
KERNEL_EXEC_JS = """async (code) => {
  const w = window.jupyterapp.shell.currentWidget;
  const kernel = w.sessionContext.session.kernel;
  const future = kernel.requestExecute({code, silent: false, store_history: false});
  let out = "";
  future.onIOPub = (msg) => {
    const t = msg.header.msg_type;
    if (t === "stream") out += msg.content.text;
    if (t === "error") out += "ERROR " + msg.content.ename + ": " + msg.content.evalue;
  };
  await future.done;
  return out;
}"""


def kernel(page, code: str) -> str:
    """Run ``code`` in the open notebook's kernel (not in a cell); its stdout."""
    return page.evaluate(KERNEL_EXEC_JS, code)


KERNEL_READY_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }"""

KERNEL_IDLE_JS = """() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"""

#: run cell ``i`` of the open notebook without waiting for it to finish.
RUN_CELL_JS = """(i) => { const w = window.jupyterapp.shell.currentWidget;
  w.content.activeCellIndex = i; window.jupyterapp.commands.execute('notebook:run-cell'); return true; }"""


VIEW = "document.querySelector('.gw-root').parentElement.gradwidget"

#: the text/html of cell i's outputs, as JupyterLab or Notebook 7 holds them (what the .ipynb gets when saved).
OUTPUT_HTML_JS = """(i) => { const m = window.jupyterapp.shell.currentWidget.content.widgets[i].model.outputs;
  const out = []; for (let k = 0; k < m.length; k++) out.push(String(m.get(k).data['text/html'] || ''));
  return out; }"""

#: pixels of the heatmap's rectangle on the main canvas: how many are opaque, how many colours.
HEAT_PIXELS_JS = f"""() => {{
  const v = {VIEW}; const c = v.canvas; const L = v.layout; const dpr = c.width / L.width;
  const x = Math.round(L.heat.x * dpr), y = Math.round(L.heat.y * dpr);
  const w = Math.round(L.heat.w * dpr), h = Math.round(L.heat.h * dpr);
  const d = c.getContext('2d').getImageData(x, y, w, h).data;
  let opaque = 0; const colours = new Set();
  for (let i = 0; i < d.length; i += 4) {{
    if (d[i + 3] > 0) {{ opaque++; colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]); }}
  }}
  return {{opaque, total: w * h, colours: colours.size}};
}}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the server application of each front end, and the page of a notebook in it
APPS = {"lab": ("LabApp", "/lab/tree/{}"), "notebook": ("JupyterNotebookApp", "/notebooks/{}")}


@contextmanager
def jupyter_lab(root_dir: Path, timeout: float = 180, app: str = "lab"):
    """Start ``jupyter lab`` (or ``jupyter notebook``, Notebook 7, with ``app="notebook"``) serving
    ``root_dir``; yield its base URL; stop it afterwards."""
    cls = APPS[app][0]
    settings = root_dir / ".lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        JUPYTER_PLATFORM_DIRS="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        app,
        "--no-browser",
        "--ip=127.0.0.1",
        "--port={port}",
        "--allow-root",
        "--ServerApp.token=",
        "--ServerApp.password=",
        f"--{cls}.expose_app_in_browser=True",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.open_browser=False",
        f"--{cls}.user_settings_dir={root_dir / '.lab-settings'}",
        # a workspace of its own: the default one (in the user's config folder) would reopen the
        # notebooks of an earlier server, missing here
        f"--{cls}.workspaces_dir={root_dir / '.lab-workspaces'}",
    ]
    if app == "lab":
        cmd += ["--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with serve(cmd, root_dir, env, "{base}/api/status", root_dir / "jupyter.log", timeout, f"jupyter {app}") as base:
        yield base


@contextmanager
def serve(cmd: list[str], cwd: Path, env: dict, probe: str, log_path: Path, timeout: float, what: str):
    """Run a server command on a free port (``cmd`` may contain ``{port}``), wait until ``probe``
    (with ``{base}``) answers, yield the base URL, stop it afterwards."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    probe = probe.format(base=base)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [c.format(port=port) for c in cmd], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            t0 = time.time()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what} exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(probe, timeout=2):
                        break
                except OSError:
                    if time.time() - t0 > timeout:
                        raise TimeoutError(f"{what} did not answer at {base} within {timeout:.0f}s")
                    time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def notebook_page(
    work: Path,
    cells: list[str],
    app: str = "lab",
    name: str = "panel.ipynb",
    viewport: dict | None = None,
    timeout_ms: int = 180_000,
    on_page=None,
):
    """Write a notebook of ``cells`` into ``work``, serve it with ``app`` (``lab`` or ``notebook``),
    open it in headless Chromium (requests outside the server refused) and yield the page once its
    kernel is idle. ``on_page(page)`` runs before the notebook is opened (e.g. to watch its websockets)."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from gw_browser import ARGS, CHROMIUM, need_chromium

    need_chromium()
    if not (ROOT / "gradwidget" / "static" / "widget.js").is_file():
        raise RuntimeError("the front end is not built: run `pip install -e .` (builds js/ into gradwidget/static/)")
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / name)
    with jupyter_lab(work, app=app) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport=viewport or {"width": 1400, "height": 1000})
            ctx.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:")) else r.abort()
            )
            page = ctx.new_page()
            page.set_default_timeout(timeout_ms)
            if on_page is not None:
                on_page(page)
            page.goto(base + APPS[app][1].format(name))
            page.wait_for_function(KERNEL_READY_JS, timeout=timeout_ms)
            yield page
        finally:
            browser.close()
