import { describe, expect, it } from "vitest";
import { Intent } from "../src/sync";

// columns start at steps 0, 10, 20, 30 (a step maps to the column it falls in)
const colSteps = [0, 10, 20, 30];
const colFor = (s: number) => {
  let c = 0;
  for (let i = 0; i < colSteps.length; i++) if (colSteps[i] <= s) c = i;
  return c;
};

describe("optimistic sync while the kernel is busy", () => {
  it("takes the kernel's step when nothing is pending", () => {
    const it_ = new Intent();
    expect(it_.kernelStep(30)).toBe(true);
    expect(it_.cursor(4, 30, colFor)).toBe(3);
  });

  it("keeps a scrubbed cursor while a busy, still-following kernel sends newer steps", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    expect(i.cursor(4, 39, colFor)).toBe(1); // the view moved at once
    for (const s of [39, 45, 52]) expect(i.kernelStep(s)).toBe(false); // updates from the training loop
    expect(i.cursor(4, 52, colFor)).toBe(1);
    expect(i.kernelStep(10)).toBe(true); // the cell ended: the kernel took the scrub (its echo)
    expect(i.step).toBeNull();
    expect(i.kernelStep(11)).toBe(true); // later kernel changes (panel.step = ...) apply again
  });

  it("back to the newest column follows again, ignoring a kernel that still holds an old scrub", () => {
    const i = new Intent();
    i.scrubbed(30, true);
    expect(i.cursor(4, 12, colFor)).toBe(3);
    expect(i.kernelStep(12)).toBe(false); // the kernel's stale, not-following step
    expect(i.cursor(5, 12, colFor)).toBe(4); // a new column arrived: the cursor stays on the newest
    expect(i.kernelStep(41)).toBe(true); // the kernel follows: newer than the scrub
    expect(i.step).toBeNull();
  });

  it("takes a step or layer that comes alone: the kernel's answer (an echo, or panel.step = ... in Python)", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    expect(i.kernelStep(52, true)).toBe(false); // with new data: a stale follow
    expect(i.kernelStep(20, false)).toBe(true); // alone: panel.step = 20 after the cell
    expect(i.step).toBeNull();
    i.selected(3);
    expect(i.kernelLayer(1, true)).toBe(false);
    expect(i.kernelLayer(1, false)).toBe(true);
    expect(i.layer).toBeNull();
  });

  it("keeps a selected layer until the kernel has it", () => {
    const i = new Intent();
    expect(i.kernelLayer(2)).toBe(true);
    i.selected(5);
    expect(i.kernelLayer(2)).toBe(false);
    expect(i.kernelLayer(5)).toBe(true);
    expect(i.kernelLayer(1)).toBe(true);
  });
});

import { applyPatch } from "../src/sync";

describe("applyPatch", () => {
  const f32 = (a: number[]) => new DataView(new Float32Array(a).buffer);
  const f64 = (a: number[]) => new DataView(new Float64Array(a).buffer);
  const u8 = (a: number[]) => new DataView(new Uint8Array(a).buffer);
  function model(state: Record<string, unknown>) {
    const sent: unknown[] = [];
    const m = {
      get: (k: string) => state[k],
      set: (k: string | Record<string, unknown>, v?: unknown) => {
        if (typeof k === "string") state[k] = v;
        else Object.assign(state, k);
      },
      save_changes() {},
      on() {},
      off() {},
      send: (c: unknown) => sent.push(c),
    };
    return { m: m as never, sent, state };
  }
  // 2 layers x 3 columns; the last column grew, and one column is new
  const base = () => ({
    meta: { seq: 4, rows: 2, cols: 3 }, heat: f32([1, 2, 3, 4, 5, 6]), flags: u8([0, 0, 1, 0, 0, 2]),
    col_steps: f64([0, 1, 2]), loss: f32([9, 8, 7]),
  });
  const patch = (b: number) => ({
    kind: "patch", base: b, start: 2, buffers: ["heat", "flags", "col_steps", "loss", "hist_all"],
    values: { meta: { seq: 5, rows: 2, cols: 4 }, step: 3 },
  });
  const buffers = [f32([30, 31, 60, 61]), u8([1, 4, 2, 8]), f64([2, 3]), f32([6, 5]), u8([7])];

  it("splices the new columns after the unchanged ones, in every row", () => {
    const { m, state, sent } = model(base());
    expect(applyPatch(m, patch(4), buffers)).toBe(true);
    const heat = new Float32Array((state.heat as DataView).buffer);
    expect(Array.from(heat)).toEqual([1, 2, 30, 31, 4, 5, 60, 61]);
    expect(Array.from(new Uint8Array((state.flags as DataView).buffer))).toEqual([0, 0, 1, 4, 0, 0, 2, 8]);
    expect(Array.from(new Float64Array((state.col_steps as DataView).buffer))).toEqual([0, 1, 2, 3]);
    expect(Array.from(new Float32Array((state.loss as DataView).buffer))).toEqual([9, 8, 6, 5]);
    expect(Array.from(new Uint8Array((state.hist_all as DataView).buffer))).toEqual([7]);
    expect((state.meta as { seq: number }).seq).toBe(5);
    expect(state.step).toBe(3);
    expect(sent).toEqual([]);
  });

  it("asks for everything when it does not hold the update the patch extends", () => {
    const { m, state, sent } = model(base());
    expect(applyPatch(m, patch(3), buffers)).toBe(false);
    expect(sent).toEqual([{ kind: "resend" }]);
    expect((state.meta as { seq: number }).seq).toBe(4);
    expect(applyPatch(m, { kind: "other" }, [])).toBe(false);
  });
});

import { applyRows } from "../src/sync";

describe("applyRows", () => {
  it("splices changed rows, and asks for everything when the rows do not match", () => {
    const state: Record<string, unknown> = { table: [{ index: 0, layer: "a", v: 1 }, { index: 1, layer: "b", v: 2 }] };
    const sent: unknown[] = [];
    const m = {
      get: (k: string) => state[k], set: (s: Record<string, unknown>) => Object.assign(state, s),
      save_changes() {}, on() {}, off() {}, send: (c: unknown) => sent.push(c),
    } as never;
    expect(applyRows(m, { kind: "rows", rows: [[1, { index: 1, layer: "b", v: 5 }]] })).toBe(true);
    expect((state.table as { v: number }[]).map((r) => r.v)).toEqual([1, 5]);
    expect(applyRows(m, { kind: "rows", rows: [[1, { index: 7, layer: "x" }]] })).toBe(false);
    expect(sent).toEqual([{ kind: "resend" }]);
  });
});
