"""GradientPanel in marimo (``marimo run``, the app view): a real marimo server and kernel, Debian's
Chromium driven by Playwright, nothing fetched from outside the server. marimo renders anywidgets
in a shadow root through ``mo.ui.anywidget``; the panel must draw its canvas there, scrub with the
keyboard, and the step it scrubs to must reach the kernel (a cell reading ``widget.value``)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: lab
from lab import HEAT_PIXELS_JS, ROOT, VIEW, serve

pytestmark = [pytest.mark.browser, pytest.mark.slow]

APP = """import marimo

app = marimo.App()


@app.cell
def _():
    import marimo as mo
    import torch

    torch.set_num_threads(1)
    from gradwidget import GradientPanel
    from gradwidget.demo import build_demo, train_demo

    model, opt, data = build_demo()
    panel = GradientPanel(model, opt, max_rate=4)
    train_demo(40, recorder=panel, model=model, optimizer=opt, data=data)
    widget = mo.ui.anywidget(panel)
    widget
    return mo, panel, widget


@app.cell
def _(mo, widget):
    mo.md(f"kernel step: {widget.value['step']}")
    return


if __name__ == "__main__":
    app.run()
"""

#: the panel's view object, reached from its root element (inside marimo's shadow root)
EL_VIEW = "e.parentElement.gradwidget"


@contextmanager
def marimo_app(work: Path, timeout: float = 120):
    """``marimo run`` serving the app above; yield its base URL."""
    (work / "app.py").write_text(APP)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    cmd = [sys.executable, "-m", "marimo", "run", "app.py", "--headless", "--host", "127.0.0.1", "--port", "{port}"]
    with serve(cmd, work, env, "{base}", work / "marimo.log", timeout, "marimo run") as base:
        yield base


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    pytest.importorskip("marimo")
    sys.path.insert(0, str(ROOT / "tests"))
    from gw_browser import ARGS, CHROMIUM, need_chromium

    need_chromium()
    from playwright.sync_api import sync_playwright

    if not (ROOT / "gradwidget" / "static" / "widget.js").is_file():
        pytest.skip("the front end is not built (gradwidget/static/widget.js)")
    work = tmp_path_factory.mktemp("marimo")
    with marimo_app(work) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            blocked: list[str] = []

            def route(r):
                url = r.request.url
                if url.startswith((base, "data:", "blob:")):
                    r.continue_()
                else:
                    blocked.append(url)
                    r.abort()

            ctx.route("**/*", route)
            pg = ctx.new_page()
            pg.set_default_timeout(150_000)
            pg.goto(base)
            pg.locator(".gw-root").wait_for(state="attached")
            pg.blocked = blocked
            yield pg
        finally:
            browser.close()


def view_eval(page, body: str):
    """Evaluate ``body`` (an expression over ``v``, the panel's view) in the page."""
    return page.locator(".gw-root").evaluate(f"e => {{ const v = {EL_VIEW}; return {body}; }}")


def test_panel_draws_in_marimo(page):
    page.locator(".gw-root").evaluate(
        f"e => new Promise(r => {{ const t = () => {{ const v = {EL_VIEW};"
        " if (v && v.meta.n_steps === 40 && v.image.canvas !== null) r(true); else setTimeout(t, 100); }; t(); })"
    )
    px = page.locator(".gw-root").evaluate(f"e => ({HEAT_PIXELS_JS.replace(VIEW, EL_VIEW)})()")
    assert px["opaque"] == px["total"] > 1000 and px["colours"] >= 20, px
    assert page.locator("table.gw-health tbody tr").count() == view_eval(page, "v.meta.n_layers")
    assert page.blocked == [], page.blocked  # one ESM bundle, no fetch outside the server


def test_keyboard_scrub_reaches_the_marimo_kernel(page):
    page.get_by_text("kernel step: 39").wait_for()
    before = view_eval(page, "v.colSteps[v.cursor]")
    page.locator(".gw-root").focus()
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    after = view_eval(page, "v.colSteps[v.cursor]")
    assert after == before - 2, (before, after)
    page.get_by_text(f"kernel step: {int(after)}").wait_for(timeout=30_000)  # the cell re-ran with it


def test_panel_stylesheet_reaches_the_shadow_root(page):
    """marimo renders widgets in a shadow root: the stylesheet goes there, not to document.head."""
    assert page.locator(".gw-root").evaluate(
        "e => getComputedStyle(e).getPropertyValue('--gw-bg') !== ''"
    )  # a variable the stylesheet defines
