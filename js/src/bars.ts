// The "gradient flow" picture at the scrubbed step: one horizontal bar per layer (rows shared with
// the heatmap, model order: input side at the top), log scale, threshold lines.

import { FLAG_EXPLODING, FLAG_NONFINITE, FLAG_VANISHING } from "./protocol";
import { cellRgb, fmt, LogScale, logTicks, rgbCss, scalePos } from "./colormap";
import { Rect } from "./layout";
import { Theme } from "./theme";

export interface Threshold {
  value: number;
  label: string;
  color: string;
}

export function drawBars(
  ctx: CanvasRenderingContext2D,
  r: Rect,
  values: ArrayLike<number>, // per display row
  flags: ArrayLike<number> | null, // per display row
  scale: LogScale,
  thresholds: Threshold[],
  title: string,
  t: Theme,
): void {
  const n = values.length;
  ctx.save();
  ctx.fillStyle = t.fg2;
  ctx.font = `10px ${t.font}`;
  ctx.textBaseline = "bottom";
  ctx.textAlign = "left";
  // frame
  ctx.strokeStyle = t.grid;
  ctx.lineWidth = 1;
  ctx.strokeRect(r.x + 0.5, r.y + 0.5, r.w - 1, r.h - 1);
  // decade grid
  for (const e of logTicks(scale, 5)) {
    const x = r.x + scalePos(Math.pow(10, e), scale) * r.w;
    ctx.beginPath();
    ctx.moveTo(x, r.y);
    ctx.lineTo(x, r.y + r.h);
    ctx.stroke();
    ctx.textBaseline = "top";
    ctx.textAlign = "center";
    ctx.fillText(`1e${e}`, x, r.y + r.h + 3);
  }
  if (n > 0) {
    const h = r.h / n;
    const gap = h >= 4 ? 1 : 0;
    for (let i = 0; i < n; i++) {
      const v = values[i];
      const f = flags ? flags[i] : 0;
      let w: number;
      if (f & FLAG_NONFINITE || v === Infinity) w = r.w;
      else w = scalePos(v, scale) * r.w;
      if (v === 0 && !(f & FLAG_NONFINITE)) w = 0;
      ctx.fillStyle = rgbCss(cellRgb(v, f & (FLAG_NONFINITE | FLAG_EXPLODING | FLAG_VANISHING), scale));
      ctx.fillRect(r.x, r.y + i * h + gap / 2, Math.max(w, v > 0 ? 1 : 0), Math.max(h - gap, 0.5));
    }
  }
  // thresholds
  for (const th of thresholds) {
    if (!(th.value > 0)) continue;
    const p = (Math.log10(th.value) - scale.lo) / (scale.hi - scale.lo);
    if (p < 0 || p > 1) continue;
    const x = r.x + p * r.w;
    ctx.strokeStyle = th.color;
    ctx.setLineDash([4, 3]);
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    ctx.moveTo(x, r.y);
    ctx.lineTo(x, r.y + r.h);
    ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.fillStyle = t.fg2;
  ctx.textAlign = "left";
  ctx.textBaseline = "bottom";
  ctx.font = `10px ${t.font}`;
  if (title) ctx.fillText(title, r.x, r.y - 1);
  ctx.restore();
}

/** Bar scale: the heatmap's scale widened to include thresholds that apply to the metric. */
export function barScale(scale: LogScale, thresholds: Threshold[]): LogScale {
  let { lo, hi } = scale;
  for (const t of thresholds) {
    if (t.value > 0) {
      const e = Math.log10(t.value);
      lo = Math.min(lo, e - 0.25);
      hi = Math.max(hi, e + 0.25);
    }
  }
  return { lo, hi };
}

/** Thresholds drawn for a metric: vanishing applies to mean |g|, exploding to max |g|. */
export function thresholdsFor(metric: string, th: { vanishing: number; exploding: number }): Threshold[] {
  const out: Threshold[] = [];
  if (metric === "mean_abs") out.push({ value: th.vanishing, label: `vanishing < ${fmt(th.vanishing)}`, color: "#8a8a8a" });
  if (metric === "max_abs") {
    out.push({ value: th.vanishing, label: `vanishing < ${fmt(th.vanishing)}`, color: "#8a8a8a" });
    out.push({ value: th.exploding, label: `exploding > ${fmt(th.exploding)}`, color: "#e3120b" });
  }
  return out;
}
