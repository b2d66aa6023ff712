import { describe, expect, it } from "vitest";
import { decodeNoise, noiseRange } from "../src/noise";

describe("noise", () => {
  it("decodes the (5, N) float64 rows of the noise trait", () => {
    const rows = new Float64Array([0, 10, 20, 30, 10, 20, 50, Infinity, 64, 64]);
    const d = decodeNoise(new DataView(rows.buffer));
    expect(Array.from(d.steps)).toEqual([0, 10]);
    expect(Array.from(d.b)).toEqual([20, 30]);
    expect(d.hi[1]).toBe(Infinity);
    expect(Array.from(d.batch)).toEqual([64, 64]);
  });

  it("is empty for an absent or malformed buffer", () => {
    expect(decodeNoise(null).steps.length).toBe(0);
    expect(decodeNoise(new Float64Array(7)).steps.length).toBe(0);
  });

  it("spans B_simple, its finite bounds and the batch on a log scale", () => {
    const rows = new Float64Array([0, 1, 20, NaN, 10, 5, 1000, Infinity, 64, 64]);
    const r = noiseRange(decodeNoise(rows));
    expect(r.lo).toBeCloseTo(Math.log10(5) - 0.15, 9);
    expect(r.hi).toBeCloseTo(3 + 0.15, 9);
  });
});
