// The selected layer's gradient histogram (counts of log10|g| in fixed octave bins) at the
// histogram step nearest the cursor, with the thresholds marked on the same axis.

import { fmt } from "./colormap";
import { Rect } from "./layout";
import { beginPlot, Theme } from "./theme";

export interface HistData {
  counts: Float64Array; // n_bins (counts, exact up to 2**53)
  lo: number; // log10 of the first edge
  hi: number; // log10 of the last edge
}

/** Index of the last histogram step at or before `step` (steps sorted ascending); -1 if none:
 *  the histogram shown is never from a step after the cursor. */
export function atOrBefore(steps: ArrayLike<number>, step: number): number {
  let lo = 0;
  let hi = steps.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (steps[mid] <= step) lo = mid + 1;
    else hi = mid;
  }
  return lo - 1;
}

/** Bin range worth showing: the non-empty bins plus two on each side (all bins if empty). */
export function visibleBins(counts: ArrayLike<number>): [number, number] {
  let a = -1;
  let b = -1;
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] > 0) {
      if (a < 0) a = i;
      b = i;
    }
  }
  if (a < 0) return [0, counts.length];
  return [Math.max(0, a - 2), Math.min(counts.length, b + 3)];
}

export function drawHistogram(
  ctx: CanvasRenderingContext2D,
  r: Rect,
  h: HistData | null,
  thresholds: { vanishing: number; exploding: number },
  title: string,
  note: string,
  t: Theme,
): void {
  beginPlot(ctx, r, title, t);
  if (!h || !h.counts.length) {
    ctx.fillStyle = t.fg2;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(note || "no histogram recorded", r.x + r.w / 2, r.y + r.h / 2);
    ctx.restore();
    return;
  }
  const nb = h.counts.length;
  const width = (h.hi - h.lo) / nb;
  const [a, b] = visibleBins(h.counts);
  const x0 = h.lo + a * width;
  const x1 = h.lo + b * width;
  let max = 0;
  let total = 0;
  for (let i = a; i < b; i++) {
    max = Math.max(max, h.counts[i]);
    total += h.counts[i];
  }
  const X = (e: number) => r.x + ((e - x0) / (x1 - x0)) * r.w;
  ctx.fillStyle = t.accent;
  for (let i = a; i < b; i++) {
    const c = h.counts[i];
    if (!c) continue;
    const bh = (c / Math.max(1, max)) * (r.h - 4);
    const xa = X(h.lo + i * width);
    const xb = X(h.lo + (i + 1) * width);
    ctx.fillRect(xa + 0.5, r.y + r.h - bh, Math.max(1, xb - xa - 1), bh);
  }
  // thresholds (mean |g| vanishing, max |g| exploding) on the log10|g| axis
  const marks: [number, string, string][] = [
    [thresholds.vanishing, "#8a8a8a", "vanishing"],
    [thresholds.exploding, "#e3120b", "exploding"],
  ];
  ctx.font = `9px ${t.font}`;
  for (const [v, color, label] of marks) {
    const e = Math.log10(v);
    if (!(e >= x0 && e <= x1)) continue;
    const x = X(e);
    ctx.strokeStyle = color;
    ctx.setLineDash([4, 3]);
    ctx.beginPath();
    ctx.moveTo(x, r.y);
    ctx.lineTo(x, r.y + r.h);
    ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = color;
    ctx.textBaseline = "top";
    ctx.textAlign = "left";
    ctx.fillText(label, x + 2, r.y + 2);
  }
  // x axis: decades of |g|
  ctx.fillStyle = t.fg2;
  ctx.font = `10px ${t.font}`;
  ctx.textBaseline = "top";
  ctx.textAlign = "center";
  const span = x1 - x0;
  const step = span > 24 ? 4 : span > 12 ? 2 : 1;
  for (let e = Math.ceil(x0 / step) * step; e <= x1; e += step) ctx.fillText(`1e${e}`, X(e), r.y + r.h + 3);
  ctx.textAlign = "right";
  ctx.textBaseline = "top";
  ctx.fillText(`${fmt(total)} values${note ? " · " + note : ""}`, r.x + r.w - 3, r.y + 3);
  ctx.restore();
}
