"""GradientPanel end to end: a real JupyterLab, a real kernel training the demo model, Debian's
Chromium driven by Playwright, and assertions on the canvas pixels and on the kernel's state.

One server and one page for the whole module (2 shared cores): the tests run in file order on the
same notebook. Screenshots go to ``test-artifacts/browser/`` (or ``$GRADWIDGET_ARTIFACTS``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: lab
from lab import (
    HEAT_PIXELS_JS,
    KERNEL_EXEC_JS,
    KERNEL_IDLE_JS,
    OUTPUT_HTML_JS,
    ROOT,
    RUN_CELL_JS,
    VIEW,  # noqa: E402
    kernel,
    notebook_page,
)

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
    # 2: a longer same-cell training loop (~12 s), during which the kernel reads no browser message
    """train_demo(240, recorder=panel, model=model, optimizer=opt, data=data,
           callback=lambda i, loss: time.sleep(0.05))""",
    # 3: the messages of an empty run and of a run whose every value is non-finite
    """import numpy as np
from IPython.display import display
from gradwidget import Run, METRICS
bad = Run(["a", "b"])
for s in range(6):
    v = np.full((len(METRICS), 2), np.nan, np.float32); v[METRICS.index("nonfinite")] = 16
    bad.append(s, v)
display(GradientPanel(Run(["a", "b"])), GradientPanel(bad))""",
    # 4: 450 tensors (75 blocks of 6): past the row cap the panel draws one row per block; the bias
    # of blocks.3.lin1 is float32 rounding next to its weight (a tensor the loss cannot move)
    """import numpy as np
from gradwidget import GradientPanel, METRICS, Run
from gradwidget.run import LayerInfo
rng = np.random.default_rng(0)
big = Run([LayerInfo(f"blocks.{i // 6}.lin{(i // 2) % 3}.{'weight' if i % 2 == 0 else 'bias'}",
                     module=f"blocks.{i // 6}.lin{(i // 2) % 3}", numel=4) for i in range(450)])
for s in range(8):
    v = np.exp(rng.standard_normal((len(METRICS), 450))).astype(np.float32) * 0.1
    v[METRICS.index("nonfinite")] = 0
    v[METRICS.index("zero_frac"), 20:22] = 0
    v[METRICS.index("mean_abs"), 21] = 1e-8 * v[METRICS.index("mean_abs"), 20]
    big.append(s, v)
big_panel = GradientPanel(big)
big_panel""",
    # 5: another same-cell training loop (~8 s), for the cursor and the output updated when it ends
    """train_demo(120, recorder=panel, model=model, optimizer=opt, data=data,
           callback=lambda i, loss: time.sleep(0.05))""",
]

#: a fingerprint of a canvas' pixels (to see that it was redrawn with something else).
CANVAS_HASH_JS = """(sel) => { const c = document.querySelector(sel);
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let h = 0, painted = 0;
  for (let i = 0; i < d.length; i += 4) { if (d[i + 3]) painted++; h = (h * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2] + d[i + 3]) | 0; }
  return {hash: h, painted}; }"""

BACKGROUND_JS = """() => getComputedStyle(document.querySelector('.gw-root')).backgroundColor"""


def luminance(css: str) -> float:
    import re

    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    return 0.299 * r + 0.587 * g + 0.114 * b


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with notebook_page(tmp_path_factory.mktemp("lab"), CELLS, app="lab", timeout_ms=TIMEOUT_MS) as pg:
        yield pg


def test_panel_draws_and_keeps_updating_while_training(page):
    page.evaluate(RUN_CELL_JS, 0)
    page.wait_for_function(
        "() => { const r = document.querySelector('.gw-root'); return r && r.parentElement.gradwidget; }"
    )
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
    assert kernel(page, "print(panel.run.n_steps, panel.step == int(panel.run.steps[-1]))").split() == [
        str(TRAIN_STEPS),
        "True",
    ]


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
        page.wait_for_function(
            "() => { const c = getComputedStyle(document.querySelector('.gw-root')).backgroundColor;"
            " const m = c.match(/[\\d.]+/g).map(Number); return 0.299*m[0] + 0.587*m[1] + 0.114*m[2] < 128; }"
        )
        page.wait_for_timeout(500)
        dark = page.evaluate(HEAT_PIXELS_JS)
        assert dark["opaque"] == dark["total"] and dark["colours"] >= 20, dark
        assert page.evaluate(f"() => {VIEW}.theme.dark") is True
        # the layer names are drawn in the dark theme's light text colour
        page.wait_for_function(
            f"""() => {{ const v = {VIEW}; const c = v.canvas; const dpr = c.width / v.layout.width;
            const g = v.layout.gutter; const d = c.getContext('2d').getImageData(0, Math.round(g.y * dpr),
              Math.round(g.w * dpr), Math.round(g.h * dpr)).data;
            let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 40 && d[i] + d[i + 1] + d[i + 2] > 450) n++;
            return n > 50; }}""",
            timeout=10_000,
        )
        out.screenshot(path=str(ARTIFACTS / "panel_dark.png"))
    finally:
        page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Light'})")
        page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'")


#: drags of the drag test (``GW_DRAG_RUNS=20`` checks the order under load; each trains ~1 s more)
DRAG_RUNS = int(os.environ.get("GW_DRAG_RUNS", "1"))
#: training in a thread of the kernel while the page drags (the kernel reads each drag position as it
#: comes, and sends the newest step of every update while it follows)
THREAD_TRAIN = """import threading
trainer = threading.Thread(target=train_demo, args=(40,), daemon=True,
    kwargs=dict(recorder=panel, model=model, optimizer=opt, data=data, callback=lambda i, loss: time.sleep(0.02)))
trainer.start()"""
#: the step the page chose (its pending choice, else the kernel's step it shows)
CHOSEN_JS = f"() => {{ const v = {VIEW}; return v.intent.step ?? Number(v.model.get('step')); }}"


def test_dragging_the_slider_sets_step_in_the_kernel(page):
    """The cursor has one owner and an order: a fast drag across many steps while a thread trains
    ends where the mouse ended, in the view and in the kernel, whatever order the kernel's updates
    and the drag's positions cross in."""
    slider = page.locator(".gw-slider")
    slider.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    for run in range(DRAG_RUNS):
        kernel(page, "panel.step = int(panel.run.steps[-1])")  # following the newest step
        n0 = int(kernel(page, "print(panel.run.n_steps)"))
        kernel(page, THREAD_TRAIN)
        page.wait_for_function(f"() => {VIEW}.meta.n_steps > {n0 + 3}")  # updates flow while it trains
        box = slider.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] - 2, y)
        page.mouse.down()
        end = 0.25 + 0.05 * (run % 5)
        for k in range(1, 25):  # ~25 positions, a few ms apart: many travel while others are on their way
            page.mouse.move(box["x"] + box["width"] * (1 - (1 - end) * k / 24), y)
        page.mouse.up()
        expected = int(page.evaluate(CHOSEN_JS))
        page.wait_for_timeout(100)
        assert int(page.evaluate(CHOSEN_JS)) == expected  # a kernel update while training did not move it
        assert kernel(page, "trainer.join(); print(panel.run.n_steps)").strip() == str(n0 + 40)
        assert expected < n0 + 39, (run, expected)
        page.wait_for_function(
            f"""async () => (await ({KERNEL_EXEC_JS})("print(panel.step)")).trim() === "{expected}" """
        )
        page.wait_for_function(f"() => {{ const v = {VIEW}; return v.intent.step === null; }}")
        state = kernel(page, "print(panel.step, panel.follow, panel.detail_step, panel.choice_applied)").split()
        assert state[:3] == [str(expected), "False", str(expected)], (run, state)
        assert page.evaluate(CHOSEN_JS) == expected, run  # the view shows the kernel's step: the drag's end
    # the kernel's exact values for that step reached the bars
    page.wait_for_function(f"() => {VIEW}.barValues().exact")
    # keyboard: one column left
    page.locator(".gw-root").focus()
    page.keyboard.press("ArrowLeft")
    left = int(page.evaluate(CHOSEN_JS))
    assert left < expected
    page.wait_for_function(f"""async () => (await ({KERNEL_EXEC_JS})("print(panel.step)")).trim() === "{left}" """)
    # and the other way: setting panel.step in Python moves the cursor in the browser
    kernel(page, "panel.step = 20")
    page.wait_for_function(
        f"() => {{ const v = {VIEW}; return v.colSteps[v.cursor] === 20 && v.slider.value === String(v.cursor); }}"
    )
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_scrubbed.png")
    )


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
    names = page.evaluate(
        "() => Array.from(document.querySelectorAll('table.gw-health tbody tr')).map(t => t.dataset.layer)"
    )
    assert names and all(n.endswith("bias") for n in names)
    page.locator(".gw-filter").fill("")
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_selected_layer.png")
    )


def test_the_top_diagnoses_are_listed_and_a_click_goes_to_their_layer_and_step(page):
    """The report's top recommendations above the heatmap (at most 5): cause · layers · since step N ·
    action; a click selects the first layer and moves the cursor to the first step."""
    import json

    diags = json.loads(kernel(page, "import json; print(json.dumps(panel.diagnoses))"))
    n_recs = int(kernel(page, "print(len(panel.report.diagnoses))"))
    assert n_recs > 0, "the demo's vanishing layers should be diagnosed"
    assert 1 <= len(diags) <= 5
    rows = page.locator(".gw-diagnoses .gw-diagnosis")
    assert rows.count() == len(diags)
    first = diags[0]
    text = rows.first.inner_text()
    assert first["action"] in text and first["title"] in text
    # the verdict line above them names the top one; the badge says what it means
    verdict = page.locator(".gw-verdict").inner_text().strip()
    assert verdict == kernel(page, "print(panel.verdict)").strip() and verdict.startswith(first["priority"])
    badge = page.locator(".gw-live")
    assert badge.get_attribute("title").startswith(badge.inner_text().replace("●", "").strip() + ":")
    if first["layers"]:
        assert first["layers"][0] in text
    rows.first.click()
    page.wait_for_function(f"() => {VIEW}.layer === {first['layer_index']}")
    if first["first_step"] is not None:
        step = page.evaluate(f"() => {{ const v = {VIEW}; return v.colSteps[v.cursor]; }}")
        assert step <= first["first_step"]
        assert page.evaluate(
            f"() => {{ const v = {VIEW}; return v.cursor + 1 >= v.meta.cols || v.colSteps[v.cursor + 1] > {first['first_step']}; }}"
        )
    page.wait_for_timeout(300)
    assert int(kernel(page, "print(panel.layer)")) == first["layer_index"]


def test_the_table_groups_by_health_and_says_each_action_once(page):
    """Unsorted, the table lists Critical rows first and Healthy ones last, a diagnosis' action
    shows once for its rows (not repeated with a layer name in front), and every name stays on
    one line (its full name in the tooltip)."""
    import json

    rank = json.loads(kernel(page, "from gradwidget.panel.protocol import HEALTH_RANK; print(json.dumps(HEALTH_RANK))"))
    table = json.loads(kernel(page, "print(json.dumps(panel.table))"))
    shown = page.evaluate(
        """() => Array.from(document.querySelectorAll('table.gw-health tbody tr')).map(tr => ({
            layer: tr.dataset.layer, health: tr.querySelector('.gw-badge').textContent,
            name: tr.querySelector('td.gw-name').title,
            lines: (() => { const rg = document.createRange(); rg.selectNodeContents(tr.querySelector('td.gw-name'));
                            return new Set(Array.from(rg.getClientRects()).map(b => Math.round(b.bottom))).size; })(),
            said: (tr.querySelector('td.gw-suggestion') || {}).textContent || ''}))"""
    )
    assert len(shown) == len(table)
    ranks = [rank[r["health"]] for r in shown]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) >= 2  # the demo: starved and healthy layers
    actions = {r["suggestion"] for r in table if r.get("suggestion")}
    assert actions
    for a in actions:  # once per diagnosis and health: on the first of its rows
        groups = {r["health"] for r in table if r.get("suggestion") == a}
        assert 1 <= sum(r["said"] == a for r in shown) <= len(groups)
    assert not any(r["said"].startswith(r["layer"] + ":") for r in shown)
    assert all(r["name"] == r["layer"] for r in shown)
    assert {r["lines"] for r in shown} == {1}  # no name wraps onto a second line
    page.locator(".gw-table").first.screenshot(path=str(ARTIFACTS / "panel_health_table.png"))


def test_the_logged_loss_is_drawn_under_the_cursor(page):
    """The demo logs its loss: the panel draws it over steps, and the curve moves with the cursor."""
    assert page.evaluate("() => getComputedStyle(document.querySelector('canvas.gw-loss')).display") != "none"
    before = page.evaluate(CANVAS_HASH_JS, "canvas.gw-loss")
    assert before["painted"] > 500
    was, cols = page.evaluate(f"() => [{VIEW}.cursor, {VIEW}.meta.cols]")
    to = 0 if was > cols // 2 else cols - 1
    page.evaluate(f"() => {VIEW}.scrub({to})")
    page.wait_for_function(f"() => {VIEW}.cursor === {to}")
    assert cols > 1 and page.evaluate(CANVAS_HASH_JS, "canvas.gw-loss")["hash"] != before["hash"]
    page.evaluate(f"() => {VIEW}.scrub({was})")  # where the tests below expect it
    page.wait_for_function(f"() => {VIEW}.cursor === {was}")
    page.wait_for_timeout(300)


def test_resizing_the_cell_redraws_at_the_new_width(page):
    out = page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first
    wide = page.evaluate(f"() => [{VIEW}.layout.width, {VIEW}.canvas.width]")
    cols = int(kernel(page, "print(panel.columns)"))
    try:
        page.set_viewport_size({"width": 600, "height": 1000})  # leaves the panel < 560 px: stacked
        page.wait_for_function(f"() => {VIEW}.layout.width < {wide[0]} - 300")
        page.wait_for_timeout(300)
        narrow = page.evaluate(f"() => [{VIEW}.layout.width, {VIEW}.canvas.width, {VIEW}.layout.stacked]")
        assert narrow[1] < wide[1] and narrow[2] is True, (wide, narrow)  # bars go under the heatmap
        px = page.evaluate(HEAT_PIXELS_JS)
        assert px["opaque"] == px["total"] and px["colours"] >= 20, px
        # the panel fits the output area (no horizontal overflow) and asked for fewer columns
        fit = page.evaluate(f"""() => {{ const r = {VIEW}.root, right = r.getBoundingClientRect().right;
            const out = Array.from(r.querySelectorAll('*')).filter(e => e.getBoundingClientRect().right > right + 1
                                                                     && !e.closest('.gw-table-scroll'));
            return [r.scrollWidth, r.clientWidth, out.slice(0, 5).map(e => e.tagName + '.' + e.className)]; }}""")
        assert fit[0] <= fit[1] + 1, fit  # [scrollWidth, clientWidth, what sticks out]
        page.wait_for_function(
            f"""async () => Number((await ({KERNEL_EXEC_JS})("print(panel.columns)")).trim()) < {cols}"""
        )
        out.screenshot(path=str(ARTIFACTS / "panel_narrow.png"))
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})
    page.wait_for_function(f"() => {VIEW}.layout.width >= {wide[0]} - 2")
    page.wait_for_timeout(300)
    px = page.evaluate(HEAT_PIXELS_JS)
    assert px["opaque"] == px["total"], px


def test_colour_range_is_the_kernels(page):
    """The heatmap's colour range is the one the kernel sent (the static figures' range)."""
    sent, used = page.evaluate(f"() => [{VIEW}.meta.scale, [{VIEW}.scale.lo, {VIEW}.scale.hi]]")
    assert sent == pytest.approx(used)
    lo, hi = (
        float(x)
        for x in kernel(
            page, "from gradwidget import plots; print(*plots.color_scale(panel.run, panel.metric))"
        ).split()
    )
    assert sent == pytest.approx([lo, hi], rel=1e-6)


def while_training(page, done: str, read: str) -> list:
    """[whether ``done`` came true while the kernel was busy, *``read``]: waits (generously: a loaded
    machine may take seconds to draw) until ``done`` holds or the kernel is idle, and reads both from
    the same poll. JavaScript expressions over ``v``, the first panel's view."""
    return page.wait_for_function(
        f"""() => {{ const v = {VIEW}, busy = !({KERNEL_IDLE_JS})(), done = !!({done});
            return (done || !busy) && [done && busy, ...{read}]; }}""",
        timeout=TIMEOUT_MS,
    ).json_value()


def test_clicks_and_scrubs_apply_at_once_while_the_cell_trains(page):
    """A training loop in a cell keeps the kernel from reading browser messages until it ends:
    the page must still show a clicked layer (row, histogram) and a scrubbed cursor at once, keep
    them while the busy kernel sends newer steps, and the kernel takes them when the cell ends."""
    kernel(page, "panel.step = int(panel.run.steps[-1])")  # following again
    page.wait_for_function(f"() => {{ const v = {VIEW}; return v.cursor === v.meta.cols - 1; }}")
    start = page.evaluate(f"() => {VIEW}.meta.n_steps")
    before_layer = int(kernel(page, "print(panel.layer)"))
    page.evaluate(RUN_CELL_JS, 2)
    page.wait_for_function(f"() => !({KERNEL_IDLE_JS})() && {VIEW}.meta.n_steps > {start} + 5")
    target = page.evaluate(f"""() => {{
        const rows = Array.from(document.querySelectorAll('table.gw-health tbody tr'));
        const r = rows.find(tr => Number(tr.dataset.index) !== {before_layer} && tr.dataset.layer.endsWith('weight'));
        return {{index: Number(r.dataset.index), layer: r.dataset.layer}}; }}""")
    hist_before = page.evaluate(CANVAS_HASH_JS, "canvas.gw-hist")
    page.locator(f"table.gw-health tbody tr[data-index='{target['index']}']").click()
    # drawn while the cell still trains (from every layer's newest histogram), not when it ends
    drawn = f"v.histShown && v.histShown.layer === {target['index']}"
    shown = while_training(page, drawn, "[v.layer, v.histShown && v.histShown.source]")
    assert shown == [True, target["index"], "newest"], shown
    assert page.locator("table.gw-health tr.gw-selected").get_attribute("data-layer") == target["layer"]
    hist_now = page.evaluate(CANVAS_HASH_JS, "canvas.gw-hist")
    assert hist_now["hash"] != hist_before["hash"] and hist_now["painted"] > 500
    # scrub to the first column while the kernel, still following, keeps sending newer steps
    page.locator(".gw-root").focus()
    page.keyboard.press("Home")
    assert page.evaluate(f"() => {VIEW}.cursor") == 0
    n0 = page.evaluate(f"() => {VIEW}.meta.n_steps")
    state = while_training(page, f"v.meta.n_steps > {n0} + 3", "[v.cursor, v.layer]")  # updates kept coming
    assert state == [True, 0, target["index"]], state  # neither was pulled back
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_clicked_while_training.png")
    )
    # the cell ends: the kernel takes both, and sends the layer's histograms over time
    page.wait_for_function(KERNEL_IDLE_JS)
    first = page.evaluate(f"() => {VIEW}.colSteps[0]")
    page.wait_for_function(f"""async () => (await ({KERNEL_EXEC_JS})("print(panel.layer, panel.step, panel.follow)")).trim()
                               === "{target["index"]} {int(first)} False" """)
    # until the layer's histograms arrive the pane says so, and shows none (histShown null)
    page.wait_for_function(f"() => {{ const v = {VIEW}; return v.histShown?.source === 'layer' && v.cursor === 0; }}")


def test_empty_and_all_non_finite_runs_say_so(page):
    page.evaluate(RUN_CELL_JS, 3)
    page.wait_for_function("() => document.querySelectorAll('.gw-root').length >= 3")
    page.wait_for_function(KERNEL_IDLE_JS)
    roots = page.locator(".gw-root")
    n = roots.count()
    empty, bad = roots.nth(n - 2), roots.nth(n - 1)
    page.wait_for_function(
        "() => { const r = document.querySelectorAll('.gw-root'); "
        "return r[r.length - 1].querySelector('.gw-message').textContent.length > 0; }"
    )
    assert "empty" in empty.locator(".gw-message").inner_text()
    msg = bad.locator(".gw-message")
    assert "Non-finite gradients" in msg.inner_text() and "a, b" in msg.inner_text()
    assert "gw-error" in msg.get_attribute("class") and msg.is_visible()
    bad.screenshot(path=str(ARTIFACTS / "panel_all_nonfinite.png"))


def test_a_panel_of_many_tensors_expands_and_collapses_a_group_through_the_kernel(page):
    """Past the row cap: group rows; the table's ▸ sends ``expanded`` to the kernel, whose update puts
    the group's members in its place; their ▾ folds them back. A member the loss cannot move reads
    so, with why in its badge's tooltip."""
    n = page.evaluate("() => document.querySelectorAll('.gw-root').length")
    page.evaluate(RUN_CELL_JS, 4)
    page.wait_for_function(f"() => document.querySelectorAll('.gw-root').length > {n}")
    page.wait_for_function(KERNEL_IDLE_JS)
    big = "Array.from(document.querySelectorAll('.gw-root')).pop()"
    view = f"{big}.parentElement.gradwidget"
    page.wait_for_function(f"() => {view}.meta.rows === 75 && {view}.image.rows === 75")
    assert page.evaluate(f"() => {view}.meta.layers[3].name") == "blocks.3 (6 tensors)"
    root = page.locator(".gw-root").last
    root.scroll_into_view_if_needed()
    root.locator("table.gw-health tr[data-index='18'] button.gw-toggle").click()
    page.wait_for_function(f"() => {view}.meta.rows === 80")
    assert kernel(page, "print(big_panel.expanded, big_panel.meta['rows'])").strip() == "[[18, 24]] 80"
    names = page.evaluate(f"() => {view}.meta.layers.slice(3, 9).map(l => l.name)")
    assert names == [f"blocks.3.lin{k}.{p}" for k in range(3) for p in ("weight", "bias")]
    member = root.locator("table.gw-health tr[data-layer='blocks.3.lin1.weight']")
    assert member.count() == 1 and member.locator("button.gw-toggle").inner_text() == "▾"
    assert member.locator(".gw-badge").inner_text() == "Healthy"
    assert root.locator(".gw-count").inner_text() == "80 of 80 rows · 450 layers"
    # its bias is listed after the Healthy rows, as the one that cannot move, with why in the tooltip
    root.locator("input.gw-filter").fill("cannot move")
    inert = root.locator("table.gw-health tbody tr")
    page.wait_for_function(f"() => {big}.querySelectorAll('table.gw-health tbody tr').length === 1")
    assert inert.get_attribute("data-layer") == "blocks.3.lin1.bias"
    note = kernel(page, "from gradwidget.rules import CANNOT_MOVE_WHY; print(CANNOT_MOVE_WHY)").strip()
    badge = inert.locator(".gw-badge")
    assert badge.inner_text() == "Cannot move" and badge.get_attribute("title") == note
    root.locator("input.gw-filter").fill("")
    root.screenshot(path=str(ARTIFACTS / "panel_many_tensors_expanded.png"))
    member.locator("button.gw-toggle").click()
    page.wait_for_function(f"() => {view}.meta.rows === 75")
    assert kernel(page, "print(big_panel.expanded)").strip() == "[]"


def test_the_cursor_follows_the_last_action_and_the_cell_end_updates_the_saved_output(page):
    """Click step 8, then End (follow training) while the cell trains: when the cell ends the
    cursor stays on the newest step (it jumped back to 8: the kernel read "follow" with the step
    the page had when End was pressed, and took the stale step for a scrub); the static panel of
    the trained run is kept; one view, which kept what the user set (the table's filter)."""
    kernel(page, "panel.step = int(panel.run.steps[-1])")  # following
    page.wait_for_function(f"() => {{ const v = {VIEW}; return v.cursor === v.meta.cols - 1; }}")
    start = page.evaluate(f"() => {VIEW}.meta.n_steps")
    page.evaluate(RUN_CELL_JS, 5)
    page.wait_for_function(f"() => !({KERNEL_IDLE_JS})() && {VIEW}.meta.n_steps > {start} + 5")
    page.locator("input.gw-filter").first.fill("weight")
    assert page.evaluate(f"() => {VIEW}.table.state().filter") == "weight"  # typed into this panel (no dialog took it)
    page.locator(".gw-root").first.focus()
    page.keyboard.press("Home")
    for _ in range(8):
        page.keyboard.press("ArrowRight")
    assert page.evaluate(f"() => {VIEW}.cursor") == 8
    page.wait_for_timeout(300)
    page.keyboard.press("End")
    page.wait_for_function(KERNEL_IDLE_JS, timeout=TIMEOUT_MS)
    last = int(kernel(page, "print(int(panel.run.steps[-1]))"))
    page.wait_for_function(
        f"async () => (await ({KERNEL_EXEC_JS})('print(panel.step, panel.follow)')).trim() === '{last} True'"
    )
    # the output of cell 0, shown before training, gets the static panel of the trained run (the
    # analysis thread updates it after the cell; JupyterLab's kernel connection forwards an update
    # to every cell that showed its display id): a notebook saved without widget state shows it
    page.wait_for_function(
        f"(i) => ({OUTPUT_HTML_JS})(i).some(h => h.includes('cursor at step {last}'))", arg=0, timeout=TIMEOUT_MS
    )
    # the updated output re-renders and its new view takes over the old one's state (when the page
    # gets to it: a busy page detaches the old view late) and reads the queued page messages
    one_view = f"""() => {{ const roots = document.querySelectorAll('.jp-Notebook .jp-Cell:first-child .gw-root');
        const v = roots.length === 1 ? {VIEW} : null;
        return !!v && v.cursor === v.meta.cols - 1; }}"""
    took_over = f"() => ({one_view})() && document.querySelector('input.gw-filter').value === 'weight'"
    page.wait_for_function(one_view, timeout=TIMEOUT_MS)
    page.wait_for_function(took_over, timeout=TIMEOUT_MS)
    state = page.evaluate(
        f"""() => {{ const v = {VIEW}; return [v.cursor, v.meta.cols - 1, v.meta.last_step,
        document.querySelectorAll('.jp-Notebook .jp-Cell:first-child .gw-root').length,
        document.querySelector('input.gw-filter').value, document.activeElement === v.root]; }}"""
    )
    assert state[0] == state[1] and state[2] == last, state
    assert state[3] == 1, state
    assert state[4] == "weight", state
    assert state[5], state  # the new view has the keyboard focus the old one had (End was pressed on it)
    # the static panel of the trained run is in the widget state too (what --to gradwidget shows),
    # and in the saved file's first output
    saved = page.evaluate(f"() => String({VIEW}.model.get('static_html'))")
    assert "gradwidget-diagnoses" in saved and f"cursor at step {last}" in saved, saved[:300]
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    nb = nbformat.read(Path(kernel(page, "import os; print(os.getcwd())").strip()) / "panel.ipynb", as_version=4)
    first = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[0].outputs)
    assert f"cursor at step {last}" in first and "gradwidget-diagnoses" in first
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "panel_after_cell.png")
    )
