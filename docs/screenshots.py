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
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "browser")]
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
    train_demo(steps, log_dir=run_dir, overwrite=True)


def shoot_report(run_dir: Path, out: Path, work: Path) -> dict:
    from gradwidget import analyze, write_report
    from gradwidget.storage import load_run

    html = work / "report.html"
    write_report(analyze(load_run(run_dir)), html)
    with offline_page(viewport={"width": 1200, "height": 1500}) as (page, blocked):
        page.goto(html.as_uri())
        page.wait_for_load_state("load")
        page.screenshot(path=str(out / "report.png"))
        n_images = page.evaluate("() => Array.from(document.images).filter(i => i.naturalWidth > 0).length")
    return {
        "report_html": str(html),
        "report_png": str(out / "report.png"),
        "blocked": blocked,
        "report_images": n_images,
    }


def shoot_panel(run_dir: Path, out: Path, work: Path, timeout: float = 180) -> dict:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from playwright.sync_api import sync_playwright

    from lab import KERNEL_READY_JS, jupyter_lab  # tests/browser/lab.py: the e2e tests' JupyterLab

    nb = new_notebook(cells=[new_code_cell(PANEL_CELL.format(run=str(run_dir)))])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "panel.ipynb")
    ms = timeout * 1000
    with jupyter_lab(work, timeout=timeout) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1500, "height": 1100})
            ctx.route(
                "**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:")) else r.abort()
            )
            page = ctx.new_page()
            page.goto(f"{base}/lab/tree/panel.ipynb", timeout=ms)
            page.wait_for_function(KERNEL_READY_JS, timeout=ms)
            page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_function(
                """() => Array.from(document.querySelectorAll('.jp-OutputArea-output canvas'))
                                          .some(c => c.width > 0 && c.getBoundingClientRect().height > 0)""",
                timeout=ms,
            )
            page.wait_for_timeout(1500)  # let the first frames settle
            canvases = page.evaluate(CANVAS_JS)
            root = page.locator(".gw-root")
            target = root.first if root.count() else page.locator(".jp-OutputArea-output").last
            target.screenshot(path=str(out / "panel.png"))
        finally:
            browser.close()
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
