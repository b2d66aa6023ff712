// Fitting data to the pixels that show it. The kernel already sends at most `columns` step columns;
// here rows (layers) and columns are folded further when the canvas has fewer device pixels, so
// that every flagged cell still reaches the screen (flags are OR-ed; values are block means,
// the minimum for vanishing blocks).

import { FLAG_VANISHING } from "./protocol";

export interface Grid {
  rows: number;
  cols: number;
  data: Float32Array; // rows x cols, row-major
  flags: Uint8Array | null; // rows x cols
}

/** Block boundaries folding n items into at most m groups: starts[i]..starts[i+1]. */
export function blocks(n: number, m: number): Int32Array {
  const g = Math.max(1, Math.min(n, Math.floor(m)));
  const starts = new Int32Array(g + 1);
  for (let i = 0; i <= g; i++) starts[i] = Math.round((i * n) / g);
  return starts;
}

/**
 * Fold a grid (already in display row order) to at most maxRows x maxCols. Values: mean of the
 * finite entries of a block, except that a block containing a vanishing cell keeps its minimum
 * (so a fade is not averaged away). Flags: bitwise OR, so a single exploding or non-finite cell
 * still marks its block. NaN only when the whole block is NaN.
 */
export function decimate(g: Grid, maxRows: number, maxCols: number): Grid {
  if (g.rows <= maxRows && g.cols <= maxCols) return g;
  const rb = blocks(g.rows, maxRows);
  const cb = blocks(g.cols, maxCols);
  const R = rb.length - 1;
  const C = cb.length - 1;
  const data = new Float32Array(R * C);
  const flags = g.flags ? new Uint8Array(R * C) : null;
  for (let r = 0; r < R; r++) {
    for (let c = 0; c < C; c++) {
      let sum = 0;
      let n = 0;
      let mx = -Infinity;
      let mn = Infinity;
      let f = 0;
      for (let i = rb[r]; i < rb[r + 1]; i++) {
        const base = i * g.cols;
        for (let j = cb[c]; j < cb[c + 1]; j++) {
          const v = g.data[base + j];
          if (v === v) {
            if (v > mx) mx = v;
            if (v < mn) mn = v;
            if (v !== Infinity && v !== -Infinity) {
              sum += v;
              n++;
            }
          }
          if (g.flags) f |= g.flags[base + j];
        }
      }
      let out: number;
      if (mx === -Infinity) out = NaN;
      else if (f & FLAG_VANISHING) out = mn;
      else if (n === 0) out = mx;
      else out = sum / n;
      data[r * C + c] = out;
      if (flags) flags[r * C + c] = f;
    }
  }
  return { rows: R, cols: C, data, flags };
}

/** Reorder the rows of a rows x cols matrix (display row y = source row order[y]). */
export function reorderRows<T extends Float32Array | Uint8Array>(
  src: T,
  rows: number,
  cols: number,
  order: ArrayLike<number>,
): T {
  const out = new (src.constructor as { new (n: number): T })(rows * cols);
  for (let y = 0; y < rows; y++) out.set(src.subarray(order[y] * cols, order[y] * cols + cols), y * cols);
  return out;
}

/** Column of a step: the last column whose first step is <= step (0 if before the first). */
export function colForStep(colSteps: ArrayLike<number>, step: number): number {
  let lo = 0;
  let hi = colSteps.length - 1;
  if (hi < 0) return 0;
  if (step <= colSteps[0]) return 0;
  if (step >= colSteps[hi]) return hi;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (colSteps[mid] <= step) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** Display order of layers: depth order, the input side at the top as in the model's printout,
 *  the health table, the HTML report and the ASCII view (one orientation everywhere). */
export function displayOrder(n: number): Int32Array {
  const o = new Int32Array(n);
  for (let i = 0; i < n; i++) o[i] = i;
  return o;
}
