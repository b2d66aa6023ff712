// The gradient noise scale (the `noise` trait, gradwidget/panel/noise.py): B_simple with its 95%
// interval per measured step against the batch per step, log y, on the heatmap's step range, with
// the step cursor. Below the noise scale a larger batch trains in fewer steps; far above it, most of
// each step's examples buy nothing.

import { Binary, asFloat64, byteLength } from "./decode";
import { fmt } from "./colormap";
import { Rect } from "./layout";
import { drawCursor, drawGappedLine, drawLogGrid } from "./series";
import { beginPlot, Theme } from "./theme";

export interface NoiseData {
  steps: Float64Array;
  b: Float64Array; // B_simple (NaN: not yet measurable)
  lo: Float64Array;
  hi: Float64Array; // Infinity: no upper bound
  batch: Float64Array;
}

const ROWS = 5;

/** The five rows of the `noise` trait; empty when it is absent or not (5, N) float64. */
export function decodeNoise(v: Binary): NoiseData {
  const nbytes = byteLength(v);
  const n = nbytes % (ROWS * 8) === 0 ? nbytes / (ROWS * 8) : 0;
  const a = n ? asFloat64(v, ROWS * n) : new Float64Array(0);
  const row = (k: number) => a.subarray(k * n, (k + 1) * n);
  return { steps: row(0), b: row(1), lo: row(2), hi: row(3), batch: row(4) };
}

/** Log10 range covering B_simple, the finite interval bounds and the batch. */
export function noiseRange(d: NoiseData): { lo: number; hi: number } {
  let lo = Infinity;
  let hi = -Infinity;
  const take = (v: number) => {
    if (v > 0 && v < Infinity) {
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  };
  for (let i = 0; i < d.steps.length; i++) {
    take(d.b[i]);
    take(d.batch[i]);
    take(d.lo[i]);
    take(d.hi[i]);
  }
  if (!(lo <= hi)) return { lo: 0, hi: 1 };
  return { lo: Math.log10(lo) - 0.15, hi: Math.log10(hi) + 0.15 };
}

export function drawNoise(
  ctx: CanvasRenderingContext2D, r: Rect, d: NoiseData, x0: number, x1: number, step: number, title: string, t: Theme,
): void {
  beginPlot(ctx, r, title, t);
  const n = d.steps.length;
  if (!n) {
    ctx.restore();
    return;
  }
  const s = noiseRange(d);
  const span = x1 > x0 ? x1 - x0 : 1;
  const X = (v: number) => r.x + ((v - x0) / span) * r.w;
  const Y = (v: number) => {
    const e = v > 0 ? Math.log10(v) : s.lo;
    return r.y + r.h - ((Math.min(s.hi, Math.max(s.lo, e)) - s.lo) / (s.hi - s.lo)) * r.h;
  };
  drawLogGrid(ctx, r, s, Y, t);
  ctx.font = `10px ${t.font}`;
  // the interval: a band, clipped to the plot (an unbounded top reaches the top edge)
  ctx.save();
  ctx.beginPath();
  ctx.rect(r.x, r.y, r.w, r.h);
  ctx.clip();
  ctx.globalAlpha = 0.2;
  ctx.fillStyle = t.accent;
  for (let i = 0; i < n; i++) {
    if (!(d.b[i] > 0)) continue;
    const xa = X(i > 0 ? (d.steps[i - 1] + d.steps[i]) / 2 : d.steps[i]);
    const xb = X(i < n - 1 ? (d.steps[i] + d.steps[i + 1]) / 2 : d.steps[i]);
    const top = Y(d.hi[i] < Infinity ? d.hi[i] : Math.pow(10, s.hi));
    ctx.fillRect(xa, top, Math.max(1, xb - xa), Y(d.lo[i]) - top);
  }
  ctx.restore();
  // the batch per step, dashed
  ctx.strokeStyle = "#d84315";
  ctx.setLineDash([4, 3]);
  ctx.beginPath();
  for (let i = 0; i < n; i++) {
    const y = Math.round(Y(d.batch[i])) + 0.5; // on a pixel row's centre: a crisp 1 px dashed line
    if (i) ctx.lineTo(X(d.steps[i]), y);
    else ctx.moveTo(X(d.steps[i]), y);
  }
  ctx.stroke();
  ctx.setLineDash([]);
  // B_simple, with gaps where not yet measurable
  drawGappedLine(ctx, n, (i) => X(d.steps[i]), (i) => d.b[i], Y, t);
  // cursor and the value at it
  if (step >= x0 && step <= x1) {
    let k = -1;
    for (let i = 0; i < n && d.steps[i] <= step; i++) k = i;
    const label = k >= 0 ? `B_simple ${fmt(d.b[k])} · batch ${fmt(d.batch[k])}` : "";
    drawCursor(ctx, r, X(step), label, t);
  }
  ctx.restore();
}
