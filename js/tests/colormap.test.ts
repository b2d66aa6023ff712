import { describe, expect, it } from "vitest";
import { cellRgb, colorize, fmt, hasScale, heatScale, logScale, logTicks, luminance, lutIndex, MARKS, scalePos, VIRIDIS } from "../src/colormap";
import { FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING } from "../src/protocol";

const lut = (i: number) => [VIRIDIS[4 * i], VIRIDIS[4 * i + 1], VIRIDIS[4 * i + 2]];

describe("viridis", () => {
  it("has matplotlib's end points", () => {
    expect(lut(0)).toEqual([68, 1, 84]); // #440154
    expect(lut(255)).toEqual([253, 231, 37]); // #fde725
  });

  it("is perceptually ordered: luminance rises monotonically (readable in greyscale)", () => {
    // relative luminance climbs from end to end; no dip larger than a rounding step
    let prev = -1;
    for (let i = 0; i < 256; i++) {
      const l = luminance(lut(i));
      expect(l).toBeGreaterThan(prev - 0.001);
      prev = Math.max(prev, l);
    }
    for (let i = 16; i < 256; i += 16) expect(luminance(lut(i))).toBeGreaterThan(luminance(lut(i - 16)));
    expect(luminance(lut(255)) / luminance(lut(0))).toBeGreaterThan(20);
  });

  it("marks are colours viridis never produces", () => {
    for (const m of [MARKS.vanishing, MARKS.exploding, MARKS.nonfinite, MARKS.nodata]) {
      for (let i = 0; i < 256; i++) {
        const c = lut(i);
        const d = Math.abs(c[0] - m[0]) + Math.abs(c[1] - m[1]) + Math.abs(c[2] - m[2]);
        expect(d).toBeGreaterThan(40);
      }
    }
  });
});

describe("the colour range sent by the kernel", () => {
  it("is used as is: the same range as the static figures, not the data's min..max", () => {
    const data = new Float32Array([1e-9, 1e-3, 1e-2, 1e4]); // outliers at both ends
    const s = heatScale([-3.5, 2.25], data);
    expect(s).toEqual({ lo: -3.5, hi: 2.25 });
    expect(lutIndex(1e-9, s)).toBe(0); // clipped, as matplotlib's Normalize(clip=True)
    expect(lutIndex(1e4, s)).toBe(255);
    expect(lutIndex(Math.pow(10, (-3.5 + 2.25) / 2), s)).toBe(128);
  });

  it("falls back to the data's own range when the kernel sent none or a bad one", () => {
    const data = [1e-8, 1e2];
    for (const sent of [undefined, null, [], [1, 1], [2, 1], [NaN, 1], "x"]) {
      const s = heatScale(sent, data);
      expect(s.lo).toBeCloseTo(-8);
      expect(s.hi).toBeCloseTo(2);
    }
  });
});

describe("log scale", () => {
  it("spans the finite positive values, ignoring zeros, NaN and Inf", () => {
    const s = logScale([0, 1e-8, NaN, 1e2, Infinity, -5]);
    expect(s.lo).toBeCloseTo(-8);
    expect(s.hi).toBeCloseTo(2);
  });

  it("is one scale across steps: a faded step stays dark instead of being renormalised", () => {
    // step 0: all layers 1e-1; step 1: all layers 1e-6 (network-wide vanishing)
    const data = new Float32Array([1e-1, 1e-6, 1e-1, 1e-6]); // 2 layers x 2 steps
    const s = logScale(data);
    expect(lutIndex(1e-1, s)).toBe(255);
    expect(lutIndex(1e-6, s)).toBe(0);
  });

  it("widens a constant run and has a default for empty data", () => {
    const s = logScale([3, 3, 3]);
    expect(s.hi - s.lo).toBeCloseTo(1);
    expect(logScale([])).toEqual({ lo: -1, hi: 0 });
  });

  it("clips to [0, 1] and sends non-positive values to the bottom", () => {
    const s = { lo: -2, hi: 2 };
    expect(scalePos(1, s)).toBeCloseTo(0.5);
    expect(scalePos(1e9, s)).toBe(1);
    expect(scalePos(0, s)).toBe(0);
    expect(scalePos(-1, s)).toBe(0);
    expect(scalePos(NaN, s)).toBe(0);
  });

  it("ticks at decades", () => {
    expect(logTicks({ lo: -7.5, hi: -2.2 })).toEqual([-7, -6, -5, -4, -3]);
    expect(logTicks({ lo: -20, hi: 3 }, 6).length).toBeLessThanOrEqual(6);
  });
});

describe("cell colours and marks", () => {
  const s = { lo: -8, hi: 0 };
  it("non-finite beats exploding beats vanishing beats no data", () => {
    expect(cellRgb(1, FLAG_NONFINITE | FLAG_EXPLODING | FLAG_VANISHING, s)).toEqual([...MARKS.nonfinite]);
    expect(cellRgb(1, FLAG_EXPLODING | FLAG_VANISHING, s)).toEqual([...MARKS.exploding]);
    expect(cellRgb(1, FLAG_VANISHING | FLAG_NODATA, s)).toEqual([...MARKS.vanishing]);
    expect(cellRgb(NaN, 0, s)).toEqual([...MARKS.nodata]);
    expect(cellRgb(1, 0, s)).toEqual(lut(255));
  });

  it("colorize lays out pixels in display order with marks", () => {
    const data = new Float32Array([1e-8, 1, NaN, 1e-4]); // 2 rows x 2 cols
    const flags = new Uint8Array([0, 0, 0, FLAG_NONFINITE]);
    const px = colorize(data, flags, 2, 2, [1, 0], s); // display row 0 = source row 1
    const at = (x: number, y: number) => Array.from(px.slice((y * 2 + x) * 4, (y * 2 + x) * 4 + 4));
    expect(at(0, 0)).toEqual([...MARKS.nodata, 255]);
    expect(at(1, 0)).toEqual([...MARKS.nonfinite, 255]);
    expect(at(0, 1)).toEqual([...lut(0), 255]);
    expect(at(1, 1)).toEqual([...lut(255), 255]);
  });

  it("colours two million cells quickly", () => {
    const rows = 1000;
    const cols = 2048;
    const data = new Float32Array(rows * cols);
    for (let i = 0; i < data.length; i++) data[i] = Math.pow(10, -8 + (i % 97) / 10);
    const order = Array.from({ length: rows }, (_, i) => rows - 1 - i);
    const t0 = performance.now();
    const px = colorize(data, null, rows, cols, order, logScale(data));
    const ms = performance.now() - t0;
    expect(px.length).toBe(rows * cols * 4);
    expect(ms).toBeLessThan(1000);
  });

  it("formats numbers compactly", () => {
    expect(fmt(0)).toBe("0");
    expect(fmt(1234)).toBe("1234");
    expect(fmt(123456789)).toBe("123456789"); // a step number is never rounded
    expect(fmt(1234.5)).toBe("1230");
    expect(fmt(1.5e-9)).toBe("1.50e-9");
    expect(fmt(NaN)).toBe("NaN");
    expect(fmt(Infinity)).toBe("Inf");
    expect(fmt(0.1234567)).toBe("0.123");
  });
});

describe("colour bar", () => {
  it("is drawn only when some value is finite and positive (no made-up 1..10 range)", () => {
    expect(hasScale(new Float32Array([NaN, NaN, Infinity, -Infinity, 0]))).toBe(false);
    expect(hasScale(new Float32Array(0))).toBe(false);
    expect(hasScale(new Float32Array([NaN, 1e-9]))).toBe(true);
  });
});
