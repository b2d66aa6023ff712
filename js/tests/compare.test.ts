import { describe, expect, it } from "vitest";
import { colorizeDiff, DIFF_LUT, diffRgb, luminance } from "../src/colormap";
import { CONSTANTS, decodeHeat, DIFF_NODATA, DIFF_STOPS, PanelModel } from "../src/protocol";

function model(state: Record<string, unknown>): PanelModel {
  return { get: (k: string) => state[k], set() {}, save_changes() {}, on() {}, off() {} } as unknown as PanelModel;
}

const f32 = (v: number[]) => new DataView(new Float32Array(v).buffer);
const u8 = (v: number[]) => new DataView(new Uint8Array(v).buffer);

describe("a comparison's traits", () => {
  const meta = { rows: 2, cols: 3, n_layers: 2, n_bins: 0 };
  it("decodes the later run and the difference map on the first run's grid", () => {
    const d = decodeHeat(model({
      meta, heat: f32([1, 2, 3, 4, 5, 6]), flags: u8([0, 0, 0, 0, 0, 1]), col_steps: new DataView(new Float64Array([0, 5, 10]).buffer),
      heat_b: f32([10, 20, 30, 40, 50, NaN]), flags_b: u8([0, 2, 0, 0, 0, 0]), diff: f32([1, 1, 1, 1, 1, NaN]),
    }));
    expect(d.error).toBe("");
    expect(Array.from(d.heatB)).toEqual([10, 20, 30, 40, 50, NaN]);
    expect(Array.from(d.flagsB)).toEqual([0, 2, 0, 0, 0, 0]);
    expect(Array.from(d.diff.subarray(0, 5))).toEqual([1, 1, 1, 1, 1]);
    expect(Number.isNaN(d.diff[5])).toBe(true);
  });

  it("a single run (or a buffer of the wrong size) has no later run", () => {
    const base = { meta, heat: f32([1, 2, 3, 4, 5, 6]), col_steps: new DataView(new Float64Array([0, 5, 10]).buffer) };
    expect(decodeHeat(model(base)).heatB.length).toBe(0);
    const bad = decodeHeat(model({ ...base, heat_b: f32([1, 2]), diff: f32([1, 2]) }));
    expect(bad.heatB.length).toBe(0);
    expect(bad.diff.length).toBe(0);
    expect(bad.heat.length).toBe(6);
  });

  it("declares the comparison traits and modes like the kernel", () => {
    for (const k of ["labels", "heat_b", "flags_b", "diff", "mode"]) expect(k in CONSTANTS.traits).toBe(true);
    expect(CONSTANTS.traits.mode.direction).toBe("both");
    expect(CONSTANTS.compare_modes).toEqual(["side", "diff"]);
  });
});

describe("the difference map's colours", () => {
  const rgb = (i: number) => [DIFF_LUT[4 * i], DIFF_LUT[4 * i + 1], DIFF_LUT[4 * i + 2]];
  it("is centred on no change: 0 is the palest colour, +-x mirror each other", () => {
    const white = diffRgb(0, 2);
    expect(white).toEqual(diffRgb(-0, 0.5));
    const lum0 = luminance(white);
    for (const x of [0.25, 0.5, 1, 2]) {
      expect(luminance(diffRgb(x, 2))).toBeLessThan(lum0);
      expect(luminance(diffRgb(-x, 2))).toBeLessThan(lum0);
    }
    expect(Math.min(...white)).toBeGreaterThan(230);
  });

  it("is blue below 0 (smaller in the later run) and red above, clipped at +-diff_max", () => {
    const [r1, , b1] = diffRgb(-1, 1);
    const [r2, , b2] = diffRgb(1, 1);
    expect(b1).toBeGreaterThan(r1 + 50);
    expect(r2).toBeGreaterThan(b2 + 50);
    expect(diffRgb(-5, 1)).toEqual(diffRgb(-1, 1));
    expect(diffRgb(7, 1)).toEqual(diffRgb(1, 1));
    // the end points are the kernel's stops (matplotlib's RdBu_r)
    const hex = (c: number[]) => "#" + c.map((x) => x.toString(16).padStart(2, "0")).join("");
    expect(hex(rgb(0))).toBe(DIFF_STOPS[0]);
    expect(hex(rgb(255))).toBe(DIFF_STOPS[DIFF_STOPS.length - 1]);
  });

  it("colours NaN (no value in one run) off the map, and lays pixels out in display order", () => {
    const px = colorizeDiff(new Float32Array([0, NaN, -2, 2]), 2, 2, [1, 0], 2);
    expect(Array.from(px.subarray(0, 4))).toEqual([...rgb(0), 255]);   // display row 0 = data row 1: -2
    expect(Array.from(px.subarray(4, 8))).toEqual([...rgb(255), 255]);
    expect(Array.from(px.subarray(8, 11))).toEqual(diffRgb(0, 2));
    expect(Array.from(px.subarray(12, 15))).toEqual([...DIFF_NODATA]);
  });
});
