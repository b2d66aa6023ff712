import { describe, expect, it } from "vitest";
import { Intent, nextChoice } from "../src/sync";

// columns start at steps 0, 10, 20, 30 (a step maps to the column it falls in)
const colSteps = [0, 10, 20, 30];
const colFor = (s: number) => {
  let c = 0;
  for (let i = 0; i < colSteps.length; i++) if (colSteps[i] <= s) c = i;
  return c;
};

describe("the cursor's order: numbered choices, the kernel applies the newest", () => {
  it("takes the kernel's step when nothing is pending", () => {
    const i = new Intent();
    expect(i.kernelStep).toBe(true);
    expect(i.cursor(4, 30, colFor)).toBe(3);
  });

  it("keeps a scrubbed cursor while a busy, still-following kernel sends newer steps", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    i.sentStep(7);
    expect(i.cursor(4, 39, colFor)).toBe(1); // the view moved at once
    i.applied(6); // updates from the training loop: the kernel has not read choice 7 yet
    expect(i.kernelStep).toBe(false);
    expect(i.cursor(4, 52, colFor)).toBe(1);
    i.applied(7); // the cell ended: the kernel applied the scrub
    expect(i.step).toBeNull();
    expect(i.kernelStep).toBe(true); // later kernel changes (panel.step = ...) apply again
  });

  it("a late kernel step (an earlier drag position's echo) never moves a newer choice", () => {
    const i = new Intent();
    for (const [n, s] of [[1, 30], [2, 20], [3, 10]] as [number, number][]) {
      i.scrubbed(s, false);
      i.sentStep(n);
    }
    i.applied(2); // the kernel's update for choice 2 (step 20) arrives after the page sent 3
    expect(i.kernelStep).toBe(false);
    expect(i.cursor(4, 20, colFor)).toBe(1);
    i.applied(3);
    expect(i.kernelStep).toBe(true);
  });

  it("a scrub not sent yet is covered by no applied choice", () => {
    const i = new Intent();
    i.scrubbed(10, false);
    i.applied(1_000);
    expect(i.step).toBe(10);
    i.sentStep(1_001);
    i.applied(1_001);
    expect(i.step).toBeNull();
  });

  it("back to the newest column follows new steps until the kernel has the choice", () => {
    const i = new Intent();
    i.scrubbed(30, true);
    i.sentStep(4);
    expect(i.cursor(4, 12, colFor)).toBe(3);
    expect(i.cursor(5, 12, colFor)).toBe(4); // a new column arrived: the cursor stays on the newest
    i.applied(4);
    expect(i.step).toBeNull();
  });

  it("keeps a selected layer until the kernel has applied it", () => {
    const i = new Intent();
    expect(i.kernelLayer).toBe(true);
    i.selected(5, 2);
    i.applied(1);
    expect(i.kernelLayer).toBe(false);
    i.applied(2);
    expect(i.kernelLayer).toBe(true);
  });

  it("numbers a model's choices above any a view sent or the kernel applied", () => {
    const state: Record<string, number> = { choice: 3, choice_applied: 5 };
    const m = { get: (k: string) => state[k] } as never;
    expect(nextChoice(m)).toBe(6);
    state.choice = 9;
    expect(nextChoice(m)).toBe(10);
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
