// Drawing the panel from its state: the main canvas (heatmap, cursor, layer names, step axis,
// per-layer bars) and the bottom canvases (the selected layer's histogram and series). Synchronous;
// `drawPanel` returns the time it took.

import { fmt } from "../colormap";
import { drawCursor, drawGutter, drawOrigin, drawRowSelection, drawStepAxis } from "../heatmap";
import { barScale, drawBars, thresholdsFor } from "../bars";
import { atOrBefore, drawHistogram } from "../hist";
import { drawLoss, drawSeries, lossRange } from "../series";
import { drawNoise } from "../noise";
import { bottomLayout, fitCanvas, mainLayout, Rect } from "../layout";
import { FLAG_EXPLODING, FLAG_NONFINITE, FLAG_VANISHING, metricLabel, rowCount } from "../protocol";
import type { PanelView } from "./panel";

/** A row's name in the gutter: a group's with ▸ (click or Enter expands it), the first row of an
 *  expanded group's with ▾ (click or Enter collapses the group). */
export function rowLabel(meta: PanelView["meta"], row: number): string {
  const r = meta.layers[row];
  if (!r) return String(row);
  if (!meta.grouped) return r.name;
  return ((r.count ?? 1) > 1 ? "▸ " : r.parent && r.parent[0] === r.start ? "▾ " : "") + r.name;
}

/** Display row (input side at the top) of a row index; -1 when out of range. */
export function displayRow(v: PanelView, depthIndex: number): number {
  const n = v.order.length;
  return depthIndex >= 0 && depthIndex < n ? depthIndex : -1;
}

/** Where the heatmaps go inside the heatmap area: two halves for a comparison side by side (first
 *  run left, later run right, the same rows and columns), else the whole area. */
export function heatRects(v: PanelView, r: Rect): Rect[] {
  if (!v.comparing || v.mode !== "side") return [r];
  const gap = 10;
  const w = (r.w - gap) / 2;
  return [{ x: r.x, y: r.y, w, h: r.h }, { x: r.x + w + gap, y: r.y, w, h: r.h }];
}

/** Index in `heatRects` of the heatmap under (or nearest) x. */
export function heatRectIndex(v: PanelView, x: number): number {
  const rs = v.layout ? heatRects(v, v.layout.heat) : [];
  return rs.length > 1 && x >= rs[1].x - 5 ? 1 : 0;
}

/** The column whose step is nearest ``step``; -1 without columns. */
export function nearestCol(colSteps: ArrayLike<number>, step: number): number {
  let best = -1;
  for (let i = 0; i < colSteps.length; i++) if (colSteps[i] <= step) best = i;
  return colSteps.length ? Math.max(best, 0) : -1;
}

/** Values and flags of every layer (display order) at the cursor: exact from `detail` when the
 *  kernel has sent the cursor's step, else the heatmap column. */
export function barValues(v: PanelView): { values: Float64Array; flags: Uint8Array; exact: boolean } {
  const R = v.order.length;
  const C = v.meta.cols;
  const values = new Float64Array(R);
  const flags = new Uint8Array(R);
  const L = rowCount(v.meta); // detail is per row
  const d = v.detail;
  const mi = v.meta.metrics.indexOf(v.meta.metric);
  const step = v.colSteps[v.cursor];
  const exact = d.detail.length === v.meta.metrics.length * L && step === d.detailStep && mi >= 0 && L === R;
  if (exact) {
    const idx = (name: string) => v.meta.metrics.indexOf(name);
    const [iMean, iMax, iNf] = [idx("mean_abs"), idx("max_abs"), idx("nonfinite")];
    const th = v.meta.thresholds;
    for (let y = 0; y < R; y++) {
      const j = v.order[y];
      values[y] = d.detail[mi * L + j];
      let f = 0;
      if (iNf >= 0 && d.detail[iNf * L + j] > 0) f |= FLAG_NONFINITE;
      if (iMax >= 0 && d.detail[iMax * L + j] > th.exploding) f |= FLAG_EXPLODING;
      const frozen = v.meta.layers[j]?.status === "frozen";
      if (iMean >= 0 && d.detail[iMean * L + j] < th.vanishing && !frozen) f |= FLAG_VANISHING;
      flags[y] = f;
    }
  } else if (C) {
    // a comparison: the later run's values (the run being fixed)
    const [hv, hf] = v.comparing ? [v.dispHeatB, v.dispFlagsB] : [v.dispHeat, v.dispFlags];
    for (let y = 0; y < R; y++) {
      values[y] = hv[y * C + v.cursor];
      flags[y] = hf[y * C + v.cursor];
    }
  }
  return { values, flags, exact };
}

/** Redraw everything; returns the time it took in ms (0 when the panel has no width). */
export function drawPanel(v: PanelView): number {
  const t0 = performance.now();
  const d = v.dom;
  const width = d.root.clientWidth - 8;
  if (width <= 0) return 0;
  v.shown = true;
  const dpr = window.devicePixelRatio || 1;
  const t = v.theme;
  const meta = v.meta;
  const R = v.order.length;
  const C = meta.cols;
  const has = v.heat.length > 0;
  const L = mainLayout(width, Math.max(R, 1));
  const relaid = !v.layout || v.layout.width !== L.width || v.layout.height !== L.height;
  v.layout = L;
  const ctx = fitCanvas(d.canvas, L.width, L.height, dpr);
  ctx.clearRect(0, 0, L.width, L.height);
  if (relaid) v.requestColumns();
  const rects = heatRects(v, L.heat);
  const diff = v.comparing && v.mode === "diff";
  if (has && (v.imageDirty || relaid)) {
    const px = (n: number) => Math.max(1, Math.round(n * dpr));
    if (diff) {
      v.imageB.build({ rows: R, cols: C, data: v.dispDiff, flags: null }, v.scale, px(L.heat.h), px(L.heat.w),
        meta.diff_max ?? 1);
    } else {
      v.image.build({ rows: R, cols: C, data: v.dispHeat, flags: v.dispFlags }, v.scale, px(L.heat.h), px(rects[0].w));
      if (v.comparing) {  // the same scale: equal colours are equal values in both runs
        v.imageB.build({ rows: R, cols: C, data: v.dispHeatB, flags: v.dispFlagsB }, v.scale, px(L.heat.h),
          px(rects[1].w));
      }
    }
    v.imageDirty = false;
  }
  const step = v.colSteps[v.cursor];
  const label = metricLabel(meta.metric);
  const selRow = displayRow(v, v.layer);
  if (has) {
    if (diff) v.imageB.draw(ctx, L.heat);
    else v.image.draw(ctx, rects[0]);
    if (v.comparing && !diff) v.imageB.draw(ctx, rects[1]);
    for (const r of rects) {  // one cursor for both runs (their columns are the same steps)
      drawRowSelection(ctx, r, R, selRow, t);
      drawCursor(ctx, r, C, v.cursor, t);
      drawStepAxis(ctx, { ...L.axis, x: r.x, w: r.w }, v.colSteps, t, meta.last_step, meta.block);
    }
    const o = meta.origin;
    if (o && !diff) {  // where the first NaN/Inf was made (the first run's, in a comparison)
      drawOrigin(ctx, rects[0], R, C, nearestCol(v.colSteps, o.step), o.row === null ? -1 : displayRow(v, o.row), t);
    }
    if (v.comparing) drawRunLabels(ctx, rects, diff ? [`${v.labels[1]} / ${v.labels[0]} (log10 ratio)`] : v.labels, t);
    const labels = Array.from(v.order, (j) => rowLabel(meta, j));
    const opens = new Set<number>();
    labels.forEach((name, i) => name.startsWith("▾") && opens.add(i));
    drawGutter(ctx, L.gutter, labels, L.labelEvery, selRow, t, opens);
    const ths = thresholdsFor(meta.metric, meta.thresholds);
    const bs = barScale(v.scale, ths);
    const bv = barValues(v);
    drawBars(ctx, L.bars, bv.values, bv.flags, bs, ths,
      `${label} at step ${fmt(step)}${bv.exact || meta.block <= 1 ? "" : ` (mean of ${meta.block} steps)`}` +
      (v.comparing ? ` · ${v.labels[1] ?? ""}` : ""), t);
    drawRowSelection(ctx, L.bars, R, selRow, t);
  } else {
    ctx.fillStyle = t.fg2;
    ctx.font = `13px ${t.font}`;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(meta.n_layers ? `${meta.n_layers} layers · no step recorded yet` : "no data yet", L.width / 2, L.heat.y + L.heat.h / 2);
  }
  // slider under the heatmap's x range
  d.slider.style.marginLeft = `${L.heat.x}px`;
  d.slider.style.width = `${L.heat.w}px`;
  if (d.slider.value !== String(v.cursor)) d.slider.value = String(v.cursor);
  d.title.textContent = `gradwidget · ${meta.n_layers} layers` + (meta.grouped ? ` in ${meta.layers.length} rows` : "");
  const loss = v.loss.length === C ? v.loss[v.cursor] : undefined;
  d.info.textContent = has
    ? `step ${fmt(step)} (${v.cursor + 1}/${C} cols, steps ${fmt(meta.first_step)}–${fmt(meta.last_step)})` +
      (loss !== undefined && loss === loss ? ` · loss ${fmt(loss)}` : "")
    : "";
  drawBottom(v, width, dpr, step);
  return performance.now() - t0;
}

/** The runs' labels above their heatmaps. */
function drawRunLabels(ctx: CanvasRenderingContext2D, rects: Rect[], labels: string[], t: PanelView["theme"]): void {
  ctx.save();
  ctx.fillStyle = t.fg;
  ctx.font = `bold 11px ${t.font}`;
  ctx.textAlign = "left";
  ctx.textBaseline = "bottom";
  rects.forEach((r, i) => ctx.fillText(labels[i] ?? "", r.x, r.y - 2, r.w));
  ctx.restore();
}

function drawBottom(v: PanelView, width: number, dpr: number, step: number): void {
  const t = v.theme;
  const meta = v.meta;
  const d = v.dom;
  const B = bottomLayout(width);
  d.bottom.classList.toggle("gw-stacked", B.stacked);
  const pw = B.plotW;
  const ph = 150;
  const pad = { l: 44, r: 8, t: 18, b: 18 };
  const rect = { x: pad.l, y: pad.t, w: pw - pad.l - pad.r, h: ph - pad.t - pad.b };
  // histogram
  const hctx = fitCanvas(d.histCanvas, pw, ph, dpr);
  hctx.clearRect(0, 0, pw, ph);
  const name = meta.layers[v.layer]?.name ?? "";
  const nb = meta.n_bins;
  const det = v.detail;
  let hd = null;
  let note = "";
  let hstep = NaN;
  v.histShown = null;
  const nRows = rowCount(meta);
  const newest = v.histAll.length === nRows * nb && nb > 0 && v.layer >= 0 && v.layer < nRows;
  const histRow = v.rowOf(det.histLayer);
  // the layer's series from the kernel, unless every layer's newest histogram is newer and nearer
  const allStep = meta.hist_all_step ?? -1;
  const stale = det.histSteps.length > 0 && allStep > det.histSteps[det.histSteps.length - 1] && step >= allStep;
  if (v.comparing) note = "a comparison shows no histograms: open each run in its own panel";
  else if (v.layer < 0) note = "select a layer (table row or heatmap row)";
  else if (histRow === v.layer && det.histSteps.length && nb && !(stale && newest) && atOrBefore(det.histSteps, step) >= 0) {
    const i = atOrBefore(det.histSteps, step);
    hstep = det.histSteps[i];
    hd = { counts: det.hists.subarray(i * nb, (i + 1) * nb), lo: meta.hist_lo, hi: meta.hist_hi };
    v.histShown = { layer: v.layer, step: hstep, source: "layer" };
  } else if (newest && (meta.hist_all_step ?? Infinity) <= step) {
    // picked while the kernel is busy: every layer's newest histogram came with the heatmap
    hstep = meta.hist_all_step ?? NaN;
    hd = { counts: v.histAll.subarray(v.layer * nb, (v.layer + 1) * nb), lo: meta.hist_lo, hi: meta.hist_hi };
    note = histRow !== v.layer ? "newest; other steps when the kernel is idle" : "";
    v.histShown = { layer: v.layer, step: hstep, source: "newest" };
  } else if (histRow !== v.layer) note = "histogram arrives when the kernel is idle";
  else if (det.histSteps.length || newest) note = `no histogram at or before step ${fmt(step)} (histogram_every)`;
  else note = "no histogram recorded yet (histogram_every)";
  drawHistogram(hctx, rect, hd, meta.thresholds,
    name ? `|g| histogram · ${name}${hstep === hstep ? ` · step ${fmt(hstep)}` : ""}` : "|g| histogram", note, t);
  // series: the selected layer's row of the heatmap
  const sctx = fitCanvas(d.seriesCanvas, pw, ph, dpr);
  sctx.clearRect(0, 0, pw, ph);
  const C = meta.cols;
  const src = v.comparing ? v.heatB : v.heat;  // a comparison: the later run's
  const row = v.layer >= 0 && src.length ? src.subarray(v.layer * C, (v.layer + 1) * C) : new Float32Array(0);
  const label = metricLabel(meta.metric) + (v.comparing ? ` (${v.labels[1] ?? ""})` : "");
  drawSeries(sctx, rect, row, v.cursor, thresholdsFor(meta.metric, meta.thresholds),
    name ? `${label} over steps · ${name}` : `${label} over steps`, t);
  // the logged loss (only when the run has one; a comparison's is the later run's)
  const hasLoss = v.loss.length === C && lossRange(v.loss) !== null;
  d.lossCanvas.style.display = hasLoss ? "" : "none";
  if (hasLoss) {
    const lctx = fitCanvas(d.lossCanvas, pw, ph, dpr);
    lctx.clearRect(0, 0, pw, ph);
    drawLoss(lctx, rect, v.loss, v.cursor, `loss over steps${v.comparing ? ` (${v.labels[1] ?? ""})` : ""}`, t);
  }
  // the gradient noise scale against the batch (only when the run measured it)
  if (v.noise.steps.length) {
    const nctx = fitCanvas(d.noiseCanvas, pw, ph, dpr);
    nctx.clearRect(0, 0, pw, ph);
    drawNoise(nctx, rect, v.noise, meta.first_step, meta.last_step, step, "gradient noise scale B_simple vs batch", t);
  }
}
