// PanelView: one view of a GradientPanel model. Holds the decoded data and the view state (cursor,
// selected layer, playback), binds the model's change events, and composes the DOM skeleton
// (dom.ts), drawing (draw.ts), input (input.ts), the health table and the diagnoses list. Everything
// it registers (model events, DOM listeners, observers, timers, frames) is released by dispose().

import { heatScale, LogScale } from "../colormap";
import { colForStep, displayOrder, reorderRows } from "../decimate";
import { HeatmapImage } from "../heatmap";
import { MainLayout, wantedColumns } from "../layout";
import {
  decodeDetail, decodeHeat, DetailData, Diagnosis, emptyMeta, Meta, METRIC_LABELS, metricLabel, PanelModel, rowOfLayer,
  rowStarts, TraitName,
} from "../protocol";
import { decodeNoise, NoiseData } from "../noise";
import { installStyle } from "../style";
import { Intent, nextChoice } from "../sync";
import { ControlKey, HealthTable } from "../table";
import { readTheme, Theme } from "../theme";
import { DiagnosesList } from "./diagnoses";
import { barValues, drawPanel } from "./draw";
import { buildSkeleton, diffLegendHtml, h, legendHtml, Skeleton } from "./dom";
import { bindInput } from "./input";

const STEP_SEND_MS = 60;

/** A focused control, named so that another view of the same panel finds it (see focusKey). */
interface FocusKey {
  row: ControlKey | null;
  cls: string;
}

/** What a view that replaces another takes over from it (`PanelView.adopt`): read from the old view
 *  while it still has its state, so that a view its front end released (disposed) can be taken over. */
export interface Handover {
  /** the old view's model: two views of one kernel model share its current values (its `meta`
   *  is read when the takeover looks: a kernel update between the release and the look, as at a
   *  cell's end, replaces the value) */
  model: PanelModel;
  step: number | null;
  follow: boolean;
  layer: number | null;
  /** the numbers of the choices carrying them (sync.Intent) */
  stepChoice: number;
  layerChoice: number;
  layerIndex: number;
  speed: number;
  table: ReturnType<HealthTable["state"]>;
  lostFocus: FocusKey | null;
}

export class PanelView {
  // data
  meta: Meta = emptyMeta();
  heat: Float32Array = new Float32Array(0); // depth order, rows x cols
  flags: Uint8Array = new Uint8Array(0);
  dispHeat: Float32Array = new Float32Array(0); // display order (depth order: input side at the top)
  dispFlags: Uint8Array = new Uint8Array(0);
  colSteps: Float64Array = new Float64Array(0);
  loss: Float32Array = new Float32Array(0);
  histAll: Float64Array = new Float64Array(0); // layers x bins, newest histogram step (counts)
  noise: NoiseData = decodeNoise(null); // the gradient noise scale per measured step
  // a comparison (GradientPanel.compare): the later run and log10(later / first), display order
  heatB: Float32Array = new Float32Array(0);
  dispHeatB: Float32Array = new Float32Array(0);
  dispFlagsB: Uint8Array = new Uint8Array(0);
  dispDiff: Float32Array = new Float32Array(0);
  labels: string[] = [];
  imageB = new HeatmapImage(); // the later run (mode "side") or the difference map (mode "diff")
  detail: DetailData = decodeDetail({ get: () => undefined } as unknown as PanelModel, emptyMeta());
  /** what the histogram shows: the layer, its step, and whether from the kernel's per-layer
   *  series ("layer") or every layer's newest histogram ("newest") */
  histShown: { layer: number; step: number; source: string } | null = null;
  intent = new Intent();
  order: Int32Array = new Int32Array(0); // display row -> depth index
  scale: LogScale = { lo: -1, hi: 0 };
  image = new HeatmapImage();
  /** the layer each row starts at (rows are layers, or past the kernel's cap groups of them) */
  starts: Int32Array = new Int32Array(0);
  // view state
  cursor = 0;
  /** the selected row (display order = depth order); `layerIndex` is the selected layer (the
   *  `layer` trait), shown by its own row or by its group's */
  layer = -1;
  layerIndex = -1;
  playing = false;
  speed = 1;
  theme: Theme;
  layout: MainLayout | null = null;
  lastDrawMs = 0;
  imageDirty = true;
  /** the view has been drawn on the page (once detached after that, it is gone: see widget.ts) */
  shown = false;
  /** the view took over what the user set in a view it replaced (`adopt`): it holds that state to
   *  hand over again, drawn or not (a second replacement can come before its first frame) */
  adopted = false;
  readonly dom: Skeleton;
  readonly table: HealthTable;
  private diagnoses: DiagnosesList;
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
  private disposed = false;
  /** what had the keyboard focus when a front end took this view off the page */
  private lostFocus: FocusKey | null = null;

  constructor(private model: PanelModel, private el: HTMLElement) {
    this.table = new HealthTable((i) => this.selectLayer(i, true), (i) => this.toggleGroup(this.rowOf(i)));
    this.dom = buildSkeleton(this.table);
    this.diagnoses = new DiagnosesList(this.dom.diagnoses, (d) => this.pickDiagnosis(d));
    el.append(this.dom.root);
    installStyle(el);  // where the element lives: the document, or a front end's shadow root
    this.theme = readTheme(this.dom.root);
    this.bind();
    this.loadAll();
  }

  // the elements tests and benchmarks read
  get root(): HTMLDivElement { return this.dom.root; }
  get canvas(): HTMLCanvasElement { return this.dom.canvas; }
  get histCanvas(): HTMLCanvasElement { return this.dom.histCanvas; }
  get seriesCanvas(): HTMLCanvasElement { return this.dom.seriesCanvas; }
  get slider(): HTMLInputElement { return this.dom.slider; }
  get histLayer(): number { return this.detail.histLayer; }
  /** Two runs are shown (the kernel sent the later run's heatmap). */
  get comparing(): boolean { return this.heatB.length > 0 && this.heatB.length === this.heat.length; }
  /** A comparison's view: "side" (both heatmaps, one scale) or "diff" (the difference map). */
  get mode(): string { return this.model.get("mode") === "diff" ? "diff" : "side"; }
  barValues() { return barValues(this); }

  // ------------------------------------------------------------------ model -> view
  private bind(): void {
    const m = this.model;
    const on = (keys: TraitName[], cb: () => void) => {
      for (const k of keys) {
        m.on(`change:${k}`, cb);
        this.disposers.push(() => m.off(`change:${k}`, cb));
      }
    };
    on(["meta", "heat", "flags", "col_steps", "loss", "hist_all", "heat_b", "flags_b", "diff", "labels"],
      () => (this.loadData(), this.schedule()));
    on(["mode"], () => {
      this.dom.modeSel.value = this.mode;
      this.imageDirty = true;
      this.updateLegend();
      this.schedule();
    });
    on(["detail", "detail_step", "hists", "hist_steps", "hist_layer"], () => (this.loadDetail(), this.schedule()));
    // step and layer from the kernel: decided once the whole update has been applied (one
    // synchronous set of the model), knowing whether it carried new data (see sync.ts)
    for (const k of ["meta", "step", "layer", "follow", "choice_applied"] as TraitName[]) on([k], () => this.noteKernel(k));
    on(["metric"], () => {
      this.dom.metricSel.value = String(m.get("metric"));
      this.schedule();
    });
    on(["table"], () => this.loadTable());
    on(["noise", "noise_text"], () => (this.loadNoise(), this.schedule()));
    on(["diagnoses"], () => this.diagnoses.set(m.get("diagnoses")));
    on(["verdict"], () => this.loadVerdict());
    on(["static_png"], () => this.loadFallback());
    on(["live"], () => this.loadLive());
    const listen = <K extends keyof HTMLElementEventMap>(target: HTMLElement, type: K, fn: (e: HTMLElementEventMap[K]) => void) => {
      target.addEventListener(type, fn);
      this.disposers.push(() => target.removeEventListener(type, fn));
    };
    listen(this.dom.modeSel, "change", () => {
      this.setModel({ mode: this.dom.modeSel.value });
      this.imageDirty = true;
      this.updateLegend();
      this.draw();
    });
    listen(this.dom.metricSel, "change", () => {
      m.set("metric", this.dom.metricSel.value);
      m.save_changes();
    });
    bindInput(this, listen);
    // the control that had the focus when the front end took this view off the page (it fires
    // focusout before the removal): the view that takes over gives the focus back (adopt)
    listen(this.dom.root, "focusout", (e) => {
      const key = this.focusKey(e.target as Element);
      queueMicrotask(() => {
        if (!this.disposed && !this.dom.root.isConnected) this.lostFocus = key;
      });
    });
    // resize with the cell, follow theme switches
    const ro = new ResizeObserver(() => {
      this.imageDirty = true;
      this.schedule();
    });
    ro.observe(this.dom.root);
    this.disposers.push(() => ro.disconnect());
    // a theme switch flips <body> attributes before the new theme's CSS has loaded: read the
    // variables again a little later too
    const retheme = () => {
      this.theme = readTheme(this.dom.root);
      this.updateLegend();
      this.schedule();
    };
    const timers = new Set<ReturnType<typeof setTimeout>>();
    const mo = new MutationObserver(() => {
      retheme();
      for (const ms of [150, 500, 1500]) {
        const tm = setTimeout(() => (timers.delete(tm), retheme()), ms);
        timers.add(tm);
      }
    });
    this.disposers.push(() => timers.forEach(clearTimeout));
    mo.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-light", "data-jp-theme-name", "class"] });
    this.disposers.push(() => mo.disconnect());
  }

  private loadAll(): void {
    this.loadData();
    this.loadDetail();
    this.loadTable();
    this.diagnoses.set(this.model.get("diagnoses"));
    this.loadFallback();
    this.loadLive();
    this.loadVerdict();
    this.loadNoise();
    this.setLayerIndex(Number(this.model.get("layer") ?? -1));
    this.schedule();
  }

  /** The noise-scale series and its words (either may be absent: the chart or the line hides). */
  private loadNoise(): void {
    this.noise = decodeNoise(this.model.get("noise"));
    const text = String(this.model.get("noise_text") || "");
    this.dom.noiseBody.textContent = text;
    this.dom.noiseText.style.display = text ? "" : "none";
    this.dom.noiseCanvas.style.display = this.noise.steps.length ? "" : "none";
    this.dom.noiseCanvas.setAttribute("aria-label", text || "gradient noise scale");
  }

  /** The row showing layer `index` (-1: none). */
  rowOf(index: number): number {
    return rowOfLayer(this.starts, this.meta.n_layers, index);
  }

  /** Make layer `index` the selection: its row, and the table row standing for it. */
  private setLayerIndex(index: number): void {
    this.layerIndex = index;
    this.layer = this.rowOf(index);
    this.table.select(this.layer >= 0 ? this.starts[this.layer] : -1);
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
    if (this.disposed) return;
    const m = this.model;
    const pending = [this.intent.step !== null, this.intent.layer !== null];
    this.intent.applied(Number(m.get("choice_applied")) || 0);
    // a choice the kernel has just applied hands the view back to the kernel's values
    if ((keys.has("step") || keys.has("follow") || pending[0]) && this.intent.kernelStep) this.cursor = this.cursorColumn();
    if ((keys.has("layer") || pending[1]) && this.intent.kernelLayer) this.setLayerIndex(Number(m.get("layer")));
    this.schedule();
  }

  /** The cursor's column: the user's pending scrub, else the kernel's step. */
  private cursorColumn(): number {
    return this.intent.cursor(this.meta.cols, Number(this.model.get("step")), (s) => colForStep(this.colSteps, s));
  }

  /** Decode meta + heatmap buffers (protocol.decodeHeat); malformed data becomes a message. */
  loadData(): void {
    const m = this.model;
    const d = decodeHeat(m);
    const meta = d.meta;
    if (d.error) {
      meta.message = d.error;
      meta.level = "error";
    }
    this.meta = meta;
    this.heat = d.heat;
    this.flags = d.flags;
    this.colSteps = d.colSteps;
    this.loss = d.loss;
    this.histAll = d.histAll;
    this.starts = rowStarts(meta);
    this.setLayerIndex(this.layerIndex);
    const dom = this.dom;
    const rows = this.heat.length ? meta.rows : 0;
    const cols = this.heat.length ? meta.cols : 0;
    this.order = displayOrder(rows);
    this.dispHeat = reorderRows(this.heat, rows, cols, this.order);
    this.dispFlags = reorderRows(this.flags, rows, cols, this.order);
    this.heatB = d.heatB;
    this.dispHeatB = reorderRows(d.heatB, d.heatB.length ? rows : 0, cols, this.order);
    this.dispFlagsB = reorderRows(d.flagsB, d.flagsB.length ? rows : 0, cols, this.order);
    this.dispDiff = reorderRows(d.diff, d.diff.length ? rows : 0, cols, this.order);
    this.labels = (m.get("labels") || []).map(String);
    this.table.setLabels(this.labels);
    dom.modeSel.style.display = this.comparing ? "" : "none";
    dom.modeSel.value = this.mode;
    this.scale = heatScale(meta.scale, this.heat);
    this.imageDirty = true;
    this.intent.applied(Number(m.get("choice_applied")) || 0);
    this.cursor = this.cursorColumn();
    dom.slider.max = String(Math.max(0, cols - 1));
    dom.slider.disabled = cols <= 1;
    // metric choices
    const metrics = meta.metrics?.length ? meta.metrics : Object.keys(METRIC_LABELS);
    const current = String(m.get("metric") ?? meta.metric);
    if (dom.metricSel.options.length !== metrics.length) {
      dom.metricSel.textContent = "";
      for (const k of metrics) {
        const o = h("option", "", metricLabel(k));
        o.value = k;
        dom.metricSel.append(o);
      }
    }
    dom.metricSel.value = current;
    this.updateMessage();
    this.updateLegend();
    this.loadFallback();
  }

  loadDetail(): void {
    this.detail = decodeDetail(this.model, this.meta);
  }

  private loadTable(): void {
    this.table.setRows(this.model.get("table") || []);
    this.table.select(this.layer >= 0 ? this.starts[this.layer] ?? -1 : -1);
  }

  private loadFallback(): void {
    const png = String(this.model.get("static_png") || "");
    const lost = !this.heat.length && this.meta.n_steps > 0;
    const meta = this.model.get("meta");
    const noMeta = !meta || !Object.keys(meta).length;
    const show = !!png && (lost || noMeta);
    const img = this.dom.fallback;
    if (show && img.src !== png) img.src = png;
    img.classList.toggle("gw-show", show);
    this.dom.mainBox.style.display = show ? "none" : "";
    if (lost) this.updateMessage();
  }

  private loadLive(): void {
    const live = !!this.model.get("live");
    this.dom.live.textContent = live ? "● live" : "static";
    this.dom.live.classList.toggle("gw-on", live);
    this.dom.live.title = live
      ? "live: the panel updates as the model trains"
      : "static: nothing is recording into this panel now (training ended, or the recorder was detached); it shows the run as it was last recorded";
  }

  /** The analysis in one line: the top diagnosis, or that nothing was found (hidden before the analysis). */
  private loadVerdict(): void {
    const text = String(this.model.get("verdict") || "");
    const v = this.dom.verdict;
    v.textContent = text;
    v.style.display = text ? "" : "none";
    v.classList.toggle("gw-healthy", text.startsWith("Healthy"));
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
    this.dom.message.textContent = text;
    this.dom.message.className = `gw-message gw-${level}` + (text ? " gw-show" : "");
  }

  private updateLegend(): void {
    this.dom.legend.innerHTML = this.comparing && this.mode === "diff"
      ? diffLegendHtml(this.meta.metric, this.meta.diff_max ?? 1, this.labels)
      : legendHtml(this.meta.metric, this.scale, this.heat, this.meta.thresholds, !!this.meta.grouped);
  }

  // ------------------------------------------------------------------ view -> model
  /** Move the cursor to a column (user action): redraw now, tell the kernel on a throttle. */
  scrub(col: number): void {
    const C = this.meta.cols;
    if (!C || !this.colSteps.length) return;
    const c = Math.max(0, Math.min(C - 1, Math.round(col)));
    if (c === this.cursor && this.dom.slider.value === String(c)) return;
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

  /** Move the cursor to a user step (the column holding it). */
  scrubToStep(step: number): void {
    if (this.colSteps.length) this.scrub(colForStep(this.colSteps, step));
  }

  private sendStep(): void {
    const now = performance.now();
    const flush = () => {
      this.sendTimer = null;
      this.lastSent = performance.now();
      const s = this.toSend;
      this.toSend = null;
      if (!s || this.disposed) return;
      const n = nextChoice(this.model);
      this.intent.sentStep(n);
      this.setModel({ step: s.step, follow: s.follow, choice: n });
    };
    if (now - this.lastSent >= STEP_SEND_MS && !this.sendTimer) flush();
    else if (!this.sendTimer) this.sendTimer = setTimeout(flush, STEP_SEND_MS);
  }

  /** Select layer `index` (a group row stands for its layers: selecting one selects the group). */
  selectLayer(index: number, send: boolean, extra: Partial<Record<TraitName, unknown>> = {}): void {
    if (!(index >= 0 && index < this.meta.n_layers)) return;
    this.setLayerIndex(index);
    this.draw();
    if (send) {
      const n = nextChoice(this.model);
      this.intent.selected(index, n);
      this.setModel({ ...extra, layer: index, choice: n });
    }
  }

  /** Select display row `row` (a layer's, or a group's: its first layer stands for it). */
  selectRow(row: number, send: boolean): void {
    if (!(row >= 0 && row < this.starts.length)) return;
    if (row === this.layer && this.layerIndex >= 0) return void this.draw();
    this.selectLayer(this.starts[row], send);
  }

  /** The group a row is (expand it) or is shown in (collapse that one); false when neither. */
  toggleGroup(row: number): boolean {
    const r = this.meta.layers[row];
    if (!r || !this.meta.grouped) return false;
    const cur = (this.model.get("expanded") || []).map((e) => [Number(e[0]), Number(e[1])] as [number, number]);
    const start = r.start ?? row;
    let next: [number, number][];
    if ((r.count ?? 1) > 1) next = [...cur, [start, start + (r.count ?? 1)]];
    else if (r.parent) {
      const [a, b] = r.parent;
      next = cur.filter(([s, e]) => !(a <= s && e <= b));
    } else return false;
    this.setModel({ expanded: next });
    return true;
  }

  /** A diagnosis was clicked: select its first layer (the groups holding it show their members)
   *  and move the cursor to its first step. */
  private pickDiagnosis(d: Diagnosis): void {
    const li = d.layer_index;
    if (li >= 0) {
      const row = this.rowOf(li);
      const grouped = row >= 0 && (this.meta.layers[row]?.count ?? 1) > 1;
      const cur = this.model.get("expanded") || [];
      this.selectLayer(li, true, grouped ? { expanded: [...cur, [li, li + 1]] } : {});
    }
    if (d.first_step !== null && d.first_step !== undefined) this.scrubToStep(d.first_step);
  }

  /** Send the user's changes to the kernel (the change events they fire here are ignored). */
  private setModel(values: Partial<Record<TraitName, unknown>>): void {
    this.ownSet = true;
    try {
      for (const [k, v] of Object.entries(values)) this.model.set(k as TraitName, v as never);
    } finally {
      this.ownSet = false;
    }
    this.model.save_changes();
  }

  togglePlay(): void {
    this.playing = !this.playing;
    const btn = this.dom.playBtn;
    btn.textContent = this.playing ? "❚❚" : "▶";
    btn.setAttribute("aria-pressed", String(this.playing));
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

  // ------------------------------------------------------------------ drawing
  schedule(): void {
    if (this.raf || this.disposed) return;
    this.raf = requestAnimationFrame(() => {
      this.raf = 0;
      this.draw();
    });
  }

  /** Redraw everything (synchronous); returns the time it took in ms. */
  draw(): number {
    if (this.disposed) return 0;
    const announce = !this.shown;
    const ms = drawPanel(this);
    if (ms > 0) this.lastDrawMs = ms;
    // the kernel learns that a front end draws this panel: it then never waits for the final
    // analysis when a cell ends (the page shows it when it comes; see panel/background.py)
    if (announce && this.shown) (this.model as PanelModel & { send?: (c: unknown) => void }).send?.({ kind: "rendered" });
    return ms;
  }

  requestColumns(): void {
    if (!this.layout) return;
    const want = wantedColumns(this.layout.heat.w, window.devicePixelRatio || 1);
    const have = Number(this.model.get("columns") || 0);
    if (!have || Math.abs(want - have) / have > 0.2) {
      this.model.set("columns", want);
      this.model.save_changes();
    }
  }

  /** What the user did here, for the view that replaces this one (taken before it is disposed). */
  handover(): Handover {
    return {
      model: this.model,
      step: this.intent.step,
      follow: this.intent.follow,
      layer: this.intent.layer,
      stepChoice: this.intent.stepChoice,
      layerChoice: this.intent.layerChoice,
      layerIndex: this.layerIndex,
      speed: this.speed,
      table: this.table.state(),
      lostFocus: this.lostFocus,
    };
  }

  /** Whether `old` (a view's handover) was taken from a view of the same kernel model. */
  sameModel(old: Handover): boolean {
    return !this.disposed && this.model.get("meta") === old.model.get("meta");
  }

  /** Take over what the user did in a view of the same model that its front end replaced (the
   *  output was updated in place when a cell ended): cursor and pending scrub, selection,
   *  playback speed, the table's sort, filter, columns and scroll. */
  adopt(old: Handover): void {
    this.adopted = true;
    this.intent.step = old.step;
    this.intent.follow = old.follow;
    this.intent.layer = old.layer;
    this.intent.stepChoice = old.stepChoice;
    this.intent.layerChoice = old.layerChoice;
    this.intent.applied(Number(this.model.get("choice_applied")) || 0);
    // the cursor from the adopted intent against this view's data, not the old view's column: a
    // view the page took off may not have drawn the last update, and its column for "follow" (the
    // newest then) is an older step now
    this.cursor = this.cursorColumn();
    if (old.layerIndex >= 0) this.setLayerIndex(old.layerIndex);
    this.speed = old.speed;
    this.dom.speedSel.value = String(old.speed);
    this.table.restore(old.table);
    this.schedule();
    const active = (this.dom.root.getRootNode() as Document | ShadowRoot).activeElement;
    if (old.lostFocus && (!active || active === document.body)) this.refocus(old.lostFocus);
  }

  /** `el` as what names the same control in another view of this panel: a table row's ▸/▾, or
   *  a control by its class ("" for the panel itself, which takes the keyboard scrubbing). */
  private focusKey(el: Element): FocusKey {
    return { row: this.table.controlKey(el), cls: el === this.dom.root ? "" : el.className };
  }

  /** Give the keyboard focus to the control `key` names (the panel itself when it is not shown). */
  private refocus(key: FocusKey): void {
    if (key.row && this.table.focusControl(key.row)) return;
    const el = key.cls && !key.row ? this.dom.root.getElementsByClassName(key.cls)[0] : null;
    (el instanceof HTMLElement ? el : this.dom.root).focus({ preventScroll: true });
  }

  get isDisposed(): boolean {
    return this.disposed;
  }

  /** Release everything this view registered, and the canvases' pixel memory. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.playing = false;
    cancelAnimationFrame(this.raf);
    cancelAnimationFrame(this.playRaf);
    if (this.sendTimer) clearTimeout(this.sendTimer);
    for (const d of this.disposers) d();
    this.disposers = [];
    this.table.dispose();
    this.image.dispose();
    this.imageB.dispose();
    for (const c of [this.dom.canvas, this.dom.histCanvas, this.dom.seriesCanvas]) c.width = c.height = 0;
    this.dom.root.remove();
    delete (this.el as HTMLElement & { gradwidget?: PanelView }).gradwidget;
    // whatever still holds this view (a host's callback list) holds no DOM and no data
    const self = this as unknown as Record<string, unknown>;
    for (const k of ["dom", "table", "diagnoses", "image", "el", "model", "layout"]) self[k] = null;
    this.heat = this.dispHeat = this.heatB = this.dispHeatB = this.dispDiff = new Float32Array(0);
    this.dispFlagsB = new Uint8Array(0);
    this.flags = this.dispFlags = new Uint8Array(0);
    this.histAll = new Float64Array(0);
  }
}
