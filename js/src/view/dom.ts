// The panel's DOM skeleton: header (title, metric, play, speed, step label, live badge), message,
// saved-image fallback, the diagnoses list, the main canvas with its tooltip, the slider, the
// legend, and the bottom row (health table, histogram and series canvases).

import { DIFF_LUT, fmt, hasScale, LogScale, rgbCss, VIRIDIS } from "../colormap";
import { DIFF_NODATA, MARKS, MERGE_LABELS, metricLabel } from "../protocol";
import { HealthTable } from "../table";

export const SPEEDS = [0.25, 0.5, 1, 2, 4];

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, cls = "", text = ""): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text) e.textContent = text;
  return e;
}

export interface Skeleton {
  root: HTMLDivElement;
  title: HTMLSpanElement;
  metricSel: HTMLSelectElement;
  modeSel: HTMLSelectElement;
  playBtn: HTMLButtonElement;
  speedSel: HTMLSelectElement;
  info: HTMLSpanElement;
  live: HTMLSpanElement;
  verdict: HTMLDivElement;
  message: HTMLDivElement;
  fallback: HTMLImageElement;
  diagnoses: HTMLDivElement;
  mainBox: HTMLDivElement;
  canvas: HTMLCanvasElement;
  tip: HTMLDivElement;
  slider: HTMLInputElement;
  legend: HTMLDivElement;
  bottom: HTMLDivElement;
  histCanvas: HTMLCanvasElement;
  seriesCanvas: HTMLCanvasElement;
  /** the gradient noise scale against the batch (hidden without one), and its words */
  noiseCanvas: HTMLCanvasElement;
  lossCanvas: HTMLCanvasElement;
  noiseText: HTMLDetailsElement;
  noiseBody: HTMLDivElement;
}

export function buildSkeleton(table: HealthTable): Skeleton {
  const root = h("div", "gw-root");
  root.tabIndex = 0;
  root.setAttribute("role", "application");
  root.setAttribute("aria-label",
    "gradient flow panel: arrows scrub steps, space plays, up/down select layers, Enter expands or collapses a group of layers");
  const header = h("div", "gw-header");
  const title = h("span", "gw-title", "gradwidget");
  const metricSel = h("select", "gw-metric");
  metricSel.title = "metric shown in the heatmap, bars and series";
  const modeSel = h("select", "gw-mode");
  modeSel.title = "comparison: both runs side by side on one colour scale, or the difference map";
  for (const [k, text] of [["side", "side by side"], ["diff", "difference"]]) {
    const o = h("option", "", text);
    o.value = k;
    modeSel.append(o);
  }
  modeSel.style.display = "none";
  const playBtn = h("button", "gw-play", "▶");
  playBtn.title = "play / pause (space)";
  const speedSel = h("select", "gw-speed");
  speedSel.title = "playback speed";
  for (const s of SPEEDS) {
    const o = h("option", "", `${s}×`);
    o.value = String(s);
    speedSel.append(o);
  }
  speedSel.value = "1";
  const info = h("span", "gw-info");
  const live = h("span", "gw-live", "static");
  header.append(title, metricSel, modeSel, playBtn, speedSel, info, h("span", "gw-spacer"), live);
  const message = h("div", "gw-message");
  message.setAttribute("role", "status");
  const fallback = h("img", "gw-fallback");
  fallback.alt = "gradwidget panel (saved image)";
  const verdict = h("div", "gw-verdict");
  verdict.setAttribute("role", "status");
  verdict.style.display = "none";
  const diagnoses = h("div", "gw-diagnoses");
  const mainBox = h("div", "gw-main");
  const canvas = h("canvas", "gw-flow");
  const tip = h("div", "gw-tip");
  mainBox.append(canvas, tip);
  const sliderRow = h("div", "gw-slider-row");
  const slider = h("input", "gw-slider");
  slider.type = "range";
  slider.min = "0";
  slider.max = "0";
  slider.step = "1";
  slider.value = "0";
  slider.setAttribute("aria-label", "step");
  sliderRow.append(slider);
  const legend = h("div", "gw-legend");
  const bottom = h("div", "gw-bottom");
  const plots = h("div", "gw-plots");
  const histCanvas = h("canvas", "gw-hist");
  const seriesCanvas = h("canvas", "gw-series");
  // the logged loss over steps (only when the run has one)
  const lossCanvas = h("canvas", "gw-loss");
  lossCanvas.style.display = "none";
  const noiseCanvas = h("canvas", "gw-noise");
  noiseCanvas.style.display = "none";
  // the noise scale in words: one line, the rest a click away
  const noiseText = h("details", "gw-noise-text");
  noiseText.style.display = "none";
  const noiseBody = h("div", "gw-noise-body");
  noiseText.append(h("summary", "", "gradient noise scale"), noiseBody);
  plots.append(histCanvas, seriesCanvas, lossCanvas, noiseCanvas, noiseText);
  bottom.append(table.el, plots);
  root.append(header, message, fallback, verdict, diagnoses, mainBox, sliderRow, legend, bottom);
  return { root, title, metricSel, modeSel, playBtn, speedSel, info, live, verdict, message, fallback, diagnoses, mainBox, canvas, tip,
    slider, legend, bottom, histCanvas, seriesCanvas, lossCanvas, noiseCanvas, noiseText, noiseBody };
}

/** The legend under the heatmap: the colour bar of `scale` and the marks. */
export function legendHtml(metric: string, scale: LogScale, heat: Float32Array, t: { vanishing: number; exploding: number },
  grouped = false): string {
  const stops: string[] = [];
  for (let i = 0; i <= 8; i++) {
    const k = Math.round((i / 8) * 255) * 4;
    stops.push(`rgb(${VIRIDIS[k]},${VIRIDIS[k + 1]},${VIRIDIS[k + 2]})`);
  }
  const label = metricLabel(metric);
  const chip = (c: readonly number[], text: string) =>
    `<span><span class="gw-chip" style="background:${rgbCss(c)}"></span>${text}</span>`;
  const bar = !heat.length
    ? ""
    : hasScale(heat)
      ? `<span>${label}: ${fmt(Math.pow(10, scale.lo))} <span class="gw-cbar" style="background:linear-gradient(to right,${stops.join(",")})"></span> ${fmt(Math.pow(10, scale.hi))} (log, 1st–99th percentile, one scale for all steps)</span>`
      : `<span class="gw-noscale">${label}: no finite value, no colour scale</span>`;
  return (
    bar +
    chip(MARKS.vanishing, `vanishing (mean|g| &lt; ${fmt(t.vanishing)})`) +
    chip(MARKS.exploding, `exploding (max|g| &gt; ${fmt(t.exploding)})`) +
    chip(MARKS.nonfinite, "NaN / Inf") +
    chip(MARKS.nodata, "no gradient") +
    `<span>rows: input side at the top, loss side at the bottom (model order)</span>` +
    (grouped ? `<span class="gw-groups">▸ rows: groups of layers, each measured as one tensor: ${label} = ` +
      `${MERGE_LABELS[metric] ?? ""}; click a name or press Enter to expand (▾ collapses)</span>` : "")
  );
}

/** The legend of a comparison's difference map: the diverging bar over +-maxAbs decades. */
export function diffLegendHtml(metric: string, maxAbs: number, labels: string[]): string {
  const stops: string[] = [];
  for (let i = 0; i <= 8; i++) {
    const k = Math.round((i / 8) * 255) * 4;
    stops.push(`rgb(${DIFF_LUT[k]},${DIFF_LUT[k + 1]},${DIFF_LUT[k + 2]})`);
  }
  const [a, b] = [labels[0] ?? "first", labels[1] ?? "later"].map(esc);
  const chip = `<span><span class="gw-chip" style="background:${rgbCss(DIFF_NODATA)}"></span>no value in one run</span>`;
  return `<span>log10 ${metricLabel(metric)} of ${b} / ${a}: ${fmt(-maxAbs)} ` +
    `<span class="gw-cbar" style="background:linear-gradient(to right,${stops.join(",")})"></span> ` +
    `+${fmt(maxAbs)} (blue: smaller in ${b}, white: no change, red: larger)</span>` + chip;
}

function esc(s: string): string {
  return s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c] as string);
}
