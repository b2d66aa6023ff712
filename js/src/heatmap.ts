// The layers x steps heatmap. Colouring two million cells is done once per data update into an
// offscreen image at the data's own resolution (folded to the canvas' device pixels); a scrub only
// blits that image and draws the cursor, which keeps redraws far below a frame.

import { colorize, colorizeDiff, LogScale } from "./colormap";
import { decimate, Grid } from "./decimate";
import { MIN_LABEL_PX, Rect } from "./layout";
import { Theme } from "./theme";
import { fmt } from "./colormap";
import { distinctLabels, elide } from "./names";
import { colPosition, niceTicks } from "./ticks";

export class HeatmapImage {
  canvas: HTMLCanvasElement | null = null;
  rows = 0; // rows of the image (after folding)
  cols = 0;
  private pixels: Uint8ClampedArray | undefined;

  /** Colour `grid` (display row order) into an image of at most maxRows x maxCols pixels; with
   *  `diffMax`, the grid holds log10 ratios drawn on the difference map over +-diffMax. */
  build(grid: Grid, scale: LogScale, maxRows: number, maxCols: number, diffMax?: number): void {
    const g = decimate(grid, Math.max(1, Math.floor(maxRows)), Math.max(1, Math.floor(maxCols)));
    this.rows = g.rows;
    this.cols = g.cols;
    if (g.rows * g.cols === 0) {
      this.canvas = null;
      return;
    }
    const identity = new Int32Array(g.rows);
    for (let i = 0; i < g.rows; i++) identity[i] = i;
    this.pixels = diffMax === undefined
      ? colorize(g.data, g.flags, g.rows, g.cols, identity, scale, this.pixels)
      : colorizeDiff(g.data, g.rows, g.cols, identity, diffMax, this.pixels);
    const c = this.canvas ?? document.createElement("canvas");
    c.width = g.cols;
    c.height = g.rows;
    const ctx = c.getContext("2d")!;
    const img = new ImageData(this.pixels as Uint8ClampedArray<ArrayBuffer>, g.cols, g.rows);
    ctx.putImageData(img, 0, 0);
    this.canvas = c;
  }

  /** Free the image's canvas and pixels (a closed view keeps no pixel memory). */
  dispose(): void {
    if (this.canvas) this.canvas.width = this.canvas.height = 0;
    this.canvas = null;
    this.pixels = undefined;
  }

  /** Blit the image into `r`, nearest-neighbour (cells stay crisp). */
  draw(ctx: CanvasRenderingContext2D, r: Rect): void {
    if (!this.canvas) return;
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(this.canvas, r.x, r.y, r.w, r.h);
  }
}

/** Vertical cursor at column `col` of `cols`, drawn twice (halo + line) to show on any colour. */
export function drawCursor(ctx: CanvasRenderingContext2D, r: Rect, cols: number, col: number, t: Theme): void {
  if (cols <= 0) return;
  const w = r.w / cols;
  const x = r.x + (col + 0.5) * w;
  ctx.save();
  if (w >= 4) {
    ctx.strokeStyle = t.cursor;
    ctx.lineWidth = 1.5;
    ctx.strokeRect(r.x + col * w + 0.5, r.y + 0.5, w - 1, r.h - 1);
  }
  ctx.strokeStyle = t.dark ? "rgba(0,0,0,0.8)" : "rgba(255,255,255,0.9)";
  ctx.lineWidth = 3;
  ctx.beginPath();
  ctx.moveTo(x, r.y);
  ctx.lineTo(x, r.y + r.h);
  ctx.stroke();
  ctx.strokeStyle = t.cursor;
  ctx.lineWidth = 1.25;
  ctx.stroke();
  ctx.restore();
}

/** The mark of where the first NaN/Inf was made: a ring at (column, display row), or a triangle on
 *  the bottom edge when it began in the loss or the input (row -1). Magenta, as NaN cells. */
export function drawOrigin(
  ctx: CanvasRenderingContext2D, r: Rect, rows: number, cols: number, col: number, row: number, t: Theme,
): void {
  if (cols <= 0 || col < 0 || col >= cols || rows <= 0) return;
  const w = r.w / cols;
  const h = r.h / rows;
  const x = r.x + (col + 0.5) * w;
  ctx.save();
  ctx.strokeStyle = t.dark ? "#000" : "#fff";
  ctx.fillStyle = "#ff00ff";
  if (row >= 0 && row < rows) {
    const y = r.y + (row + 0.5) * h;
    const rad = Math.max(4, Math.min(9, Math.min(w, h)));
    ctx.lineWidth = 4;
    ctx.beginPath();
    ctx.arc(x, y, rad, 0, 2 * Math.PI);
    ctx.stroke();
    ctx.strokeStyle = "#ff00ff";
    ctx.lineWidth = 2;
    ctx.stroke();
  } else {
    const y = r.y + r.h;
    ctx.beginPath();
    ctx.moveTo(x, y - 9);
    ctx.lineTo(x - 6, y);
    ctx.lineTo(x + 6, y);
    ctx.closePath();
    ctx.fill();
    ctx.lineWidth = 1;
    ctx.stroke();
  }
  ctx.restore();
}

/** Outline of the selected layer's row across the heatmap and the bars. */
export function drawRowSelection(ctx: CanvasRenderingContext2D, r: Rect, rows: number, row: number, t: Theme): void {
  if (row < 0 || row >= rows) return;
  const h = r.h / rows;
  const y = r.y + row * h;
  ctx.save();
  ctx.strokeStyle = t.accent;
  ctx.lineWidth = 2;
  ctx.strokeRect(r.x - 1, y - 1, r.w + 2, Math.max(h, 1) + 2);
  ctx.restore();
}

/** Layer names down the gutter (every `every`-th, and the rows of `always`: where an expanded
 *  group begins), selected one highlighted; no two closer than `every` rows. */
export function drawGutter(
  ctx: CanvasRenderingContext2D,
  r: Rect,
  names: string[],
  every: number,
  selected: number,
  t: Theme,
  always: ReadonlySet<number> = new Set(),
): void {
  const n = names.length;
  if (!n) return;
  const h = r.h / n;
  ctx.save();
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  const size = Math.max(MIN_LABEL_PX, Math.min(11, h));
  const labels = distinctLabels(names, Math.max(4, Math.floor(r.w / (size * 0.58))));
  const forced = (i: number) => i === selected || always.has(i);
  // a name drawn out of turn (selected, or where an expanded group begins) hides its near neighbours'
  const crowded = (i: number) => {
    for (let k = 1; k < every; k++) if (forced(i - k) || forced(i + k)) return true;
    return false;
  };
  for (let i = 0; i < n; i++) {
    if (!forced(i) && (i % every !== 0 || crowded(i))) continue;
    const sel = i === selected;
    ctx.font = `${sel ? "bold " : ""}${size}px ${t.font}`;
    ctx.fillStyle = sel ? t.accent : t.fg2;
    ctx.fillText(labels[i], r.x + r.w, r.y + (i + 0.5) * h);
  }
  ctx.restore();
}

/** A name elided to fit `width` px at font `size`: the block index and the parameter are kept, the
 *  middle of the module path goes first (names.ts, as the static figures do). */
export function shorten(name: string, width: number, size = 11): string {
  return elide(name, Math.max(4, Math.floor(width / (size * 0.58))));
}

/** Step ticks under the heatmap on round step numbers (ticks.ts), about one per 90 px, each at
 *  its step's place (a column may hold several steps). */
export function drawStepAxis(
  ctx: CanvasRenderingContext2D,
  r: Rect,
  colSteps: ArrayLike<number>,
  t: Theme,
  lastStep?: number,
  block = 1,
): void {
  const C = colSteps.length;
  if (!C) return;
  const last = lastStep ?? colSteps[C - 1];
  ctx.save();
  ctx.fillStyle = t.fg2;
  ctx.strokeStyle = t.grid;
  ctx.font = `10px ${t.font}`;
  ctx.textBaseline = "top";
  const ticks = niceTicks(colSteps[0], last, Math.max(2, Math.floor(r.w / 90)));
  for (const s of ticks) {
    const pos = colPosition(colSteps, s, last);
    if (pos < 0) continue;
    // one recorded step per column: between the cells' centres; several: where the step falls in its column
    const x = r.x + ((block <= 1 ? pos + 0.5 : pos) / C) * r.w;
    ctx.beginPath();
    ctx.moveTo(x, r.y);
    ctx.lineTo(x, r.y + 4);
    ctx.stroke();
    ctx.textAlign = x - r.x < 20 ? "left" : r.x + r.w - x < 20 ? "right" : "center";
    ctx.fillText(fmt(s), x, r.y + 6);
  }
  ctx.restore();
}
