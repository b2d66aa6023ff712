// Optimistic two-way sync: the user's latest choice (a scrubbed step, a selected layer) is applied
// to the view at once and kept until the kernel agrees with it.
//
// While a cell runs, the kernel handles no message from the browser (they wait in its queue until
// the cell ends), yet it keeps sending updates: with `follow` still on, every update carries the
// newest step and would pull a scrubbed cursor back. ipywidgets drops only stale *echoes* of our
// own changes, not these updates, so the view filters them here.
//
// A step or layer that comes with new data (`meta` in the same update: the kernel's throttled
// push) gives way to a pending choice unless it agrees with it; one that comes alone (an echo of
// our own message, or `panel.step = ...` in Python) is the kernel's answer and always applies.
// An echo of the value the view already holds fires no change event, so agreement alone could
// leave a choice pending forever.

import { asFloat32, asFloat64, asUint8, Binary, bytesOf } from "./decode";
import type { Meta, PanelModel, Row } from "./protocol";

export class Intent {
  /** user step the cursor was scrubbed to (null: none pending) */
  step: number | null = null;
  /** the scrub went to the newest column: follow new steps */
  follow = false;
  /** layer the user selected (null: none pending) */
  layer: number | null = null;

  scrubbed(step: number, follow: boolean): void {
    this.step = step;
    this.follow = follow;
  }

  selected(layer: number): void {
    this.layer = layer;
  }

  /** The kernel's `step` changed (`withData`: in an update that carried new data): should the view
   *  take it? Yes when it came alone, agrees with the pending scrub, or nothing is pending. */
  kernelStep(step: number, withData = true): boolean {
    if (this.step === null) return true;
    if (!withData || step === this.step || (this.follow && step >= this.step)) {
      this.step = null;
      return true;
    }
    return false;
  }

  /** The kernel's `layer` changed: should the view take it? (as ``kernelStep``) */
  kernelLayer(layer: number, withData = true): boolean {
    if (this.layer === null) return true;
    if (!withData || layer === this.layer) {
      this.layer = null;
      return true;
    }
    return false;
  }

  /** Cursor column: the pending choice if any, else the kernel's step (`colFor` maps a step to a column). */
  cursor(cols: number, kernelStep: number, colFor: (step: number) => number): number {
    if (this.step === null) return colFor(kernelStep);
    return this.follow ? Math.max(0, cols - 1) : colFor(this.step);
  }
}

// ------------------------------------------------------------------ patches
// While training, the kernel sends only the heatmap's new columns (and the other traits that
// changed) as one custom message: {kind: "patch", base, start, values, buffers: [names]}. `base` is
// the `meta.seq` of the update it extends; the columns before `start` are unchanged. The patch is
// applied to the model itself, once per model (anywidget's `initialize`), in one `set`, so every
// view sees one consistent update, as if the kernel had sent the whole heatmap.


export interface Patch {
  kind: "patch";
  model_id?: string;
  base: number;
  start: number;
  values: Record<string, unknown> & { meta: Meta & { seq: number } };
  buffers: string[];
}

/** rows x start of `old` (rows x oldCols), then the rows of `tail` (rows x (cols - start)). */
function splice<T extends Float32Array | Uint8Array | Float64Array>(
  make: (n: number) => T, old: T, tail: T, rows: number, oldCols: number, start: number, cols: number): T {
  const out = make(rows * cols);
  const w = cols - start;
  for (let r = 0; r < rows; r++) {
    out.set(old.subarray(r * oldCols, r * oldCols + start), r * cols);
    out.set(tail.subarray(r * w, (r + 1) * w), r * cols + start);
  }
  return out;
}

const dv = (a: ArrayBufferView) => new DataView(a.buffer, a.byteOffset, a.byteLength);
const copy = (b: Binary) => {
  const [buf, off, len] = bytesOf(b);
  return new DataView(buf.slice(off, off + len) as ArrayBuffer);
};

/** Apply a patch to the model (with `setState`: the widget model's own set_state, which sets the
 *  values as a kernel update does, so they are never sent back to the kernel); false (and the kernel asked for everything) when the model does
 *  not hold the update the patch extends. */
export function applyPatch(m: PanelModel & { send?: (c: unknown) => void }, msg: unknown, buffers: Binary[] = [],
  setState?: (state: Record<string, unknown>) => void): boolean {
  const p = msg as Patch;
  if (!p || p.kind !== "patch") return false;
  const meta = (m.get("meta") || {}) as Partial<Meta> & { seq?: number };
  const next = p.values.meta;
  const rows = next.rows;
  const cols = next.cols;
  const oldCols = meta.cols ?? 0;
  if (meta.seq !== p.base || p.start > oldCols || meta.rows !== rows || p.start > cols) {
    console.debug(`gradwidget: patch ${next.seq} extends ${p.base}, the page holds ${meta.seq}: asking for everything`);
    m.send?.({ kind: "resend" });
    return false;
  }
  const buf: Record<string, Binary> = {};
  p.buffers.forEach((name, i) => (buf[name] = buffers[i]));
  try {
    const w = cols - p.start;
    // a patch's meta leaves out what did not change (the layers)
    const state: Record<string, unknown> = { ...p.values, meta: { ...meta, ...p.values.meta } };
    state.heat = dv(splice((n) => new Float32Array(n), asFloat32(m.get("heat"), rows * oldCols),
      asFloat32(buf.heat, rows * w), rows, oldCols, p.start, cols));
    state.flags = dv(splice((n) => new Uint8Array(n), asUint8(m.get("flags"), rows * oldCols),
      asUint8(buf.flags, rows * w), rows, oldCols, p.start, cols));
    state.col_steps = dv(splice((n) => new Float64Array(n), asFloat64(m.get("col_steps"), oldCols),
      asFloat64(buf.col_steps, w), 1, oldCols, p.start, cols));
    state.loss = dv(splice((n) => new Float32Array(n), asFloat32(m.get("loss"), oldCols),
      asFloat32(buf.loss, w), 1, oldCols, p.start, cols));
    for (const name of p.buffers.slice(4)) state[name] = copy(buf[name]);
    (setState ?? (m.set as unknown as (s: Record<string, unknown>) => void))(state);
    return true;
  } catch (err) {
    console.debug(`gradwidget: patch ${next.seq} could not be applied (${(err as Error).message}): asking for everything`);
    m.send?.({ kind: "resend" });
    return false;
  }
}

/** Rows of the health table that changed: {kind: "rows", rows: [[position, row], ...]}, spliced
 *  into the model's table (the same layers in the same order as the kernel's last full table). */
export function applyRows(m: PanelModel, msg: unknown, setState?: (state: Record<string, unknown>) => void): boolean {
  const p = msg as { kind?: string; rows?: [number, Row][] };
  if (!p || p.kind !== "rows" || !Array.isArray(p.rows)) return false;
  const table = (m.get("table") || []).slice();
  for (const [i, row] of p.rows) {
    if (!(i >= 0 && i < table.length) || table[i].index !== row.index) {
      (m as { send?: (c: unknown) => void }).send?.({ kind: "resend" });
      return false;
    }
    table[i] = row;
  }
  (setState ?? (m.set as unknown as (s: Record<string, unknown>) => void))({ table });
  return true;
}
