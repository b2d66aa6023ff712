"""The comparison panel end to end: a real JupyterLab and kernel, the demo's vanishing
sigmoid MLP before and after the fix (ReLU), GradientPanel.compare in Debian's Chromium. Scrubbing
moves the cursor of both heatmaps (canvas pixels), the difference map is drawn (its pixels are the
diverging map's), and the mode switches from the page and from Python.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/browser: lab
from lab import KERNEL_IDLE_JS, ROOT, RUN_CELL_JS, VIEW, kernel, notebook_page  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = Path(os.environ.get("GRADWIDGET_ARTIFACTS", ROOT / "test-artifacts" / "browser"))
TIMEOUT_MS = 180_000

CELLS = [
    """import torch
torch.set_num_threads(1)
from gradwidget import GradientPanel
from gradwidget.demo import build_demo, train_demo
def run(act):
    torch.manual_seed(0)
    model, opt, data = build_demo(depth=12, width=16, n_features=8, activation=act)
    return train_demo(60, model=model, optimizer=opt, data=data).run
before, after = run(torch.nn.Sigmoid), run(torch.nn.ReLU)
cmp = GradientPanel.compare(before, after, labels=["sigmoid", "relu"])
cmp""",
]

#: per heatmap rectangle of the comparison (device pixels): opaque pixels, colours, and the RGB of
#: the pixel column at the centre of ``col`` (the cursor's column when it is there).
RECTS_JS = f"""(col) => {{
  const v = {VIEW}; const c = v.canvas; const dpr = c.width / v.layout.width;
  const ctx = c.getContext('2d');
  const rects = v.layout.heat.w && v.comparing && v.mode === 'side'
    ? [0, 1].map((i) => {{ const r = v.layout.heat; const w = (r.w - 10) / 2;
        return {{x: r.x + i * (w + 10), y: r.y, w, h: r.h}}; }})
    : [v.layout.heat];
  return rects.map((r) => {{
    const x = Math.round(r.x * dpr), y = Math.round(r.y * dpr), w = Math.round(r.w * dpr), h = Math.round(r.h * dpr);
    const d = ctx.getImageData(x, y, w, h).data;
    let opaque = 0, red = 0, blue = 0, pale = 0; const colours = new Set();
    for (let i = 0; i < d.length; i += 4) {{
      if (d[i + 3] > 0) {{ opaque++; colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]); }}
      if (d[i] > d[i + 2] + 60) red++;
      if (d[i + 2] > d[i] + 60) blue++;
      if (d[i] > 235 && d[i + 1] > 235 && d[i + 2] > 235) pale++;
    }}
    const cx = Math.round((r.x + (col + 0.5) * r.w / v.meta.cols) * dpr);
    const strip = Array.from(ctx.getImageData(cx, y, 1, h).data);
    return {{opaque, total: w * h, colours: colours.size, red, blue, pale, strip: strip.join(','),
             centre: [(r.x + (col + 0.5) * r.w / v.meta.cols), r.y + r.h / 2]}};
  }});
}}"""


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with notebook_page(
        tmp_path_factory.mktemp("lab"), CELLS, app="lab", name="compare.ipynb", timeout_ms=TIMEOUT_MS
    ) as pg:
        pg.evaluate(RUN_CELL_JS, 0)
        pg.wait_for_function(
            "() => { const r = document.querySelector('.gw-root'); "
            "return r && r.parentElement.gradwidget && r.parentElement.gradwidget.comparing; }"
        )
        pg.wait_for_function(KERNEL_IDLE_JS)
        pg.wait_for_function(f"() => {VIEW}.image.canvas !== null && {VIEW}.imageB.canvas !== null")
        pg.wait_for_timeout(300)
        yield pg


def test_both_runs_are_drawn_side_by_side_on_one_scale(page):
    a, b = page.evaluate(RECTS_JS, 0)
    for r in (a, b):
        assert r["opaque"] == r["total"] and r["colours"] >= 10, r
    assert page.evaluate(f"() => [{VIEW}.labels, {VIEW}.mode, {VIEW}.dom.modeSel.style.display]") == [
        ["sigmoid", "relu"],
        "side",
        "",
    ]
    # the health table's columns are headed by the user's labels
    heads = page.evaluate("() => Array.from(document.querySelectorAll('table.gw-health th')).map(t => t.textContent)")
    assert heads[:2] == ["sigmoid health", "relu health"], heads
    # the kernel's one scale spans both runs
    lo, hi = page.evaluate(f"() => [{VIEW}.scale.lo, {VIEW}.scale.hi]")
    assert (
        kernel(
            page,
            "import numpy as np; from gradwidget.plots import shared_scale; "
            "print(np.allclose(shared_scale([before, after], cmp.metric), cmp.meta['scale']))",
        ).strip()
        == "True"
    )
    assert hi - lo > 1
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "compare_side.png")
    )


def test_scrubbing_moves_the_cursor_of_both_heatmaps(page):
    cols = page.evaluate(f"() => {VIEW}.meta.cols")
    page.keyboard.press("Escape")
    page.evaluate(f"() => {VIEW}.scrub(0)")
    page.wait_for_timeout(200)
    target = cols // 2
    before = page.evaluate(RECTS_JS, target)
    old = page.evaluate(RECTS_JS, 0)
    # a click on the later run's heatmap (the right one) scrubs both
    box = page.locator(".gw-flow").first.bounding_box()
    x, y = before[1]["centre"]
    page.mouse.click(box["x"] + x, box["y"] + y)
    page.wait_for_function(f"() => {VIEW}.cursor === {target}", timeout=10_000)
    after = page.evaluate(RECTS_JS, target)
    left = page.evaluate(RECTS_JS, 0)
    for i in (0, 1):
        assert after[i]["strip"] != before[i]["strip"], f"heatmap {i}: no cursor at the new column"
        assert left[i]["strip"] != old[i]["strip"], f"heatmap {i}: the cursor did not leave the old column"
    # the kernel got the step (the steps of both runs are aligned by number)
    step = page.evaluate(f"() => {VIEW}.colSteps[{target}]")
    page.wait_for_function(KERNEL_IDLE_JS)
    page.wait_for_timeout(300)
    assert kernel(page, "print(cmp.step)").strip() == str(int(step))


def test_the_difference_map_is_drawn_and_the_mode_switches_both_ways(page):
    page.locator(".gw-mode").first.select_option("diff")
    page.wait_for_function(f"() => {VIEW}.mode === 'diff' && {VIEW}.imageB.canvas !== null")
    page.wait_for_timeout(300)
    [d] = page.evaluate(RECTS_JS, 0)
    assert d["opaque"] == d["total"], d
    # relu's gradients are larger on the input side: red cells (the diverging map above 0)
    assert d["red"] > 0.1 * d["total"] and d["colours"] >= 10, d
    assert "log10" in page.locator(".gw-legend").first.inner_text()
    page.wait_for_function(KERNEL_IDLE_JS)
    page.wait_for_timeout(300)
    assert kernel(page, "print(cmp.mode)").strip() == "diff"
    page.locator(".jp-OutputArea-output").filter(has=page.locator(".gw-root")).first.screenshot(
        path=str(ARTIFACTS / "compare_diff.png")
    )
    kernel(page, "cmp.mode = 'side'")
    page.wait_for_function(f"() => {VIEW}.mode === 'side' && {VIEW}.dom.modeSel.value === 'side'")
    page.wait_for_timeout(300)
    assert len(page.evaluate(RECTS_JS, 0)) == 2
