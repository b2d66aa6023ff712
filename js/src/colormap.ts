// Colour scale: viridis (perceptually uniform, readable with the common colour-vision deficiencies
// and in greyscale) on log10 of the value, with ONE range over every step and layer, so a
// network-wide fade stays visible (a per-step scale would hide it). Flagged cells get colours that
// viridis never uses, the same as gradwidget.plots' static figure.

import {
  DIFF_NODATA, DIFF_STOPS, VIRIDIS_HEX, FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING, hexRgb, MARKS,
} from "./protocol";


/** 256 x RGBA viridis lookup table. */
export const VIRIDIS: Uint8ClampedArray = (() => {
  const lut = new Uint8ClampedArray(256 * 4);
  for (let i = 0; i < 256; i++) {
    lut[4 * i] = parseInt(VIRIDIS_HEX.slice(6 * i, 6 * i + 2), 16);
    lut[4 * i + 1] = parseInt(VIRIDIS_HEX.slice(6 * i + 2, 6 * i + 4), 16);
    lut[4 * i + 2] = parseInt(VIRIDIS_HEX.slice(6 * i + 4, 6 * i + 6), 16);
    lut[4 * i + 3] = 255;
  }
  return lut;
})();

export { MARKS };

export function rgbCss(c: readonly number[]): string {
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

export interface LogScale {
  lo: number; // log10 of the value at the bottom of the scale
  hi: number; // log10 of the value at the top
}

/** Whether a colour bar means anything: some value is finite and positive. Without one (all
 *  NaN/Inf/zero) every range would be made up (the fallback 1..10), so no bar is drawn. */
export function hasScale(values: ArrayLike<number>): boolean {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v > 0 && v < Infinity) return true;
  }
  return false;
}

/** One log10 range over all finite positive values (robust: ignores NaN, Inf, zeros). */
export function logScale(values: ArrayLike<number>): LogScale {
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v > 0 && v < Infinity) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  if (!(lo <= hi)) return { lo: -1, hi: 0 };
  let a = Math.log10(lo);
  let b = Math.log10(hi);
  if (b - a < 1e-6) {
    a -= 0.5;
    b += 0.5;
  }
  return { lo: a, hi: b };
}

/** The heatmap's colour range: the one the kernel computed (`meta.scale`, the same range as the
 *  static figures: 1st..99th percentile of log10 over finite non-zero cells), else the data's own
 *  min..max (a kernel that sends no range). */
export function heatScale(sent: unknown, values: ArrayLike<number>): LogScale {
  if (Array.isArray(sent) && sent.length === 2) {
    const [lo, hi] = sent.map(Number);
    if (Number.isFinite(lo) && Number.isFinite(hi) && hi > lo) return { lo, hi };
  }
  return logScale(values);
}

/** Position in [0, 1] of a value on the scale (values <= 0 go to 0, clipped at both ends). */
export function scalePos(v: number, s: LogScale): number {
  if (!(v > 0)) return 0;
  const t = (Math.log10(v) - s.lo) / (s.hi - s.lo);
  return t < 0 ? 0 : t > 1 ? 1 : t;
}

/** LUT index (0..255) of a value. */
export function lutIndex(v: number, s: LogScale): number {
  return Math.round(scalePos(v, s) * 255);
}

/** RGB of a value with its flags: marks win over the colour scale (non-finite > exploding >
 *  vanishing > no data). */
export function cellRgb(v: number, flags: number, s: LogScale): [number, number, number] {
  if (flags & FLAG_NONFINITE) return [...MARKS.nonfinite];
  if (flags & FLAG_EXPLODING) return [...MARKS.exploding];
  if (flags & FLAG_VANISHING) return [...MARKS.vanishing];
  if (flags & FLAG_NODATA || v !== v) return [...MARKS.nodata];
  const i = lutIndex(v, s) * 4;
  return [VIRIDIS[i], VIRIDIS[i + 1], VIRIDIS[i + 2]];
}

/**
 * Colour a rows x cols matrix into RGBA pixels laid out as an image whose pixel (x, y) is
 * column x of row order[y]. `order` maps display rows to matrix rows (e.g. depth order).
 */
export function colorize(
  data: Float32Array,
  flags: Uint8Array | null,
  rows: number,
  cols: number,
  order: ArrayLike<number>,
  s: LogScale,
  out?: Uint8ClampedArray,
): Uint8ClampedArray {
  const px = out && out.length === rows * cols * 4 ? out : new Uint8ClampedArray(rows * cols * 4);
  const span = s.hi - s.lo;
  const k = 255 / span;
  const LN10 = Math.LN10;
  for (let y = 0; y < rows; y++) {
    const r = order[y];
    const src = r * cols;
    let o = y * cols * 4;
    for (let x = 0; x < cols; x++, o += 4) {
      const f = flags ? flags[src + x] : 0;
      const v = data[src + x];
      let c: readonly number[] | null = null;
      if (f) {
        if (f & FLAG_NONFINITE) c = MARKS.nonfinite;
        else if (f & FLAG_EXPLODING) c = MARKS.exploding;
        else if (f & FLAG_VANISHING) c = MARKS.vanishing;
        else if (f & FLAG_NODATA) c = MARKS.nodata;
      } else if (v !== v) c = MARKS.nodata;
      if (c) {
        px[o] = c[0];
        px[o + 1] = c[1];
        px[o + 2] = c[2];
        px[o + 3] = 255;
        continue;
      }
      let t = v > 0 ? (Math.log(v) / LN10 - s.lo) * k : 0;
      t = t < 0 ? 0 : t > 255 ? 255 : t;
      const i = (t + 0.5) | 0;
      px[o] = VIRIDIS[4 * i];
      px[o + 1] = VIRIDIS[4 * i + 1];
      px[o + 2] = VIRIDIS[4 * i + 2];
      px[o + 3] = 255;
    }
  }
  return px;
}

/** 256 x RGBA lookup table of the difference map: DIFF_STOPS (the kernel's diverging map,
 *  colour-blind safe) linearly interpolated; entry 127.5 is no change. */
export const DIFF_LUT: Uint8ClampedArray = (() => {
  const stops = DIFF_STOPS.map(hexRgb);
  const lut = new Uint8ClampedArray(256 * 4);
  const n = stops.length - 1;
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * n;
    const k = Math.min(n - 1, Math.floor(t));
    const f = t - k;
    for (let c = 0; c < 3; c++) lut[4 * i + c] = Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f);
    lut[4 * i + 3] = 255;
  }
  return lut;
})();

/** RGB of a log10 ratio on the difference map's symmetric range [-maxAbs, maxAbs] (clipped);
 *  NaN (a run has no value there) is DIFF_NODATA. */
export function diffRgb(v: number, maxAbs: number): [number, number, number] {
  if (v !== v) return [...DIFF_NODATA];
  const i = diffIndex(v, maxAbs) * 4;
  return [DIFF_LUT[i], DIFF_LUT[i + 1], DIFF_LUT[i + 2]];
}

function diffIndex(v: number, maxAbs: number): number {
  const t = ((v / (maxAbs > 0 ? maxAbs : 1)) + 1) * 127.5;
  return t < 0 ? 0 : t > 255 ? 255 : (t + 0.5) | 0;
}

/** Colour a rows x cols matrix of log10 ratios (as `colorize`, on the difference map). */
export function colorizeDiff(
  data: Float32Array, rows: number, cols: number, order: ArrayLike<number>, maxAbs: number, out?: Uint8ClampedArray,
): Uint8ClampedArray {
  const px = out && out.length === rows * cols * 4 ? out : new Uint8ClampedArray(rows * cols * 4);
  for (let y = 0; y < rows; y++) {
    const src = order[y] * cols;
    let o = y * cols * 4;
    for (let x = 0; x < cols; x++, o += 4) {
      const v = data[src + x];
      if (v !== v) {
        px[o] = DIFF_NODATA[0];
        px[o + 1] = DIFF_NODATA[1];
        px[o + 2] = DIFF_NODATA[2];
      } else {
        const i = diffIndex(v, maxAbs) * 4;
        px[o] = DIFF_LUT[i];
        px[o + 1] = DIFF_LUT[i + 1];
        px[o + 2] = DIFF_LUT[i + 2];
      }
      px[o + 3] = 255;
    }
  }
  return px;
}

/** Relative luminance (WCAG) of an sRGB colour in 0..255: used to test perceptual ordering. */
export function luminance(c: readonly number[]): number {
  const f = (u: number) => {
    const x = u / 255;
    return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4);
  };
  return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
}

/** Nice tick values (powers of ten) inside a log scale, for axes and the colour bar. */
export function logTicks(s: LogScale, maxTicks = 6): number[] {
  const a = Math.ceil(s.lo - 1e-9);
  const b = Math.floor(s.hi + 1e-9);
  const n = b - a + 1;
  if (n <= 0) return [];
  const every = Math.max(1, Math.ceil(n / maxTicks));
  const out: number[] = [];
  for (let e = a; e <= b; e += every) out.push(e);
  return out;
}

/** Format a number compactly for labels and tooltips. */
export function fmt(v: number): string {
  if (v !== v) return "NaN";
  if (v === Infinity) return "Inf";
  if (v === -Infinity) return "-Inf";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (Number.isInteger(v) && a < 1e9) return String(v); // step numbers and counts stay exact
  if (a >= 1e4 || a < 1e-3) return v.toExponential(2);
  return Number(v.toPrecision(3)).toString();
}
