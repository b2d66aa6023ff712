import { describe, expect, it } from "vitest";
import { bottomLayout, colAt, colX, labelEvery, mainLayout, MAX_HEAT_H, MIN_HEAT_H, MIN_WIDTH, rowAt, wantedColumns } from "../src/layout";
import { shorten } from "../src/heatmap";
import { CSS } from "../src/style";
import { barScale, thresholdsFor } from "../src/bars";
import { atOrBefore, visibleBins } from "../src/hist";
import { colPosition, niceTicks } from "../src/ticks";
import { seriesScale } from "../src/series";
import { isDark, parseColor } from "../src/theme";
import { filterRows, sortRows, Row } from "../src/table";

const inside = (outer: number, r: { x: number; w: number }) => r.x >= 0 && r.x + r.w <= outer;

describe("main layout", () => {
  it("places gutter, heatmap and bars side by side without overlap on a wide cell", () => {
    const L = mainLayout(1200, 24);
    expect(L.stacked).toBe(false);
    expect(L.gutter.x + L.gutter.w).toBeLessThanOrEqual(L.heat.x);
    expect(L.heat.x + L.heat.w).toBeLessThan(L.bars.x);
    expect(inside(1200, L.bars)).toBe(true);
    expect(L.bars.y).toBe(L.heat.y);
    expect(L.bars.h).toBe(L.heat.h); // rows are shared
    expect(L.axis.y).toBe(L.heat.y + L.heat.h);
  });

  it("fits the root's narrowest content box (min-width less padding) without overflow", () => {
    const content = MIN_WIDTH; // .gw-root min-width ${MIN_WIDTH + 8}px, 4 px padding each side
    for (const w of [content - 40, content, content + 1]) {
      const L = mainLayout(w, 24);
      expect(L.width).toBe(Math.max(content, w));
      for (const r of [L.gutter, L.heat, L.bars, L.axis]) expect(inside(L.width, r)).toBe(true);
    }
    expect(CSS).toContain(`min-width:${MIN_WIDTH + 8}px`);
  });

  it("stacks the bars under the heatmap in a narrow cell", () => {
    const L = mainLayout(400, 24);
    expect(L.stacked).toBe(true);
    expect(L.bars.y).toBeGreaterThan(L.heat.y + L.heat.h);
    expect(inside(400, L.heat)).toBe(true);
    expect(L.height).toBeGreaterThan(L.bars.y + L.bars.h);
  });

  it("bounds the heatmap's height for 1 and 1000 layers and thins the labels", () => {
    expect(mainLayout(900, 1).heat.h).toBe(MIN_HEAT_H);
    const big = mainLayout(900, 1000);
    expect(big.heat.h).toBe(MAX_HEAT_H);
    expect(big.rowH * 1000).toBeCloseTo(MAX_HEAT_H);
    expect(big.labelEvery).toBeGreaterThan(1);
    expect(labelEvery(16)).toBe(1);
    expect(labelEvery(big.rowH) * big.rowH).toBeGreaterThanOrEqual(8);
    // GPT-2's 52 tensors: every row labelled
    expect(mainLayout(800, 52).labelEvery).toBe(1);
  });

  it("maps pointer positions to rows and columns and back", () => {
    const r = { x: 100, y: 10, w: 500, h: 200 };
    expect(rowAt(r, 20, 5)).toBe(-1);
    expect(rowAt(r, 20, 10)).toBe(0);
    expect(rowAt(r, 20, 209.9)).toBe(19);
    expect(colAt(r, 50, 0)).toBe(0);
    expect(colAt(r, 50, 10000)).toBe(49);
    for (const c of [0, 17, 49]) expect(colAt(r, 50, colX(r, 50, c))).toBe(c);
  });

  it("asks the kernel for as many columns as the screen has pixels, within bounds", () => {
    expect(wantedColumns(700, 1)).toBe(700);
    expect(wantedColumns(700, 2)).toBe(1400);
    expect(wantedColumns(3000, 2)).toBe(2048);
    expect(wantedColumns(10, 1)).toBe(64);
  });

  it("puts the table beside the plots when wide, under them when narrow", () => {
    expect(bottomLayout(1200).stacked).toBe(false);
    const b = bottomLayout(1200);
    expect(b.plotW + b.tableW).toBeLessThanOrEqual(1200);
    expect(bottomLayout(600).stacked).toBe(true);
    // a notebook column (~800 px): the table gets the whole width, the two plots share a row under it
    const nb = bottomLayout(800);
    expect(nb.stacked && nb.tableW === 800 && 2 * nb.plotW <= 800 - 8).toBe(true);
  });
});

describe("labels, thresholds, histograms", () => {
  it("elides long layer names keeping the block index and the parameter", () => {
    const s = shorten("encoder.layers.11.attn.in_proj_weight", 120, 11);   // 18 characters fit
    expect(s).toBe("…11…in_proj_weight");                                    // block index and parameter both show
    expect(shorten("fc.weight", 200)).toBe("fc.weight");
  });

  it("draws the vanishing threshold for mean |g| and both for max |g|", () => {
    const th = { vanishing: 1e-7, exploding: 1e3 };
    expect(thresholdsFor("mean_abs", th).map((t) => t.value)).toEqual([1e-7]);
    expect(thresholdsFor("max_abs", th).map((t) => t.value)).toEqual([1e-7, 1e3]);
    expect(thresholdsFor("grad_norm", th)).toEqual([]);
    const s = barScale({ lo: -3, hi: -1 }, thresholdsFor("mean_abs", th));
    expect(s.lo).toBeLessThan(-7);
    const ss = seriesScale([1e-2, NaN, 1e-3], thresholdsFor("max_abs", th));
    expect(ss.lo).toBeLessThan(-7);
    expect(ss.hi).toBeGreaterThan(3);
  });

  it("finds the histogram nearest a step and the bins worth showing", () => {
    // the histogram at or before the cursor, never after it (cursor 8, histograms at 0 and 10: 0)
    expect(atOrBefore([0, 10, 20], 8)).toBe(0);
    expect(atOrBefore([0, 10, 20], 10)).toBe(1);
    expect(atOrBefore([0, 10, 20], 19)).toBe(1);
    expect(atOrBefore([0, 10, 20], 25)).toBe(2);
    expect(atOrBefore([5, 10], 3)).toBe(-1);
    expect(atOrBefore([], 3)).toBe(-1);
    const counts = new Uint32Array(64);
    counts[30] = 5;
    counts[33] = 1;
    expect(visibleBins(counts)).toEqual([28, 36]);
    expect(visibleBins(new Uint32Array(64))).toEqual([0, 64]);
  });
});

describe("theme", () => {
  it("parses colours and tells dark from light backgrounds", () => {
    expect(parseColor("#fff")).toEqual([255, 255, 255]);
    expect(parseColor("#111111")).toEqual([17, 17, 17]);
    expect(parseColor("rgba(0, 0, 0, 0.87)")).toEqual([0, 0, 0]);
    expect(parseColor("var(--x)")).toBeNull();
    expect(isDark("#111111")).toBe(true);
    expect(isDark("white")).toBe(false);
    expect(isDark("#ffffff")).toBe(false);
  });
});

describe("health table logic", () => {
  const rows: Row[] = [
    { index: 0, layer: "0.weight", health: "Critical", grad_norm_median: 1e-9, module_type: "Linear" },
    { index: 1, layer: "0.bias", health: "Healthy", grad_norm_median: NaN, module_type: "Linear" },
    { index: 2, layer: "2.weight", health: "Warning", grad_norm_median: 0.5, module_type: "Conv2d" },
  ];
  it("sorts by health severity and numbers, NaN last, ties in layer order", () => {
    expect(sortRows(rows, { key: "health", desc: true }).map((r) => r.index)).toEqual([0, 2, 1]);
    expect(sortRows(rows, { key: "grad_norm_median", desc: false }).map((r) => r.index)).toEqual([0, 2, 1]);
    expect(sortRows(rows, { key: "grad_norm_median", desc: true }).map((r) => r.index)).toEqual([2, 0, 1]);
    expect(sortRows(rows, null).map((r) => r.index)).toEqual([0, 2, 1]); // unsorted: grouped by health, Healthy last
  });
  it("filters on every word", () => {
    expect(filterRows(rows, "conv").map((r) => r.index)).toEqual([2]);
    expect(filterRows(rows, "linear weight").map((r) => r.index)).toEqual([0]);
    expect(filterRows(rows, "  ").length).toBe(3);
    const withAdvice = [{ ...rows[1], suggestion: "check 0.weight's init" }];
    expect(filterRows(withAdvice, "0.weight")).toEqual([]);
  });
});

describe("axis ticks", () => {
  it("fall on round numbers", () => {
    expect(niceTicks(0, 99, 5)).toEqual([0, 20, 40, 60, 80]);
    expect(niceTicks(0, 159, 8)).toEqual([0, 20, 40, 60, 80, 100, 120, 140]);
    expect(niceTicks(3, 17, 4)).toEqual([5, 10, 15]);
    expect(niceTicks(1000, 1000, 4)).toEqual([1000]);
    for (const t of niceTicks(0, 12345, 7)) expect(t % 1000).toBe(0);
  });
  it("place a step in its column", () => {
    expect(colPosition([0, 10, 20], 10, 29)).toBe(1);
    expect(colPosition([0, 10, 20], 15, 29)).toBe(1.5);
    expect(colPosition([0, 10, 20], -1, 29)).toBe(-1);
    expect(colPosition([0, 1, 2], 2, 2)).toBe(2);
  });
});
