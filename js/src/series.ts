// The selected layer's metric over time (one point per heatmap column), log y axis, with the
// thresholds that apply to the metric and the step cursor.

import { fmt, LogScale, logTicks } from "./colormap";
import { Rect } from "./layout";
import { beginPlot, Theme } from "./theme";
import { Threshold } from "./bars";
import { niceTicks } from "./ticks";

/** Log range of a series' finite positive values, widened to the thresholds. */
export function seriesScale(ys: ArrayLike<number>, thresholds: Threshold[]): LogScale {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v > 0 && v < Infinity) {
      lo = Math.min(lo, v);
      hi = Math.max(hi, v);
    }
  }
  for (const t of thresholds) {
    if (t.value > 0) {
      lo = Math.min(lo, t.value);
      hi = Math.max(hi, t.value);
    }
  }
  if (!(lo <= hi)) return { lo: -1, hi: 0 };
  let a = Math.log10(lo);
  let b = Math.log10(hi);
  const pad = Math.max(0.1, (b - a) * 0.05);
  return { lo: a - pad, hi: b + pad };
}

/** Horizontal grid lines at the decades of `s`, labelled 1eN left of the plot `r`. */
export function drawLogGrid(
  ctx: CanvasRenderingContext2D, r: Rect, s: LogScale, Y: (v: number) => number, t: Theme,
): void {
  ctx.font = `10px ${t.font}`;
  ctx.fillStyle = t.fg2;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const e of logTicks(s, 4)) {
    const y = Y(Math.pow(10, e));
    ctx.strokeStyle = t.grid;
    ctx.beginPath();
    ctx.moveTo(r.x, y);
    ctx.lineTo(r.x + r.w, y);
    ctx.stroke();
    ctx.fillText(`1e${e}`, r.x - 3, y);
  }
}

export function drawSeries(
  ctx: CanvasRenderingContext2D,
  r: Rect,
  ys: ArrayLike<number>,
  cursor: number,
  thresholds: Threshold[],
  title: string,
  t: Theme,
): void {
  beginPlot(ctx, r, title, t);
  const n = ys.length;
  if (!n) {
    ctx.restore();
    return;
  }
  const s = seriesScale(ys, thresholds);
  const Y = (v: number) => r.y + r.h - ((Math.log10(v) - s.lo) / (s.hi - s.lo)) * r.h;
  const X = (i: number) => r.x + ((i + 0.5) / n) * r.w;
  drawLogGrid(ctx, r, s, Y, t);
  for (const th of thresholds) {
    const y = Y(th.value);
    ctx.strokeStyle = th.color;
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(r.x, y);
    ctx.lineTo(r.x + r.w, y);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = th.color;
    ctx.textAlign = "left";
    ctx.textBaseline = "bottom";
    ctx.fillText(th.label, r.x + 3, y - 1);
  }
  // the line; gaps where values are missing, non-finite drawn as marks at the top
  drawGappedLine(ctx, n, X, (i) => ys[i], Y, t);
  ctx.fillStyle = "#ff00ff";
  for (let i = 0; i < n; i++) {
    const v = ys[i];
    if (v !== v || v === Infinity) ctx.fillRect(X(i) - 1.5, r.y + 1, 3, 6);
  }
  const k = Math.max(0, Math.min(n - 1, cursor));
  drawCursor(ctx, r, X(k), fmt(ys[k]), t);
  ctx.restore();
}

/** A series' line through its positive finite values, lifting the pen over the others (gaps). */
export function drawGappedLine(
  ctx: CanvasRenderingContext2D,
  n: number,
  X: (i: number) => number,
  value: (i: number) => number,
  Y: (v: number) => number,
  t: Theme,
): void {
  ctx.strokeStyle = t.accent;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let pen = false;
  for (let i = 0; i < n; i++) {
    const v = value(i);
    if (v > 0 && v < Infinity) {
      if (pen) ctx.lineTo(X(i), Y(v));
      else ctx.moveTo(X(i), Y(v));
      pen = true;
    } else pen = false;
  }
  ctx.stroke();
}

/** The step cursor at `cx` across plot `r`, with `label` beside it on the side with more room. */
export function drawCursor(ctx: CanvasRenderingContext2D, r: Rect, cx: number, label: string, t: Theme): void {
  ctx.strokeStyle = t.cursor;
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(cx, r.y);
  ctx.lineTo(cx, r.y + r.h);
  ctx.stroke();
  if (!label) return;
  const left = cx > r.x + r.w / 2;
  ctx.fillStyle = t.fg;
  ctx.textAlign = left ? "right" : "left";
  ctx.textBaseline = "top";
  ctx.fillText(label, cx + (left ? -4 : 4), r.y + 3);
}

/** Range of a loss curve's finite values, padded by 5% (a flat curve by 1 either side of it); null
 *  when it has none (the loss was not logged). */
export function lossRange(ys: ArrayLike<number>): [number, number] | null {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (Number.isFinite(v)) (lo = Math.min(lo, v)), (hi = Math.max(hi, v));
  }
  if (!(lo <= hi)) return null;
  const pad = hi > lo ? (hi - lo) * 0.05 : Math.abs(lo) * 0.1 || 1;
  return [lo - pad, hi + pad];
}

/** The logged loss (one mean per heatmap column) on a linear axis, with the step cursor and the
 *  loss at it; gaps where a column has no loss (NaN), non-finite values marked at the top. */
export function drawLoss(ctx: CanvasRenderingContext2D, r: Rect, ys: ArrayLike<number>, cursor: number, title: string, t: Theme): void {
  beginPlot(ctx, r, title, t);
  const range = lossRange(ys);
  const n = ys.length;
  if (!range || !n) return void ctx.restore();
  const [lo, hi] = range;
  const Y = (v: number) => r.y + r.h - ((v - lo) / (hi - lo)) * r.h;
  const X = (i: number) => r.x + ((i + 0.5) / n) * r.w;
  ctx.font = `10px ${t.font}`;
  ctx.fillStyle = t.fg2;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of niceTicks(lo, hi, 4)) {
    ctx.strokeStyle = t.grid;
    ctx.beginPath();
    ctx.moveTo(r.x, Y(v));
    ctx.lineTo(r.x + r.w, Y(v));
    ctx.stroke();
    ctx.fillText(fmt(v), r.x - 3, Y(v));
  }
  ctx.strokeStyle = t.accent;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  let pen = false;
  for (let i = 0; i < n; i++) {
    const v = ys[i];
    if (Number.isFinite(v)) (pen ? ctx.lineTo(X(i), Y(v)) : ctx.moveTo(X(i), Y(v))), (pen = true);
    else pen = false;
  }
  ctx.stroke();
  ctx.fillStyle = "#ff00ff";
  for (let i = 0; i < n; i++) if (ys[i] === Infinity || ys[i] === -Infinity) ctx.fillRect(X(i) - 1.5, r.y + 1, 3, 6);
  const k = Math.max(0, Math.min(n - 1, cursor));
  drawCursor(ctx, r, X(k), Number.isNaN(ys[k]) ? "" : fmt(ys[k]), t);
  ctx.restore();
}
