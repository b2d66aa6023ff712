// GradientPanel's front end (anywidget ESM module): the scrubbable layers x steps heatmap with a
// step cursor, slider, play/pause/speed and keyboard; per-layer bars at the scrubbed step; the
// layer health table; the selected layer's histogram and metric over time.
//
// Trait protocol (Python -> JS unless noted; arrays are binary buffers, see gradwidget/widget.py):
//   meta        JSON   shape, layers, thresholds, heat metric, message, column block
//   heat        bytes  float32 (layers x columns), depth order, the heat metric decimated to columns
//   flags       bytes  uint8   (layers x columns), bit 1 vanishing, 2 exploding, 4 non-finite, 8 no data
//   col_steps   bytes  float64 (columns): first user step of each column
//   detail      bytes  float32 (metrics x layers) at detail_step (exact values for the bars)
//   hists       bytes  uint32  (histograms x bins) of hist_layer, at hist_steps (float64)
//   hist_all    bytes  uint32  (layers x bins) every layer's histogram at meta.hist_all_step
//   table       JSON   per-layer health rows
//   static_png  str    data URL of the static panel image (shown when saved state lost the buffers)
//   step, layer, metric, follow   synced both ways;   columns   JS -> Python (screen width)
//
// A click or a scrub changes this view at once (sync.ts: the user's choice is kept until the kernel
// agrees), because a kernel running a training loop in the panel's cell reads browser messages only
// when the cell ends.

import { asFloat32, asFloat64, asUint32, asUint8, Binary, byteLength, FLAG_EXPLODING, FLAG_NONFINITE, FLAG_VANISHING } from "./decode";
import { fmt, hasScale, heatScale, LogScale, rgbCss, VIRIDIS, MARKS } from "./colormap";
import { backwardOrder, colForStep, reorderRows } from "./decimate";
import { HeatmapImage, drawCursor, drawGutter, drawRowSelection, drawStepAxis } from "./heatmap";
import { barScale, drawBars, thresholdsFor } from "./bars";
import { drawHistogram, nearestIndex } from "./hist";
import { drawSeries } from "./series";
import { HealthTable, Row } from "./table";
import { bottomLayout, colAt, fitCanvas, mainLayout, MainLayout, rowAt, wantedColumns } from "./layout";
import { readTheme, Theme } from "./theme";
import { installStyle } from "./style";
import { Intent } from "./sync";

export interface Model {
  get(key: string): any;
  set(key: string, value: unknown): void;
  save_changes(): void;
  on(event: string, cb: (...args: any[]) => void): void;
  off(event?: string | null, cb?: ((...args: any[]) => void) | null): void;
}

export interface LayerMeta {
  name: string;
  module_type?: string;
  status?: string;
  numel?: number;
}

export interface Meta {
  n_layers: number;
  n_steps: number;
  rows: number;
  cols: number;
  layers: LayerMeta[];
  metric: string;
  metrics: string[];
  metric_labels?: Record<string, string>;
  thresholds: { vanishing: number; exploding: number };
  first_step: number;
  last_step: number;
  hist_lo: number;
  hist_hi: number;
  n_bins: number;
  block: number;
  message: string;
  level: string;
  version: number;
  /** [lo, hi] log10 colour range computed by the kernel (gradwidget.plots.color_range) */
  scale?: [number, number];
  /** step of hist_all (-1: none) */
  hist_all_step?: number;
}

export const METRIC_LABELS: Record<string, string> = {
  grad_norm: "gradient L2 norm",
  mean_abs: "mean |g|",
  max_abs: "max |g|",
  std: "std of g",
  zero_frac: "fraction of zeros",
  nonfinite: "non-finite entries",
  weight_norm: "weight L2 norm",
  update_norm: "update L2 norm",
};

const SPEEDS = [0.25, 0.5, 1, 2, 4];
const STEP_SEND_MS = 60;

function emptyMeta(): Meta {
  return {
    n_layers: 0, n_steps: 0, rows: 0, cols: 0, layers: [], metric: "mean_abs", metrics: [],
    thresholds: { vanishing: 1e-7, exploding: 1e3 }, first_step: 0, last_step: 0, hist_lo: 0,
    hist_hi: 1, n_bins: 0, block: 1, message: "", level: "", version: 0,
  };
}

function h<K extends keyof HTMLElementTagNameMap>(tag: K, cls = "", text = ""): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text) e.textContent = text;
  return e;
}

export class PanelView {
  // data
  meta: Meta = emptyMeta();
  heat: Float32Array = new Float32Array(0); // depth order, rows x cols
  flags: Uint8Array = new Uint8Array(0);
  dispHeat: Float32Array = new Float32Array(0); // display (backward) order
  dispFlags: Uint8Array = new Uint8Array(0);
  colSteps: Float64Array = new Float64Array(0);
  loss: Float32Array = new Float32Array(0);
  detail: Float32Array = new Float32Array(0);
  detailStep = -1;
  hists: Uint32Array = new Uint32Array(0);
  histSteps: Float64Array = new Float64Array(0);
  histLayer = -1;
  histAll: Uint32Array = new Uint32Array(0); // layers x bins, newest histogram step
  /** what the histogram shows: the layer, its step, and whether from the kernel's per-layer
   *  series ("layer") or every layer's newest histogram ("newest") */
  histShown: { layer: number; step: number; source: string } | null = null;
  intent = new Intent();
  order: Int32Array = new Int32Array(0); // display row -> depth index
  scale: LogScale = { lo: -1, hi: 0 };
  image = new HeatmapImage();
  // view state
  cursor = 0;
  layer = -1;
  playing = false;
  speed = 1;
  theme: Theme;
  layout: MainLayout | null = null;
  lastDrawMs = 0;
  private imageDirty = true;
  private raf = 0;
  private playRaf = 0;
  private playT = 0;
  private playPos = 0;
  private sendTimer: ReturnType<typeof setTimeout> | null = null;
  private toSend: { step: number; follow: boolean } | null = null;
  private ownSet = false; // our own model.set() fires change events too: they are not the kernel's
  private kernelKeys: Set<string> | null = null; // keys of the kernel's update being applied
  private lastSent = 0;
  private disposers: (() => void)[] = [];
  // DOM
  root: HTMLDivElement;
  canvas: HTMLCanvasElement;
  histCanvas: HTMLCanvasElement;
  seriesCanvas: HTMLCanvasElement;
  slider: HTMLInputElement;
  table: HealthTable;
  private info: HTMLSpanElement;
  private title: HTMLSpanElement;
  private metricSel: HTMLSelectElement;
  private playBtn: HTMLButtonElement;
  private speedSel: HTMLSelectElement;
  private live: HTMLSpanElement;
  private message: HTMLDivElement;
  private fallback: HTMLImageElement;
  private legend: HTMLDivElement;
  private tip: HTMLDivElement;
  private mainBox: HTMLDivElement;
  private bottom: HTMLDivElement;
  private plots: HTMLDivElement;

  constructor(private model: Model, private el: HTMLElement) {
    installStyle(document);
    this.root = h("div", "gw-root");
    this.root.tabIndex = 0;
    this.root.setAttribute("role", "application");
    this.root.setAttribute("aria-label", "gradient flow panel: arrows scrub steps, space plays, up/down select layers");
    const header = h("div", "gw-header");
    this.title = h("span", "gw-title", "gradwidget");
    this.metricSel = h("select", "gw-metric");
    this.metricSel.title = "metric shown in the heatmap, bars and series";
    this.playBtn = h("button", "gw-play", "▶");
    this.playBtn.title = "play / pause (space)";
    this.speedSel = h("select", "gw-speed");
    this.speedSel.title = "playback speed";
    for (const s of SPEEDS) {
      const o = h("option", "", `${s}×`);
      o.value = String(s);
      this.speedSel.append(o);
    }
    this.speedSel.value = "1";
    this.info = h("span", "gw-info");
    this.live = h("span", "gw-live", "static");
    header.append(this.title, this.metricSel, this.playBtn, this.speedSel, this.info, h("span", "gw-spacer"), this.live);
    this.message = h("div", "gw-message");
    this.message.setAttribute("role", "status");
    this.fallback = h("img", "gw-fallback");
    this.fallback.alt = "gradwidget panel (saved image)";
    this.mainBox = h("div", "gw-main");
    this.canvas = h("canvas", "gw-flow");
    this.tip = h("div", "gw-tip");
    this.mainBox.append(this.canvas, this.tip);
    const sliderRow = h("div", "gw-slider-row");
    this.slider = h("input", "gw-slider");
    this.slider.type = "range";
    this.slider.min = "0";
    this.slider.max = "0";
    this.slider.step = "1";
    this.slider.value = "0";
    this.slider.setAttribute("aria-label", "step");
    sliderRow.append(this.slider);
    this.legend = h("div", "gw-legend");
    this.bottom = h("div", "gw-bottom");
    this.table = new HealthTable((i) => this.selectLayer(i, true));
    this.plots = h("div", "gw-plots");
    this.histCanvas = h("canvas", "gw-hist");
    this.seriesCanvas = h("canvas", "gw-series");
    this.plots.append(this.histCanvas, this.seriesCanvas);
    this.bottom.append(this.table.el, this.plots);
    this.root.append(header, this.message, this.fallback, this.mainBox, sliderRow, this.legend, this.bottom);
    el.append(this.root);
    this.theme = readTheme(this.root);
    this.bind();
    this.loadAll();
  }

  // ------------------------------------------------------------------ model -> view
  private bind(): void {
    const m = this.model;
    const on = (evt: string, cb: () => void) => {
      m.on(evt, cb);
      this.disposers.push(() => m.off(evt, cb));
    };
    const data = () => {
      this.loadData();
      this.schedule();
    };
    for (const k of ["meta", "heat", "flags", "col_steps", "loss", "hist_all"]) on(`change:${k}`, data);
    const detail = () => {
      this.loadDetail();
      this.schedule();
    };
    for (const k of ["detail", "detail_step", "hists", "hist_steps", "hist_layer"]) on(`change:${k}`, detail);
    // step and layer from the kernel: decided once the whole update has been applied (one
    // synchronous set of the model), knowing whether it carried new data (see sync.ts)
    for (const k of ["meta", "step", "layer", "follow"]) on(`change:${k}`, () => this.noteKernel(k));
    on("change:metric", () => {
      this.metricSel.value = String(m.get("metric"));
      this.schedule();
    });
    on("change:table", () => this.loadTable());
    on("change:static_png", () => this.loadFallback());
    on("change:live", () => this.loadLive());

    this.metricSel.addEventListener("change", () => {
      m.set("metric", this.metricSel.value);
      m.save_changes();
    });
    this.playBtn.addEventListener("click", () => this.togglePlay());
    this.speedSel.addEventListener("change", () => (this.speed = Number(this.speedSel.value)));
    this.slider.addEventListener("input", () => this.scrub(Number(this.slider.value)));
    this.slider.addEventListener("keydown", (e) => e.stopPropagation());
    this.root.addEventListener("keydown", (e) => this.onKey(e));
    // pointer: drag on the heatmap scrubs; click selects the layer under the pointer
    let dragging = false;
    this.canvas.addEventListener("pointerdown", (e) => {
      const p = this.pointer(e);
      if (!p || !this.layout) return;
      const L = this.layout;
      if (p.inHeat || p.inBars || p.inGutter) {
        if (p.row >= 0) this.selectLayer(this.order[p.row], true);
      }
      if (p.inHeat) {
        dragging = true;
        this.canvas.setPointerCapture(e.pointerId);
        this.scrub(colAt(L.heat, this.meta.cols, p.x));
      }
      this.root.focus({ preventScroll: true });
    });
    this.canvas.addEventListener("pointermove", (e) => {
      const p = this.pointer(e);
      if (dragging && p && this.layout) this.scrub(colAt(this.layout.heat, this.meta.cols, p.x));
      this.hover(p);
    });
    const up = () => (dragging = false);
    this.canvas.addEventListener("pointerup", up);
    this.canvas.addEventListener("pointercancel", up);
    this.canvas.addEventListener("pointerleave", () => (this.tip.style.display = "none"));
    // resize with the cell, follow theme switches
    const ro = new ResizeObserver(() => {
      this.imageDirty = true;
      this.schedule();
    });
    ro.observe(this.root);
    this.disposers.push(() => ro.disconnect());
    // a theme switch flips <body> attributes before the new theme's CSS has loaded: read the
    // variables again a little later too
    const retheme = () => {
      this.theme = readTheme(this.root);
      this.updateLegend();
      this.schedule();
    };
    const timers: ReturnType<typeof setTimeout>[] = [];
    const mo = new MutationObserver(() => {
      retheme();
      for (const ms of [150, 500, 1500]) timers.push(setTimeout(retheme, ms));
    });
    this.disposers.push(() => timers.forEach(clearTimeout));
    mo.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name", "class"] });
    this.disposers.push(() => mo.disconnect());
  }

  private loadAll(): void {
    this.loadData();
    this.loadDetail();
    this.loadTable();
    this.loadFallback();
    this.loadLive();
    this.layer = Number(this.model.get("layer") ?? -1);
    this.table.select(this.layer);
    this.schedule();
  }

  private noteKernel(key: string): void {
    if (this.ownSet) return;
    if (!this.kernelKeys) {
      this.kernelKeys = new Set();
      queueMicrotask(() => this.applyKernel());
    }
    this.kernelKeys.add(key);
  }

  private applyKernel(): void {
    const keys = this.kernelKeys ?? new Set<string>();
    this.kernelKeys = null;
    const withData = keys.has("meta");
    const m = this.model;
    if (keys.has("step") || (keys.has("follow") && !withData)) {
      if (this.intent.kernelStep(Number(m.get("step")), withData)) this.cursor = this.cursorColumn();
    }
    if (keys.has("layer")) {
      const k = Number(m.get("layer"));
      if (this.intent.kernelLayer(k, withData)) {
        this.layer = k;
        this.table.select(this.layer);
      }
    }
    this.schedule();
  }

  /** The cursor's column: the user's pending scrub, else the kernel's step. */
  private cursorColumn(): number {
    return this.intent.cursor(this.meta.cols, Number(this.model.get("step")), (s) => colForStep(this.colSteps, s));
  }

  /** Decode meta + heatmap buffers; malformed data becomes a message, never an exception. */
  loadData(): void {
    const m = this.model;
    const meta = { ...emptyMeta(), ...(m.get("meta") || {}) } as Meta;
    this.meta = meta;
    try {
      const n = meta.rows * meta.cols;
      const heat: Binary = m.get("heat");
      if (n > 0 && byteLength(heat) === n * 4) {
        this.heat = asFloat32(heat, n);
        const fl: Binary = m.get("flags");
        this.flags = byteLength(fl) === n ? asUint8(fl, n) : new Uint8Array(n);
        this.colSteps = asFloat64(m.get("col_steps"), meta.cols);
        const ls: Binary = m.get("loss");
        this.loss = byteLength(ls) === meta.cols * 4 ? asFloat32(ls, meta.cols) : new Float32Array(0);
      } else {
        this.heat = new Float32Array(0);
        this.flags = new Uint8Array(0);
        this.colSteps = new Float64Array(0);
        this.loss = new Float32Array(0);
      }
    } catch (err) {
      this.heat = new Float32Array(0);
      this.flags = new Uint8Array(0);
      this.colSteps = new Float64Array(0);
      meta.message = `gradwidget could not read the data sent by the kernel: ${(err as Error).message}`;
      meta.level = "error";
    }
    const rows = this.heat.length ? meta.rows : 0;
    const cols = this.heat.length ? meta.cols : 0;
    this.order = backwardOrder(rows);
    this.dispHeat = reorderRows(this.heat, rows, cols, this.order);
    this.dispFlags = reorderRows(this.flags, rows, cols, this.order);
    this.scale = heatScale(meta.scale, this.heat);
    this.imageDirty = true;
    if (this.intent.step !== null) this.intent.kernelStep(Number(m.get("step")));
    this.cursor = this.cursorColumn();
    try {
      const ha: Binary = m.get("hist_all");
      const n = meta.n_layers * meta.n_bins;
      this.histAll = n > 0 && byteLength(ha) === n * 4 ? asUint32(ha, n) : new Uint32Array(0);
    } catch {
      this.histAll = new Uint32Array(0);
    }
    this.slider.max = String(Math.max(0, cols - 1));
    this.slider.disabled = cols <= 1;
    // metric choices
    const metrics = meta.metrics?.length ? meta.metrics : Object.keys(METRIC_LABELS);
    const current = String(m.get("metric") ?? meta.metric);
    if (this.metricSel.options.length !== metrics.length) {
      this.metricSel.textContent = "";
      for (const k of metrics) {
        const o = h("option", "", meta.metric_labels?.[k] ?? METRIC_LABELS[k] ?? k);
        o.value = k;
        this.metricSel.append(o);
      }
    }
    this.metricSel.value = current;
    this.updateMessage();
    this.updateLegend();
    this.loadFallback();
  }

  loadDetail(): void {
    const m = this.model;
    const L = this.meta.n_layers;
    try {
      const d: Binary = m.get("detail");
      this.detail = L && byteLength(d) > 0 ? asFloat32(d) : new Float32Array(0);
      this.detailStep = Number(m.get("detail_step") ?? -1);
      const hs: Binary = m.get("hists");
      this.hists = byteLength(hs) > 0 ? asUint32(hs) : new Uint32Array(0);
      const st: Binary = m.get("hist_steps");
      this.histSteps = byteLength(st) > 0 ? asFloat64(st) : new Float64Array(0);
      this.histLayer = Number(m.get("hist_layer") ?? -1);
    } catch {
      this.detail = new Float32Array(0);
      this.hists = new Uint32Array(0);
      this.histSteps = new Float64Array(0);
    }
  }

  private loadTable(): void {
    const rows = (this.model.get("table") || []) as Row[];
    this.table.setRows(rows);
    this.table.select(this.layer);
  }

  private loadFallback(): void {
    const png = String(this.model.get("static_png") || "");
    const lost = !this.heat.length && this.meta.n_steps > 0;
    const noMeta = !this.model.get("meta") || !Object.keys(this.model.get("meta")).length;
    const show = !!png && (lost || (noMeta && png.length > 0));
    if (show && this.fallback.src !== png) this.fallback.src = png;
    this.fallback.classList.toggle("gw-show", show);
    this.mainBox.style.display = show ? "none" : "";
    if (lost) this.updateMessage();
  }

  private loadLive(): void {
    const live = !!this.model.get("live");
    this.live.textContent = live ? "● live" : "static";
    this.live.classList.toggle("gw-on", live);
  }

  private updateMessage(): void {
    let text = this.meta.message || "";
    let level = this.meta.level || "warning";
    if (!this.heat.length && this.meta.n_steps > 0) {
      text =
        "The live view's data is not in this notebook's saved state (JupyterLab saves widget state without " +
        "binary buffers). Showing the saved image; re-run the cell for the live panel.";
      level = "info";
    }
    this.message.textContent = text;
    this.message.className = `gw-message gw-${level}` + (text ? " gw-show" : "");
  }

  private updateLegend(): void {
    const stops: string[] = [];
    for (let i = 0; i <= 8; i++) {
      const k = Math.round((i / 8) * 255) * 4;
      stops.push(`rgb(${VIRIDIS[k]},${VIRIDIS[k + 1]},${VIRIDIS[k + 2]})`);
    }
    const t = this.meta.thresholds;
    const label = METRIC_LABELS[this.meta.metric] ?? this.meta.metric;
    const chip = (c: readonly number[], text: string) =>
      `<span><span class="gw-chip" style="background:${rgbCss(c)}"></span>${text}</span>`;
    const bar = !this.heat.length
      ? ""
      : hasScale(this.heat)
        ? `<span>${label}: ${fmt(Math.pow(10, this.scale.lo))} <span class="gw-cbar" style="background:linear-gradient(to right,${stops.join(",")})"></span> ${fmt(Math.pow(10, this.scale.hi))} (log, 1st–99th percentile, one scale for all steps)</span>`
        : `<span class="gw-noscale">${label}: no finite value, no colour scale</span>`;
    this.legend.innerHTML =
      bar +
      chip(MARKS.vanishing, `vanishing (mean|g| &lt; ${fmt(t.vanishing)})`) +
      chip(MARKS.exploding, `exploding (max|g| &gt; ${fmt(t.exploding)})`) +
      chip(MARKS.nonfinite, "NaN / Inf") +
      chip(MARKS.nodata, "no gradient") +
      `<span>rows: loss side at the top (backward order)</span>`;
  }

  // ------------------------------------------------------------------ view -> model
  /** Move the cursor to a column (user action): redraw now, tell the kernel on a throttle. */
  scrub(col: number): void {
    const C = this.meta.cols;
    if (!C || !this.colSteps.length) return;
    const c = Math.max(0, Math.min(C - 1, Math.round(col)));
    if (c === this.cursor && this.slider.value === String(c)) return;
    this.cursor = c;
    // the newest column follows new steps: send the newest step itself (a column starts at its
    // first step, which the kernel would not take for "follow")
    const follow = c === C - 1;
    const step = follow ? Math.max(this.meta.last_step, this.colSteps[c]) : this.colSteps[c];
    this.intent.scrubbed(step, follow);
    this.toSend = { step, follow };
    this.draw();
    this.sendStep();
  }

  private sendStep(): void {
    const now = performance.now();
    const flush = () => {
      this.sendTimer = null;
      this.lastSent = performance.now();
      const s = this.toSend;
      this.toSend = null;
      if (!s) return;
      this.setModel({ step: s.step, follow: s.follow });
    };
    if (now - this.lastSent >= STEP_SEND_MS && !this.sendTimer) flush();
    else if (!this.sendTimer) this.sendTimer = setTimeout(flush, STEP_SEND_MS);
  }

  selectLayer(index: number, send: boolean): void {
    if (!(index >= 0 && index < this.meta.n_layers)) return;
    this.layer = index;
    this.table.select(index);
    this.draw();
    if (send) {
      this.intent.selected(index);
      this.setModel({ layer: index });
    }
  }

  /** Send the user's changes to the kernel (the change events they fire here are ignored). */
  private setModel(values: Record<string, unknown>): void {
    this.ownSet = true;
    try {
      for (const [k, v] of Object.entries(values)) this.model.set(k, v);
    } finally {
      this.ownSet = false;
    }
    this.model.save_changes();
  }

  togglePlay(): void {
    this.playing = !this.playing;
    this.playBtn.textContent = this.playing ? "❚❚" : "▶";
    this.playBtn.setAttribute("aria-pressed", String(this.playing));
    if (!this.playing) {
      cancelAnimationFrame(this.playRaf);
      return;
    }
    if (this.cursor >= this.meta.cols - 1) this.cursor = 0;
    this.playPos = this.cursor;
    this.playT = performance.now();
    const tick = (now: number) => {
      if (!this.playing) return;
      const dt = (now - this.playT) / 1000;
      this.playT = now;
      // 1x crosses the whole run in about 10 s, at least 8 columns a second
      const perSec = Math.max(8, this.meta.cols / 10) * this.speed;
      this.playPos = Math.min(this.meta.cols - 1, this.playPos + perSec * dt);
      this.scrub(Math.floor(this.playPos));
      if (this.playPos >= this.meta.cols - 1) {
        this.togglePlay();
        return;
      }
      this.playRaf = requestAnimationFrame(tick);
    };
    this.playRaf = requestAnimationFrame(tick);
  }

  private onKey(e: KeyboardEvent): void {
    const C = this.meta.cols;
    let handled = true;
    switch (e.key) {
      case "ArrowLeft":
        this.scrub(this.cursor - (e.shiftKey ? 10 : 1));
        break;
      case "ArrowRight":
        this.scrub(this.cursor + (e.shiftKey ? 10 : 1));
        break;
      case "Home":
        this.scrub(0);
        break;
      case "End":
        this.scrub(C - 1);
        break;
      case " ":
        this.togglePlay();
        break;
      case "ArrowUp":
      case "ArrowDown": {
        const pos = this.displayRow(this.layer);
        const next = pos < 0 ? 0 : pos + (e.key === "ArrowUp" ? -1 : 1);
        if (next >= 0 && next < this.order.length) this.selectLayer(this.order[next], true);
        break;
      }
      default:
        handled = false;
    }
    if (handled) {
      e.preventDefault();
      e.stopPropagation();
    }
  }

  // ------------------------------------------------------------------ drawing
  private displayRow(depthIndex: number): number {
    const n = this.order.length;
    return depthIndex >= 0 && depthIndex < n ? n - 1 - depthIndex : -1;
  }

  schedule(): void {
    if (this.raf) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.draw();
    });
  }

  /** Values and flags of every layer (display order) at the cursor: exact from `detail` when the
   *  kernel has sent the cursor's step, else the heatmap column. */
  barValues(): { values: Float32Array; flags: Uint8Array; exact: boolean } {
    const R = this.order.length;
    const C = this.meta.cols;
    const values = new Float32Array(R);
    const flags = new Uint8Array(R);
    const L = this.meta.n_layers;
    const mi = this.meta.metrics.indexOf(this.meta.metric);
    const step = this.colSteps[this.cursor];
    const exact = this.detail.length === this.meta.metrics.length * L && step === this.detailStep && mi >= 0 && L === R;
    if (exact) {
      const idx = (name: string) => this.meta.metrics.indexOf(name);
      const [iMean, iMax, iNf] = [idx("mean_abs"), idx("max_abs"), idx("nonfinite")];
      const th = this.meta.thresholds;
      for (let y = 0; y < R; y++) {
        const j = this.order[y];
        values[y] = this.detail[mi * L + j];
        let f = 0;
        if (iNf >= 0 && this.detail[iNf * L + j] > 0) f |= FLAG_NONFINITE;
        if (iMax >= 0 && this.detail[iMax * L + j] > th.exploding) f |= FLAG_EXPLODING;
        const frozen = this.meta.layers[j]?.status === "frozen";
        if (iMean >= 0 && this.detail[iMean * L + j] < th.vanishing && !frozen) f |= FLAG_VANISHING;
        flags[y] = f;
      }
    } else if (C) {
      for (let y = 0; y < R; y++) {
        values[y] = this.dispHeat[y * C + this.cursor];
        flags[y] = this.dispFlags[y * C + this.cursor];
      }
    }
    return { values, flags, exact };
  }

  /** Redraw everything (synchronous); returns the time it took in ms. */
  draw(): number {
    const t0 = performance.now();
    const width = this.root.clientWidth - 8;
    if (width <= 0) return 0;
    const dpr = window.devicePixelRatio || 1;
    const t = this.theme;
    const meta = this.meta;
    const R = this.order.length;
    const C = meta.cols;
    const has = this.heat.length > 0;
    const L = mainLayout(width, Math.max(R, 1));
    const relaid = !this.layout || this.layout.width !== L.width || this.layout.height !== L.height;
    this.layout = L;
    const ctx = fitCanvas(this.canvas, L.width, L.height, dpr);
    ctx.clearRect(0, 0, L.width, L.height);
    if (relaid) this.requestColumns();
    if (has && (this.imageDirty || relaid)) {
      this.image.build(
        { rows: R, cols: C, data: this.dispHeat, flags: this.dispFlags },
        this.scale,
        Math.max(1, Math.round(L.heat.h * dpr)),
        Math.max(1, Math.round(L.heat.w * dpr)),
      );
      this.imageDirty = false;
    }
    const step = this.colSteps[this.cursor];
    const metricLabel = METRIC_LABELS[meta.metric] ?? meta.metric;
    const selRow = this.displayRow(this.layer);
    if (has) {
      this.image.draw(ctx, L.heat);
      drawRowSelection(ctx, L.heat, R, selRow, t);
      drawCursor(ctx, L.heat, C, this.cursor, t);
      drawGutter(ctx, L.gutter, Array.from(this.order, (j) => meta.layers[j]?.name ?? String(j)), L.labelEvery, selRow, t);
      drawStepAxis(ctx, L.axis, this.colSteps, t);
      const ths = thresholdsFor(meta.metric, meta.thresholds);
      const bs = barScale(this.scale, ths);
      const bv = this.barValues();
      drawBars(ctx, L.bars, bv.values, bv.flags, bs, ths,
        `${metricLabel} at step ${fmt(step)}${bv.exact || meta.block <= 1 ? "" : ` (mean of ${meta.block} steps)`}`, t);
      drawRowSelection(ctx, L.bars, R, selRow, t);
    } else {
      ctx.fillStyle = t.fg2;
      ctx.font = `13px ${t.font}`;
      ctx.textAlign = "center";
      ctx.textBaseline = "middle";
      ctx.fillText(meta.n_layers ? `${meta.n_layers} layers · no step recorded yet` : "no data yet", L.width / 2, L.heat.y + L.heat.h / 2);
    }
    // slider under the heatmap's x range
    this.slider.style.marginLeft = `${L.heat.x}px`;
    this.slider.style.width = `${L.heat.w}px`;
    if (this.slider.value !== String(this.cursor)) this.slider.value = String(this.cursor);
    // header
    this.title.textContent = `gradwidget · ${meta.n_layers} layers`;
    const loss = this.loss.length === C ? this.loss[this.cursor] : undefined;
    this.info.textContent = has
      ? `step ${fmt(step)} (${this.cursor + 1}/${C} cols, steps ${fmt(meta.first_step)}–${fmt(meta.last_step)})` +
        (loss !== undefined && loss === loss ? ` · loss ${fmt(loss)}` : "")
      : "";
    this.drawBottom(width, dpr, step);
    this.lastDrawMs = performance.now() - t0;
    return this.lastDrawMs;
  }

  private drawBottom(width: number, dpr: number, step: number): void {
    const t = this.theme;
    const meta = this.meta;
    const B = bottomLayout(width);
    this.bottom.classList.toggle("gw-stacked", B.stacked);
    const pw = B.plotW;
    const ph = 150;
    const pad = { l: 44, r: 8, t: 18, b: 18 };
    const rect = { x: pad.l, y: pad.t, w: pw - pad.l - pad.r, h: ph - pad.t - pad.b };
    // histogram
    const hctx = fitCanvas(this.histCanvas, pw, ph, dpr);
    hctx.clearRect(0, 0, pw, ph);
    const name = meta.layers[this.layer]?.name ?? "";
    const nb = meta.n_bins;
    let hd = null;
    let note = "";
    let hstep = NaN;
    this.histShown = null;
    const newest = this.histAll.length === meta.n_layers * nb && nb > 0 && this.layer >= 0 && this.layer < meta.n_layers;
    if (this.layer < 0) note = "select a layer (table row or heatmap row)";
    else if (this.histLayer === this.layer && this.histSteps.length && nb) {
      const i = nearestIndex(this.histSteps, step);
      hstep = this.histSteps[i];
      hd = { counts: this.hists.subarray(i * nb, (i + 1) * nb), lo: meta.hist_lo, hi: meta.hist_hi };
      this.histShown = { layer: this.layer, step: hstep, source: "layer" };
    } else if (newest) {
      // picked while the kernel is busy: every layer's newest histogram came with the heatmap
      hstep = meta.hist_all_step ?? NaN;
      hd = { counts: this.histAll.subarray(this.layer * nb, (this.layer + 1) * nb), lo: meta.hist_lo, hi: meta.hist_hi };
      note = this.histLayer !== this.layer ? "newest; other steps when the kernel is idle" : "";
      this.histShown = { layer: this.layer, step: hstep, source: "newest" };
    } else if (this.histLayer !== this.layer) note = "histogram arrives when the kernel is idle";
    else note = "no histogram recorded yet (histogram_every)";
    drawHistogram(hctx, rect, hd, meta.thresholds,
      name ? `|g| histogram · ${name}${hstep === hstep ? ` · step ${fmt(hstep)}` : ""}` : "|g| histogram", note, t);
    // series: the selected layer's row of the heatmap
    const sctx = fitCanvas(this.seriesCanvas, pw, ph, dpr);
    sctx.clearRect(0, 0, pw, ph);
    const C = meta.cols;
    const row = this.layer >= 0 && this.heat.length ? this.heat.subarray(this.layer * C, (this.layer + 1) * C) : new Float32Array(0);
    const label = METRIC_LABELS[meta.metric] ?? meta.metric;
    drawSeries(sctx, rect, row, this.cursor, thresholdsFor(meta.metric, meta.thresholds),
      name ? `${label} over steps · ${name}` : `${label} over steps`, t);
  }

  private requestColumns(): void {
    if (!this.layout) return;
    const want = wantedColumns(this.layout.heat.w, window.devicePixelRatio || 1);
    const have = Number(this.model.get("columns") || 0);
    if (!have || Math.abs(want - have) / have > 0.2) {
      this.model.set("columns", want);
      this.model.save_changes();
    }
  }

  private pointer(e: PointerEvent) {
    if (!this.layout) return null;
    const b = this.canvas.getBoundingClientRect();
    const x = e.clientX - b.left;
    const y = e.clientY - b.top;
    const L = this.layout;
    const inRect = (r: { x: number; y: number; w: number; h: number }) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h;
    const inHeat = inRect(L.heat);
    const inBars = inRect(L.bars);
    const inGutter = inRect(L.gutter);
    const R = this.order.length;
    const row = inHeat || inGutter ? rowAt(L.heat, R, y) : inBars ? rowAt(L.bars, R, y) : -1;
    return { x, y, inHeat, inBars, inGutter, row, clientX: e.clientX, clientY: e.clientY };
  }

  private hover(p: ReturnType<PanelView["pointer"]>): void {
    if (!p || p.row < 0 || !this.heat.length || !this.layout) {
      this.tip.style.display = "none";
      return;
    }
    const C = this.meta.cols;
    const j = this.order[p.row];
    const name = this.meta.layers[j]?.name ?? String(j);
    let col: number;
    let v: number;
    let f: number;
    if (p.inBars) {
      const bv = this.barValues();
      col = this.cursor;
      v = bv.values[p.row];
      f = bv.flags[p.row];
    } else {
      col = colAt(this.layout.heat, C, p.x);
      v = this.dispHeat[p.row * C + col];
      f = this.dispFlags[p.row * C + col];
    }
    const s0 = this.colSteps[col];
    const s1 = col + 1 < C ? this.colSteps[col + 1] - 1 : this.meta.last_step;
    const marks = [f & FLAG_VANISHING ? "vanishing" : "", f & FLAG_EXPLODING ? "exploding" : "", f & FLAG_NONFINITE ? "NaN/Inf" : ""]
      .filter(Boolean)
      .join(", ");
    this.tip.textContent =
      `${name}\nstep ${fmt(s0)}${s1 > s0 ? `–${fmt(s1)}` : ""}\n${METRIC_LABELS[this.meta.metric] ?? this.meta.metric}: ${fmt(v)}` +
      (marks ? `\n${marks}` : "");
    this.tip.style.display = "block";
    const bw = this.mainBox.clientWidth;
    const left = p.x + 14 + 180 > bw ? p.x - 190 : p.x + 14;
    this.tip.style.left = `${Math.max(0, left)}px`;
    this.tip.style.top = `${p.y + 12}px`;
  }

  dispose(): void {
    this.playing = false;
    cancelAnimationFrame(this.raf);
    cancelAnimationFrame(this.playRaf);
    if (this.sendTimer) clearTimeout(this.sendTimer);
    for (const d of this.disposers) d();
    this.root.remove();
  }
}

function render({ model, el }: { model: Model; el: HTMLElement }): () => void {
  const view = new PanelView(model, el);
  // tests and the benchmark reach the view through the element
  (el as HTMLElement & { gradwidget?: PanelView }).gradwidget = view;
  return () => view.dispose();
}

export default { render };
