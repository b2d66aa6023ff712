"""GradientPanel end to end: a real JupyterLab, a real kernel training the demo model, Debian's
Chromium driven by Playwright, and assertions on the canvas pixels and on the kernel's state.

One server and one page for the whole module (2 shared cores): the tests run in file order on the
same notebook. Screenshots go to ``test-artifacts/browser/`` (or ``$GRADWIDGET_ARTIFACTS``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: gw_browser
from gw_browser import ARGS, CHROMIUM, need_chromium  # noqa: E402
from lab import (KERNEL_EXEC_JS, KERNEL_IDLE_JS, KERNEL_READY_JS, ROOT, RUN_CELL_JS,  # noqa: E402
                 jupyter_lab)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = Path(os.environ.get("GRADWIDGET_ARTIFACTS", ROOT / "test-artifacts" / "browser"))
TIMEOUT_MS = 180_000
TRAIN_STEPS = 150

CELLS = [
    # 0: the panel, shown before training
    """import time, torch
torch.set_num_threads(1)
from gradwidget import GradientPanel
from gradwidget.demo import build_demo, train_demo
model, opt, data = build_demo()
panel = GradientPanel(model, opt, max_rate=4)
panel""",
    # 1: train in the same cell's kernel while the panel is on screen (~25 ms per step)
    f"""train_demo({TRAIN_STEPS}, recorder=panel, model=model, optimizer=opt, data=data,
           callback=lambda i, loss: time.sleep(0.02))
print("trained", panel.run.n_steps)""",
]

VIEW = "document.querySelector('.gw-root').parentElement.gradwidget"

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

#: a fingerprint of a canvas' pixels (to see that it was redrawn with something else).
CANVAS_HASH_JS = """(sel) => { const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0, painted = 0;
  for (let i = 0; i < d.length; i += 4) { if (d[i + 3]) painted++; h = (h * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2] + d[i + 3]) | 0; }
  return {hash: h, painted}; }"""

BACKGROUND_JS = """() => getComputedStyle(document.querySelector('.gw-root')).backgroundColor"""


def kernel(page, code: str) -> str:
    return page.evaluate(KERNEL_EXEC_JS, code)


def luminance(css: str) -> float:
    import re

    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    return 0.299 * r + 0.587 * g + 0.114 * b


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    need_chromium()
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook
    from playwright.sync_api import sync_playwright

    if not (ROOT / "gradwidget" / "static" / "widget.js").is_file():
        pytest.fail("the front end is not built: run `pip install -e .` (builds js/ into gradwidget/static/)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    work = tmp_path_factory.mktemp("lab")
    nb = new_notebook(cells=[new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, work / "panel.ipynb")
    with jupyter_lab(work) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith((base, "data:", "blob:"))
                      else r.abort())
            pg = ctx.new_page()
            pg.set_default_timeout(TIMEOUT_MS)
            pg.goto(f"{base}/lab/tree/panel.ipynb")
            pg.wait_for_function(KERNEL_READY_JS, timeout=TIMEOUT_MS)
            yield pg
        finally:
            browser.close()


def test_panel_draws_and_keeps_updating_while_training(page):
    page.evaluate(RUN_CELL_JS, 0)
    page.wait_for_function(f"() => {{ const r = document.querySelector('.gw-root'); return r && r.parentElement.gradwidget; }}")
    page.wait_for_function(KERNEL_IDLE_JS)
    # before any step: a clear message, no heatmap
    msg = page.locator(".gw-message").inner_text()
    assert "No step recorded yet" in msg
    page.evaluate(RUN_CELL_JS, 1)
    seen = []
    busy_samples = 0
    for _ in range(200):
        n, idle = page.evaluate(f"() => [{VIEW}.meta.n_steps, {KERNEL_IDLE_JS}()]")
        if not idle:
            busy_samples += 1
            if not seen or n != seen[-1]:
                seen.append(n)
            if len(seen) == 3:
                page.locator(".jp-OutputArea-output").first.screenshot(path=str(ARTIFACTS / "panel_training.png"))
        elif busy_samples:
            break
        page.wait_for_timeout(150)
    # several distinct, growing views arrived while the training cell was still running
    grown = [n for n in seen if n > 0]
    assert grown == sorted(grown), seen
    assert len([n for n in grown if n < TRAIN_STEPS]) >= 3, seen
    page.wait_for_function(KERNEL_IDLE_JS)
    page.wait_for_function(f"() => {VIEW}.meta.n_steps === {TRAIN_STEPS}")
    assert kernel(page, "print(panel.run.n_steps, panel.step == int(panel.run.steps[-1]))").split() == [str(TRAIN_STEPS), "True"]


def test_canvas_has_pixels_in_light_and_dark_themes(page):
    page.wait_for_function(f"() => {VIEW}.image.canvas !== null")
    page.wait_for_timeout(300)
    light = page.evaluate(HEAT_PIXELS_JS)
    assert light["opaque"] == light["total"] and light["colours"] >= 20, light
    bg_light = page.evaluate(BACKGROUND_JS)
    assert luminance(bg_light) > 128, bg_light
    out = page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first
    out.screenshot(path=str(ARTIFACTS / "panel_light.png"))
    try:
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'")
        page.wait_for_function(f"() => {{ const c = getComputedStyle(document.querySelector('.gw-root')).backgroundColor;"
                               f" const m = c.match(/[\\d.]+/g).map(Number); return 0.299*m[0] + 0.587*m[1] + 0.114*m[2] < 128; }}")
        page.wait_for_timeout(500)
        dark = page.evaluate(HEAT_PIXELS_JS)
        assert dark["opaque"] == dark["total"] and dark["colours"] >= 20, dark
        assert page.evaluate(f"() => {VIEW}.theme.dark") is True
        # the layer names are drawn in the dark theme's light text colour
        page.wait_for_function(f"""() => {{ const v = {VIEW}; const c = v.canvas; const dpr = c.width / v.layout.width;
            const g = v.layout.gutter; const d = c.getContext('2d').getImageData(0, Math.round(g.y * dpr),
              Math.round(g.w * dpr), Math.round(g.h * dpr)).data;
            let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 40 && d[i] + d[i + 1] + d[i + 2] > 450) n++;
            return n > 50; }}""", timeout=10_000)
        out.screenshot(path=str(ARTIFACTS / "panel_dark.png"))
    finally:
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'")


def test_dragging_the_slider_sets_step_in_the_kernel(page):
    slider = page.locator(".gw-slider")
    slider.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    box = slider.bounding_box()
    last = int(kernel(page, "print(panel.step)"))
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] - 3, y)
    page.mouse.down()
    for f in (0.8, 0.6, 0.45, 0.3):
        page.mouse.move(box["x"] + box["width"] * f, y, steps=4)
    page.mouse.up()
    expected = page.evaluate(f"() => {{ const v = {VIEW}; return v.colSteps[v.cursor]; }}")
    assert expected < last
    page.wait_for_function(f"""async () => (await ({KERNEL_EXEC_JS})("print(panel.step)")).trim() === "{int(expected)}" """)
    assert kernel(page, "print(panel.step, panel.follow, panel.detail_step)").split() == [str(int(expected)), "False", str(int(expected))]
    # the kernel's exact values for that step reached the bars
    page.wait_for_function(f"() => {VIEW}.barValues().exact")
    # keyboard: one column left
    page.locator(".gw-root").focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"""async () => (await ({KERNEL_EXEC_JS})("print(panel.step)")).trim() === "{int(expected) - 1}" """)
    # and the other way: setting panel.step in Python moves the cursor in the browser
    kernel(page, "panel.step = 20")
    page.wait_for_function(f"() => {{ const v = {VIEW}; return v.colSteps[v.cursor] === 20 && v.slider.value === String(v.cursor); }}")
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_scrubbed.png"))


def test_clicking_a_table_row_selects_the_layer_and_redraws_the_histogram(page):
    before_layer = int(kernel(page, "print(panel.layer)"))
    target = page.evaluate(f"""() => {{ const v = {VIEW};
        const rows = Array.from(document.querySelectorAll('table.gw-health tbody tr'));
        const r = rows.find(tr => Number(tr.dataset.index) !== {before_layer} && tr.dataset.layer.endsWith('weight')
                               && Number(tr.dataset.index) >= v.meta.n_layers - 4);
        return {{index: Number(r.dataset.index), layer: r.dataset.layer}}; }}""")
    page.wait_for_function(f"() => {VIEW}.histLayer === {before_layer}")
    hist_before = page.evaluate(CANVAS_HASH_JS, "canvas.gw-hist")
    page.locator(f"table.gw-health tbody tr[data-index='{target['index']}']").click()
    page.wait_for_function(f"() => {VIEW}.histLayer === {target['index']}")
    page.wait_for_timeout(200)
    assert kernel(page, "print(panel.layer, panel.layer_name)").split() == [str(target["index"]), target["layer"]]
    hist_after = page.evaluate(CANVAS_HASH_JS, "canvas.gw-hist")
    assert hist_after["painted"] > 500 and hist_after["hash"] != hist_before["hash"]
    assert page.locator("table.gw-health tr.gw-selected").get_attribute("data-layer") == target["layer"]
    # the table filters and sorts in place
    page.locator(".gw-filter").fill("bias")
    names = page.evaluate("() => Array.from(document.querySelectorAll('table.gw-health tbody tr')).map(t => t.dataset.layer)")
    assert names and all(n.endswith("bias") for n in names)
    page.locator(".gw-filter").fill("")
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_selected_layer.png"))
