// Geometry of the panel's main canvas: a gutter of layer names, the heatmap, and the per-layer bars
// beside it, sharing rows. Pure functions of the container size and the data's shape.

export interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

export interface MainLayout {
  width: number;
  height: number;
  gutter: Rect; // layer names
  heat: Rect; // heatmap cells
  bars: Rect; // per-layer bars at the scrubbed step
  axis: Rect; // step axis under the heatmap
  rowH: number; // CSS pixels per layer row
  labelEvery: number; // draw every n-th layer name
  stacked: boolean; // bars under the heatmap (narrow cells)
}

export const ROW_MAX = 16;
/** Narrowest drawing width (CSS px): the root's min-width (style.ts) less its 2 x 4 px padding, so a
 * panel squeezed to its minimum never overflows its own box. */
export const MIN_WIDTH = 232;
export const MIN_HEAT_H = 120;
export const MAX_HEAT_H = 440;

export function mainLayout(width: number, nLayers: number, opts: { maxHeight?: number } = {}): MainLayout {
  const W = Math.max(MIN_WIDTH, Math.floor(width));
  const rows = Math.max(1, nLayers);
  const maxH = opts.maxHeight ?? MAX_HEAT_H;
  const heatH = Math.max(MIN_HEAT_H, Math.min(maxH, rows * ROW_MAX));
  const rowH = heatH / rows;
  const narrow = W < 560;
  const gutterW = narrow ? Math.min(90, Math.floor(W * 0.22)) : Math.min(170, Math.max(90, Math.floor(W * 0.14)));
  const top = 16; // room for the bars' title
  const axisH = 22;
  if (narrow) {
    const heatW = W - gutterW - 8;
    const heat = { x: gutterW, y: top, w: heatW, h: heatH };
    const axis = { x: gutterW, y: top + heatH, w: heatW, h: axisH };
    const barsTop = top + heatH + axisH + 10;
    const bars = { x: gutterW, y: barsTop, w: heatW, h: heatH };
    return {
      width: W,
      height: barsTop + heatH + axisH,
      gutter: { x: 0, y: top, w: gutterW - 4, h: heatH },
      heat,
      bars,
      axis,
      rowH,
      labelEvery: labelEvery(rowH),
      stacked: true,
    };
  }
  const barsW = Math.max(140, Math.min(300, Math.floor(W * 0.24)));
  const gap = 14;
  const heatW = W - gutterW - gap - barsW - 8;
  const heat = { x: gutterW, y: top, w: heatW, h: heatH };
  return {
    width: W,
    height: top + heatH + axisH + 4,
    gutter: { x: 0, y: top, w: gutterW - 4, h: heatH },
    heat,
    bars: { x: gutterW + heatW + gap, y: top, w: barsW, h: heatH },
    axis: { x: gutterW, y: top + heatH, w: heatW, h: axisH },
    rowH,
    labelEvery: labelEvery(rowH),
    stacked: false,
  };
}

/** Smallest font (CSS px) of a layer name in the gutter: rows at least this tall are all labelled. */
export const MIN_LABEL_PX = 8;

/** Draw every n-th layer name so labels (at least MIN_LABEL_PX tall, at most a row) never overlap. */
export function labelEvery(rowH: number): number {
  return Math.max(1, Math.ceil(MIN_LABEL_PX / Math.max(rowH, 1e-6) - 1e-9));
}

/** Display row under a y coordinate (CSS px) in a rect with `rows` rows, or -1 outside. */
export function rowAt(r: Rect, rows: number, y: number): number {
  if (y < r.y || y >= r.y + r.h || rows <= 0) return -1;
  return Math.min(rows - 1, Math.floor(((y - r.y) / r.h) * rows));
}

/** Column under an x coordinate (CSS px) in a rect with `cols` columns, clamped to the range. */
export function colAt(r: Rect, cols: number, x: number): number {
  if (cols <= 0) return 0;
  const c = Math.floor(((x - r.x) / r.w) * cols);
  return c < 0 ? 0 : c >= cols ? cols - 1 : c;
}

/** x (CSS px) of the centre of column c. */
export function colX(r: Rect, cols: number, c: number): number {
  return r.x + ((c + 0.5) / Math.max(1, cols)) * r.w;
}

/** Narrower than this (CSS px), the health table takes the whole width and the plots go under it. */
export const STACK_BELOW = 1100;

/** Bottom row layout: table beside the plots, or stacked over them when narrow. */
export function bottomLayout(width: number): { stacked: boolean; plotW: number; tableW: number } {
  const W = Math.max(MIN_WIDTH, Math.floor(width));
  // the table's decision columns need about 700 px: beside the plots only on wide screens
  if (W < STACK_BELOW) return { stacked: true, plotW: W >= 600 ? Math.floor((W - 8) / 2) : W, tableW: W };
  const plotW = Math.max(300, Math.min(520, Math.floor(W * 0.42)));
  return { stacked: false, plotW, tableW: W - plotW - 12 };
}

/** Columns worth requesting from the kernel for a heatmap this many CSS px wide. */
export function wantedColumns(heatCssWidth: number, dpr: number, cap = 2048): number {
  const px = Math.ceil(Math.max(1, heatCssWidth) * Math.max(1, dpr));
  return Math.max(64, Math.min(cap, px));
}

/** Size a canvas's backing store to its CSS size times the device pixel ratio. */
export function fitCanvas(c: HTMLCanvasElement, w: number, h: number, dpr: number): CanvasRenderingContext2D {
  const W = Math.max(1, Math.round(w * dpr));
  const H = Math.max(1, Math.round(h * dpr));
  if (c.width !== W) c.width = W;
  if (c.height !== H) c.height = H;
  c.style.width = `${w}px`;
  c.style.height = `${h}px`;
  const ctx = c.getContext("2d")!;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}
