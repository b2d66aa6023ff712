"""A real JupyterLab server for browser tests, and helpers to drive a notebook in it from Playwright.

Headless Debian Chromium (``tests/gw_browser.py``) against ``jupyter lab`` started on a free port
with no token; the kernel imports gradwidget from this source tree (``PYTHONPATH``) and needs the
built front end (``gradwidget/static/widget.js``, made by ``pip install -e .``).
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

KERNEL_READY_JS = """() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle'; }"""

KERNEL_IDLE_JS = """() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'"""

#: run cell ``i`` of the open notebook without waiting for it to finish.
RUN_CELL_JS = """(i) => { const w = window.jupyterapp.shell.currentWidget;
  w.content.activeCellIndex = i; window.jupyterapp.commands.execute('notebook:run-cell'); return true; }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyter_lab(root_dir: Path, timeout: float = 180):
    """Start ``jupyter lab`` serving ``root_dir``; yield its base URL; stop it afterwards."""
    port = free_port()
    settings = root_dir / ".lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", JUPYTER_PLATFORM_DIRS="1")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--allow-root", "--ServerApp.token=", "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
           f"--ServerApp.root_dir={root_dir}", "--ServerApp.open_browser=False",
           f"--LabApp.user_settings_dir={root_dir / '.lab-settings'}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log_path = root_dir / "jupyter.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            t0 = time.time()
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"jupyter lab exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"{base}/api/status", timeout=2):
                        break
                except OSError:
                    if time.time() - t0 > timeout:
                        raise TimeoutError(f"jupyter lab did not answer at {base} within {timeout:.0f}s")
                    time.sleep(0.5)
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
