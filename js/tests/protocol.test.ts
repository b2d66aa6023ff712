import { describe, expect, it } from "vitest";
import { CONSTANTS, decodeDetail, decodeHeat, FLAG_NODATA, MARKS, metricLabel, PanelModel, Traits } from "../src/protocol";
import { diagnosisText } from "../src/view/diagnoses";
import { OVERSCAN, rowWindow } from "../src/table";

function model(state: Partial<Traits>): PanelModel {
  return {
    get: ((k: keyof Traits) => state[k]) as PanelModel["get"],
    set() {},
    save_changes() {},
    on() {},
    off() {},
  };
}

const meta = { rows: 2, cols: 3, n_layers: 2, n_steps: 3, n_bins: 4, metrics: ["a", "b"] };

describe("protocol", () => {
  it("derives flags, marks and labels from the constants", () => {
    expect(FLAG_NODATA).toBe(CONSTANTS.flags.nodata);
    expect(MARKS.nonfinite).toEqual([255, 0, 255]);
    expect(metricLabel("mean_abs")).toBe("mean |g|");
    expect(metricLabel("custom")).toBe("custom");
  });

  it("decodes the heatmap when every length agrees with meta", () => {
    const heat = new Float32Array([1, 2, 3, 4, 5, 6]);
    const d = decodeHeat(model({
      meta, heat: new DataView(heat.buffer), flags: new DataView(new Uint8Array(6).buffer),
      col_steps: new DataView(new Float64Array([0, 1, 2]).buffer), loss: new DataView(new Float32Array(3).buffer),
    }));
    expect(d.error).toBe("");
    expect(Array.from(d.heat)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(d.colSteps.length).toBe(3);
  });

  it("turns a malformed buffer into an error, not an exception", () => {
    const d = decodeHeat(model({
      meta, heat: new DataView(new Float32Array(6).buffer), col_steps: new DataView(new Float64Array(2).buffer),
    }));
    expect(d.heat.length).toBe(0);
    expect(d.error).toMatch(/could not read/);
    // a heatmap of the wrong size is no heatmap (the message says there is no data yet)
    expect(decodeHeat(model({ meta, heat: new DataView(new Float32Array(5).buffer) })).heat.length).toBe(0);
  });

  it("drops histograms whose length does not match their steps", () => {
    const ok = decodeDetail(model({
      detail: new DataView(new Float64Array([1, 2, 16777217, 4]).buffer), detail_step: 7,
      hists: new DataView(new Float64Array(8).buffer), hist_steps: new DataView(new Float64Array(2).buffer), hist_layer: 1,
    }), { ...decodeHeat(model({ meta })).meta });
    expect(ok.detail.length).toBe(4);
    expect(ok.detail[2]).toBe(16777217); // float64: a non-finite count above 2**24 stays exact
    // float32 bytes are not the detail (half the length): none, rather than misread values
    expect(decodeDetail(model({ detail: new DataView(new Float32Array(4).buffer), detail_step: 7 }),
      { ...decodeHeat(model({ meta })).meta }).detail.length).toBe(0);
    expect(ok.hists.length).toBe(8);
    const bad = decodeDetail(model({
      hists: new DataView(new Float64Array(7).buffer), hist_steps: new DataView(new Float64Array(2).buffer),
    }), { ...decodeHeat(model({ meta })).meta });
    expect(bad.hists.length).toBe(0);
    expect(bad.histSteps.length).toBe(0);
  });
});

describe("diagnoses", () => {
  it("reads cause, first layers, first step and the action", () => {
    const d = { cause: "lr_too_high", priority: "High", text: "t", action: "lower the learning rate",
      layers: ["a", "b", "c", "d"], n_layers: 4, layer_index: 0, first_step: 12 };
    expect(diagnosisText(d)).toBe("lr too high · a, b, c and 1 more · since step 12 · lower the learning rate");
    expect(diagnosisText({ ...d, layers: [], n_layers: 0, first_step: null })).toBe("lr too high · lower the learning rate");
  });
});

describe("table window", () => {
  it("renders only the rows a viewport needs, with overscan", () => {
    expect(rowWindow(1000, 0, 300, 20)).toEqual([0, 15 + OVERSCAN]);
    const [a, b] = rowWindow(1000, 10_000, 300, 20);
    expect(a).toBe(500 - OVERSCAN);
    expect(b).toBe(515 + OVERSCAN);
    expect(rowWindow(10, 0, 300, 20)).toEqual([0, 10]);
    expect(rowWindow(0, 0, 300, 20)).toEqual([0, 0]);
  });

  it("stretches to keep the row whose control has the focus", () => {
    expect(rowWindow(1000, 10_000, 300, 20, 3)).toEqual([3, 515 + OVERSCAN]);
    expect(rowWindow(1000, 0, 300, 20, 900)).toEqual([0, 901]);
    expect(rowWindow(1000, 0, 300, 20, 10)).toEqual([0, 15 + OVERSCAN]); // already in the window
  });
});
