"""The panel's noise-scale chart in headless Chromium: the built bundle rendered with the traits a real
GradientPanel sends (a run with gradient accumulation), its canvas read back pixel by pixel; a run
without the gradient at two batch sizes hides the chart and says why in words."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gw_browser import offline_page  # noqa: E402

BUNDLE = Path(__file__).resolve().parents[2] / "gradwidget" / "static" / "widget.js"

RENDER_JS = """async ({code, state}) => {
  const url = URL.createObjectURL(new Blob([code], {type: 'text/javascript'}));
  const mod = await import(url);
  for (const [k, v] of Object.entries(state)) {
    if (v && v.b64 !== undefined) {
      const bin = atob(v.b64);
      const bytes = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
      state[k] = new DataView(bytes.buffer);
    }
  }
  const model = {get: (k) => state[k], set: (k, v) => { state[k] = v; }, save_changes() {}, on() {}, off() {}};
  const el = document.createElement('div');
  el.style.width = '1200px';
  document.body.append(el);
  mod.default.render({model, el});
  const view = el.gradwidget;
  view.draw();
  const c = view.dom.noiseCanvas;
  const text = view.dom.noiseText;
  const shown = c.style.display !== 'none';
  let accent = 0, batch = 0;
  if (shown && c.width > 1) {
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < px.length; i += 4) {
      const [r, g, b, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
      if (a > 200 && b > 150 && r < 100) accent++;         // B_simple (the theme's blue accent)
      if (a > 200 && r > 180 && g < 120 && b < 80) batch++;  // the dashed batch line (#d84315)
    }
  }
  return {shown, accent, batch, text: view.dom.noiseBody.textContent, textShown: text.style.display !== 'none',
          open: text.open};
}"""


def panel_state(run) -> dict:
    from gradwidget.panel.protocol import TRAITS
    from gradwidget.panel.widget import GradientPanel

    p = GradientPanel(run)
    assert p.report is not None  # the analysis (and with it the noise traits) has run
    state = {}
    for name, t in TRAITS.items():
        if t.owner != "panel":  # a comparison's own
            continue
        v = getattr(p, name)
        state[name] = {"b64": base64.b64encode(v).decode()} if t.kind == "bytes" else v
    return state


def accumulated_run(micro: int):
    from gradwidget.collect.torch import Recorder

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 10, generator=g)
    Y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long()
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(model, opt)
    for _ in range(40):
        opt.zero_grad()
        for _ in range(micro):
            idx = torch.randint(0, 400, (16,), generator=g)
            (torch.nn.functional.cross_entropy(model(X[idx]), Y[idx]) / micro).backward()
        opt.step()
    rec.detach()
    return rec.run


@pytest.mark.browser
def test_the_noise_chart_is_drawn_and_hidden_without_a_measurement():
    if not BUNDLE.is_file():
        pytest.skip("the bundle is not built (npm --prefix js run build)")
    code = BUNDLE.read_text()
    with offline_page() as (page, blocked):
        page.set_content("<!doctype html><html><body style='margin:0'></body></html>")
        drawn = page.evaluate(RENDER_JS, {"code": code, "state": panel_state(accumulated_run(2))})
        hidden = page.evaluate(RENDER_JS, {"code": code, "state": panel_state(accumulated_run(1))})
    assert drawn["shown"] and drawn["accent"] > 50 and drawn["batch"] > 20, drawn
    assert drawn["textShown"] and drawn["text"].startswith("Gradient noise scale B_simple")
    assert not hidden["shown"] and hidden["textShown"] and "only one batch size" in hidden["text"]
    # behind a disclosure (closed at first), and without a path into the source tree's docs
    assert not hidden["open"] and "docs/" not in hidden["text"] and "split_backward" in hidden["text"]
    assert not blocked
