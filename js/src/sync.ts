// The cursor and the selected layer have one owner, the kernel, and one order. The page numbers
// each choice it makes (a scrubbed step, a selected layer) and sends the number with it (`choice`);
// the kernel applies a choice only when it is newer than the last it applied and says which it
// applied (`choice_applied`, in the same update as the step and layer it set). The page shows its
// own choice at once and keeps it on screen until the kernel has applied it: meanwhile a step or
// a layer from the kernel (an update of a training loop still following the newest step, a late
// echo, `panel.step = ...` in Python before the choice arrived) is older than the choice and does
// not move the view. Once the kernel has applied it, the kernel's values are the newest and the
// view takes them, so the last action wins on both sides, whichever side made it.
//
// While a cell runs, the kernel handles no message from the browser (they wait in its queue until
// the cell ends), yet it keeps sending updates: the choice stays pending until the cell ends.

import { asFloat32, asFloat64, asUint8, Binary, bytesOf } from "./decode";
import type { Meta, PanelModel, Row } from "./protocol";

/** The number of the next choice made on a page of model `m`: above every choice a view of this
 *  model sent (`choice`, shared by its views) and every choice the kernel applied (from any page). */
export function nextChoice(m: Pick<PanelModel, "get">): number {
  return Math.max(Number(m.get("choice")) || 0, Number(m.get("choice_applied")) || 0) + 1;
}

/** A choice not sent yet (the step's send waits on a throttle): nothing the kernel applied covers it. */
const UNSENT = Number.POSITIVE_INFINITY;

export class Intent {
  /** user step the cursor was scrubbed to (null: none pending) */
  step: number | null = null;
  /** the scrub went to the newest column: follow new steps */
  follow = false;
  /** layer the user selected (null: none pending) */
  layer: number | null = null;
  /** the numbers of the choices that carry `step` and `layer` (UNSENT until sent) */
  stepChoice = UNSENT;
  layerChoice = UNSENT;

  scrubbed(step: number, follow: boolean): void {
    this.step = step;
    this.follow = follow;
    this.stepChoice = UNSENT;
  }

  /** The pending scrub went out as choice `n`. */
  sentStep(n: number): void {
    if (this.step !== null) this.stepChoice = n;
  }

  selected(layer: number, n: number): void {
    this.layer = layer;
    this.layerChoice = n;
  }

  /** The kernel applied the page's choices up to number `n`: those are no longer pending (the
   *  kernel's step and layer hold them now, or something newer). */
  applied(n: number): void {
    if (this.step !== null && n >= this.stepChoice) this.step = null;
    if (this.layer !== null && n >= this.layerChoice) this.layer = null;
  }

  /** The kernel's step is the one to show (no choice of the page is newer). */
  get kernelStep(): boolean {
    return this.step === null;
  }

  /** The kernel's layer is the one to show. */
  get kernelLayer(): boolean {
    return this.layer === null;
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
