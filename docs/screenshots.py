"""Screenshots for the README, made from the demo: the live panel in JupyterLab and the HTML report.

    python docs/screenshots.py [--out docs] [--steps 200]

Trains the demo (a 12-layer sigmoid MLP whose first layers vanish) into a run directory, writes its
HTML report and photographs it in headless Chromium with the network off (``report.png``), then
starts JupyterLab, opens the run in a ``GradientPanel`` and photographs the live widget
(``panel.png``). ``tests/test_screenshots.py`` runs this and checks what it drew.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from gw_browser import ARGS, CHROMIUM, offline_page  # noqa: E402  (the tests' Chromium setup)

#: what the panel cell runs in JupyterLab.
PANEL_CELL = """from gradwidget import GradientPanel
panel = GradientPanel.from_run({run!r})
panel"""

#: pixels of every visible canvas in the first widget output: how many are not background.
CANVAS_JS = """() => Array.from(document.querySelectorAll('.jp-OutputArea-output canvas'))
  .filter(c => c.width > 0 && c.height > 0 && c.getBoundingClientRect().height > 0)
  .map(c => {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    let painted = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0) painted++;
    return {w: c.width, h: c.height, painted};
  })"""


def train(run_dir: Path, steps: int) -> None:
    import torch

    from gradwidget.demo import train_demo

    torch.set_num_threads(1)
    train_demo(steps, log_dir=run_dir)


def shoot_report(run_dir: Path, out: Path, work: Path) -> dict:
    from gradwidget.storage import load_run

    html = work / "report.html"
    load_run(run_dir).report().to_html(html)
    with offline_page(viewport={"width": 1200, "height": 1500}) as (page, blocked):
        page.goto(html.as_uri())
        page.wait_for_load_state("load")
        page.screenshot(path=str(out / "report.png"))
        n_images = page.evaluate("() => Array.from(document.images).filter(i => i.naturalWidth > 0).length")
    return {"report_html": str(html), "report_png": str(out / "report.png"), "blocked": blocked,
            "report_images": n_images}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"jupyter lab did not answer at {url} within {timeout:.0f}s")


def shoot_panel(run_dir: Path, out: Path, work: Path, timeout: float = 180) -> dict:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from playwright.sync_api import sync_playwright

    nb = new_notebook(cells=[new_code_cell(PANEL_CELL.format(run=str(run_dir)))])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "panel.ipynb")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--allow-root", "--ServerApp.token=", "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
           f"--ServerApp.root_dir={work}", "--ServerApp.open_browser=False"]
    log = open(work / "jupyter.log", "w")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/api/status", proc, timeout)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                ctx = browser.new_context(viewport={"width": 1400, "height": 1100})
                ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:"))
                          else r.abort())
                page = ctx.new_page()
                page.goto(f"{base}/lab/tree/panel.ipynb", timeout=timeout * 1000)
                page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')",
                                       timeout=timeout * 1000)
                page.wait_for_function("""() => { const s = document.querySelector('.jp-Notebook-ExecutionIndicator');
                    const app = window.jupyterapp; const w = app.shell.currentWidget;
                    return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel
                        && w.sessionContext.session.kernel.connectionStatus === 'connected'; }""",
                                       timeout=timeout * 1000)
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                output = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-subarea, canvas"))
                output.first.wait_for(state="visible", timeout=timeout * 1000)
                page.wait_for_function("""() => Array.from(document.querySelectorAll('.jp-OutputArea-output canvas'))
                                              .some(c => c.width > 0 && c.getBoundingClientRect().height > 0)""",
                                       timeout=timeout * 1000)
                page.wait_for_timeout(1500)  # let the first frames settle
                canvases = page.evaluate(CANVAS_JS)
                output.first.screenshot(path=str(out / "panel.png"))
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return {"panel_png": str(out / "panel.png"), "canvases": canvases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for report.png and panel.png")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only", choices=["report", "panel"], help="make one screenshot only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gradwidget-shots-") as tmp:
        work = Path(tmp)
        run_dir = work / "demo-run"
        train(run_dir, args.steps)
        info: dict = {"run": str(run_dir)}
        if args.only in (None, "report"):
            info.update(shoot_report(run_dir, out, work))
        if args.only in (None, "panel"):
            info.update(shoot_panel(run_dir, out, work))
        info.pop("report_html", None)
        info.pop("run")
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
