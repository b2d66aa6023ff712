"""Front-end benchmark: redraw time on scrub in Chromium, and bytes sent for a long run.

    python bench/frontend.py [--layers 1000] [--columns 2048] [--steps 100000] [--scrubs 300]

1. Scrub: loads the built bundle (gradwidget/static/widget.js) into headless Debian Chromium with a
   model object holding a synthetic layers x columns heatmap (log-normal values fading toward the
   input, some flagged cells), then moves the cursor to random columns and times the synchronous
   redraw (heatmap blit + cursor, 1 bar per layer, layer names, histogram, series). Also times a
   data update (re-colouring every cell). Target: median scrub redraw < 16 ms (one frame at 60 Hz).
   The same for a comparison of two runs (GradientPanel.compare, 2 x layers x columns), side by
   side and as the difference map.
2. Bytes: a GradientPanel on a 100,000-step Run (the demo's 24 layers); counts the bytes of one
   full update message (binary buffers + JSON state) as ipywidgets would send it.
Prints a JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

BUNDLE = ROOT / "gradwidget" / "static" / "widget.js"

PAGE_JS = """async ({code, rows, cols, scrubs, compare}) => {
  const url = URL.createObjectURL(new Blob([code], {type: 'text/javascript'}));
  const mod = await import(url);
  // synthetic data: layer j (depth order) has values ~ 10^(-9 + 8 j / rows), noisy over steps
  const heat = new Float32Array(rows * cols);
  const flags = new Uint8Array(rows * cols);
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  for (let j = 0; j < rows; j++) for (let c = 0; c < cols; c++) {
    const e = -9 + 8 * j / rows + 0.5 * (rnd() - 0.5) + 0.3 * Math.sin(c / 50);
    heat[j * cols + c] = Math.pow(10, e);
    if (e < -7) flags[j * cols + c] |= 1;
    if (rnd() < 1e-4) flags[j * cols + c] |= 4;
  }
  const colSteps = new Float64Array(cols).map((_, i) => i * 49);
  const hists = new Uint32Array(128 * 64).map((_, i) => ((i % 64) > 20 && (i % 64) < 40) ? 1000 + (i % 17) * 50 : 0);
  const histSteps = new Float64Array(128).map((_, i) => i * 780);
  const layers = Array.from({length: rows}, (_, j) => ({name: `blocks.${j >> 2}.layer${j % 4}.weight`, module_type: 'Linear', status: 'trainable', numel: 4096}));
  const state = {
    meta: {n_layers: rows, n_steps: cols * 49, rows, cols, layers, metric: 'mean_abs',
           metrics: ['grad_norm', 'mean_abs', 'max_abs', 'std', 'zero_frac', 'nonfinite', 'weight_norm', 'update_norm'],
           thresholds: {vanishing: 1e-7, exploding: 1e3}, first_step: 0, last_step: (cols - 1) * 49,
           hist_lo: -15.05, hist_hi: 4.21, n_bins: 64, block: 49, message: '', level: '', version: 1},
    heat: new DataView(heat.buffer), flags: new DataView(flags.buffer), col_steps: new DataView(colSteps.buffer),
    loss: new DataView(new Float32Array(cols).fill(0.5).buffer), detail: new DataView(new ArrayBuffer(0)),
    detail_step: -1, hists: new DataView(hists.buffer), hist_steps: new DataView(histSteps.buffer), hist_layer: 3,
    table: layers.map((l, j) => ({index: j, layer: l.name, module_type: 'Linear', numel: 4096, health: j < rows / 4 ? 'Critical' : 'Healthy',
                                  grad_norm_median: 1e-3, mean_abs_median: 1e-5, max_abs_max: 1e-2})),
    static_png: '', live: true, step: 0, layer: 3, metric: 'mean_abs', follow: false, columns: cols,
  };
  if (compare) {  // GradientPanel.compare: a later run on the same grid (10x the gradient), its log ratio
    const heatB = heat.map((v, i) => v * 10 * (1 + 0.2 * Math.sin(i)));
    const diff = heatB.map((v, i) => Math.log10(v / heat[i]));
    Object.assign(state, {heat_b: new DataView(heatB.buffer), flags_b: new DataView(new Uint8Array(rows * cols).buffer),
      diff: new DataView(diff.buffer), labels: ['before', 'after'], mode: compare});
    state.meta.diff_max = 1.3;
    state.detail = new DataView(new ArrayBuffer(0));
    state.hists = new DataView(new ArrayBuffer(0));
    state.hist_steps = new DataView(new ArrayBuffer(0));
  }
  const model = {get: (k) => state[k], set: (k, v) => { state[k] = v; }, save_changes() {}, on() {}, off() {}};
  const el = document.createElement('div');
  el.style.width = '1200px';
  document.body.append(el);
  const t0 = performance.now();
  mod.default.render({model, el});
  const view = el.gradwidget;
  const first = view.draw();  // builds the heatmap image
  const firstMs = performance.now() - t0;
  await new Promise(r => requestAnimationFrame(() => r()));
  const times = [];
  for (let i = 0; i < scrubs; i++) {
    view.cursor = Math.floor(rnd() * cols);
    times.push(view.draw());
  }
  const rebuild = [];
  for (let i = 0; i < 5; i++) { view.loadData(); rebuild.push(view.draw()); }
  times.sort((a, b) => a - b);
  rebuild.sort((a, b) => a - b);
  return {first_render_ms: firstMs, first_draw_ms: first, scrub_ms: times,
          median_ms: times[times.length >> 1], p95_ms: times[Math.floor(times.length * 0.95)],
          data_update_median_ms: rebuild[2], image: [view.image.rows, view.image.cols],
          image_b: view.imageB ? [view.imageB.rows, view.imageB.cols] : null,
          canvas: [view.canvas.width, view.canvas.height]};
}"""


def scrub_benchmark(rows: int, cols: int, scrubs: int, compare: str = "") -> dict:
    """``compare``: "" (one run), "side" or "diff" (a comparison of two runs, GradientPanel.compare)."""
    from gw_browser import ARGS, CHROMIUM, need_chromium  # noqa: F401
    from playwright.sync_api import sync_playwright

    if not BUNDLE.is_file():
        raise SystemExit(f"{BUNDLE} is missing: run `pip install -e .` (or `npm --prefix js run build`) first")
    code = BUNDLE.read_text()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000}, device_scale_factor=1)
            page.set_content("<!doctype html><html><body style='margin:0'></body></html>")
            res = page.evaluate(
                PAGE_JS, {"code": code, "rows": rows, "cols": cols, "scrubs": scrubs, "compare": compare}
            )
            res["browser"] = browser.version
        finally:
            browser.close()
    res.pop("scrub_ms")
    return res


def payload_bytes(steps: int, columns: int, layers: int = 24) -> dict:
    from ipywidgets.widgets.widget import _remove_buffers

    from gradwidget.run import METRICS, N_BINS, Run
    from gradwidget import GradientPanel

    names = [f"{i}.{'weight' if i % 2 == 0 else 'bias'}" for i in range(layers)]
    run = Run(names)
    rng = np.random.default_rng(0)
    scale = np.logspace(-9, -1, layers)
    t0 = time.perf_counter()
    for s in range(steps):
        v = np.empty((len(METRICS), layers), np.float32)
        g = scale * (1 + 0.1 * rng.standard_normal(layers))
        v[:] = g
        v[METRICS.index("nonfinite")] = 0
        hist = None
        if s % 10 == 0:
            hist = np.zeros((layers, N_BINS), np.uint32)
            hist[:, 20:30] = 50
        run.append(s, v, {"loss": 1.0 / (1 + s)}, hist=hist)
    build_s = time.perf_counter() - t0
    panel = GradientPanel(run, columns=columns)
    panel._analysis.wait(600)  # a run this size has its health table from the analysis thread
    t0 = time.perf_counter()
    panel._sync.push(force=True)
    push_ms = (time.perf_counter() - t0) * 1e3
    data_keys = [
        "meta",
        "heat",
        "flags",
        "col_steps",
        "loss",
        "detail",
        "detail_step",
        "hists",
        "hist_steps",
        "hist_layer",
        "table",
        "step",
        "layer",
    ]
    state = panel.get_state(data_keys)
    st, _, buffers = _remove_buffers(state)
    buf_bytes = sum(len(bytes(b)) for b in buffers)
    json_bytes = len(json.dumps(st, default=str))
    state_nt = panel.get_state([k for k in data_keys if k != "table"])
    st2, _, b2 = _remove_buffers(state_nt)
    live_bytes = sum(len(bytes(b)) for b in b2) + len(json.dumps(st2, default=str))
    return {
        "steps": steps,
        "layers": layers,
        "columns_requested": columns,
        "cols_sent": panel.meta["cols"],
        "steps_per_column": panel.meta["block"],
        "binary_bytes": buf_bytes,
        "json_bytes": json_bytes,
        "full_update_bytes": buf_bytes + json_bytes,
        "live_update_bytes_without_table": live_bytes,
        "raw_metrics_bytes": int(run.metric("mean_abs").nbytes * len(METRICS)),
        "push_ms": round(push_ms, 2),
        "build_run_s": round(build_s, 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1000)
    ap.add_argument("--columns", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--scrubs", type=int, default=300)
    args = ap.parse_args(argv)
    scrub = scrub_benchmark(args.layers, args.columns, args.scrubs)
    print(
        f"scrub redraw, {args.layers} layers x {args.columns} columns: median {scrub['median_ms']:.2f} ms, "
        f"p95 {scrub['p95_ms']:.2f} ms (target < 16 ms); data update {scrub['data_update_median_ms']:.1f} ms; "
        f"first render {scrub['first_render_ms']:.1f} ms",
        file=sys.stderr,
    )
    compared = {m: scrub_benchmark(args.layers, args.columns, args.scrubs, m) for m in ("side", "diff")}
    for m, r in compared.items():
        print(
            f"comparison scrub redraw ({m}), 2 x {args.layers} layers x {args.columns} columns: median "
            f"{r['median_ms']:.2f} ms, p95 {r['p95_ms']:.2f} ms (target < 16 ms); data update "
            f"{r['data_update_median_ms']:.1f} ms; first render {r['first_render_ms']:.1f} ms",
            file=sys.stderr,
        )
    sizes = {c: payload_bytes(args.steps, c) for c in (args.columns, 1024)}
    for c, s in sizes.items():
        print(
            f"{s['steps']:,}-step run, {s['layers']} layers, columns={c}: {s['cols_sent']} columns x "
            f"{s['steps_per_column']} steps; full update {s['full_update_bytes']:,} bytes "
            f"({s['binary_bytes']:,} binary + {s['json_bytes']:,} JSON); live update without the table "
            f"{s['live_update_bytes_without_table']:,} bytes; raw metrics {s['raw_metrics_bytes']:,} bytes; "
            f"built in {s['push_ms']} ms",
            file=sys.stderr,
        )
    print(json.dumps({"scrub": scrub, "compare_scrub": compared, "bytes": {str(k): v for k, v in sizes.items()}}))
    return 0 if max([scrub["median_ms"]] + [r["median_ms"] for r in compared.values()]) < 16 else 1


if __name__ == "__main__":
    raise SystemExit(main())
