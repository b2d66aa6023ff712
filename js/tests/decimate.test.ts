import { describe, expect, it } from "vitest";
import { blocks, colForStep, decimate, displayOrder, reorderRows } from "../src/decimate";
import { FLAG_EXPLODING, FLAG_NONFINITE, FLAG_VANISHING } from "../src/protocol";

describe("blocks", () => {
  it("covers every item once in at most m groups", () => {
    for (const [n, m] of [[10, 3], [2048, 700], [7, 7], [5, 100], [1000, 1]]) {
      const b = blocks(n, m);
      expect(b[0]).toBe(0);
      expect(b[b.length - 1]).toBe(n);
      expect(b.length - 1).toBeLessThanOrEqual(Math.min(n, m));
      for (let i = 1; i < b.length; i++) expect(b[i]).toBeGreaterThan(b[i - 1]);
    }
  });
});

describe("decimate", () => {
  it("returns the grid untouched when it fits", () => {
    const g = { rows: 2, cols: 3, data: new Float32Array(6), flags: null };
    expect(decimate(g, 2, 3)).toBe(g);
  });

  it("bounds the output and ORs the flags so a single flagged cell survives", () => {
    const rows = 1000;
    const cols = 2048;
    const data = new Float32Array(rows * cols).fill(1);
    const flags = new Uint8Array(rows * cols);
    flags[500 * cols + 1000] = FLAG_NONFINITE;
    flags[3 * cols + 7] = FLAG_EXPLODING;
    const g = decimate({ rows, cols, data, flags }, 400, 700);
    expect(g.rows).toBeLessThanOrEqual(400);
    expect(g.cols).toBeLessThanOrEqual(700);
    let nf = 0;
    let ex = 0;
    for (const f of g.flags!) {
      if (f & FLAG_NONFINITE) nf++;
      if (f & FLAG_EXPLODING) ex++;
    }
    expect(nf).toBe(1);
    expect(ex).toBe(1);
  });

  it("keeps block means and the minimum of vanishing blocks", () => {
    const data = new Float32Array([1, 3, 1e-9, 5, 1, 1000]); // 1 row x 6 cols
    const flags = new Uint8Array([0, 0, FLAG_VANISHING, 0, 0, 0]);
    const g = decimate({ rows: 1, cols: 6, data, flags }, 1, 3);
    expect(g.data[0]).toBeCloseTo(2);
    expect(g.data[1]).toBeCloseTo(1e-9);
    expect(g.data[2]).toBeCloseTo(500.5);
    expect(g.flags![1] & FLAG_VANISHING).toBeTruthy();
  });

  it("gives NaN only to all-NaN blocks", () => {
    const g = decimate({ rows: 1, cols: 4, data: new Float32Array([NaN, NaN, NaN, 2]), flags: null }, 1, 2);
    expect(Number.isNaN(g.data[0])).toBe(true);
    expect(g.data[1]).toBe(2);
  });
});

describe("rows and steps", () => {
  it("reorders rows; the display order is depth order (input side at the top)", () => {
    const src = new Float32Array([1, 1, 2, 2, 3, 3]);
    expect(Array.from(reorderRows(src, 3, 2, Int32Array.from([2, 1, 0])))).toEqual([3, 3, 2, 2, 1, 1]);
    expect(Array.from(reorderRows(src, 3, 2, displayOrder(3)))).toEqual([1, 1, 2, 2, 3, 3]);
    expect(Array.from(displayOrder(4))).toEqual([0, 1, 2, 3]);
  });

  it("finds the column of a step", () => {
    const cs = [0, 10, 20, 30];
    expect(colForStep(cs, -5)).toBe(0);
    expect(colForStep(cs, 0)).toBe(0);
    expect(colForStep(cs, 19)).toBe(1);
    expect(colForStep(cs, 20)).toBe(2);
    expect(colForStep(cs, 999)).toBe(3);
    expect(colForStep([], 3)).toBe(0);
  });
});
