import { describe, expect, it } from "vitest";
import { cellText, numberOf, sortRows, type Row } from "../src/table";

const rows: Row[] = [
  { index: 0, layer: "a", grad_norm_median: 0.5 },
  { index: 1, layer: "b", grad_norm_median: null },
  { index: 2, layer: "c", grad_norm_median: 0.001 },
  { index: 3, layer: "d", grad_norm_median: 2 },
  { index: 4, layer: "e", grad_norm_median: "Infinity" },
];
const order = (desc: boolean, key = "grad_norm_median") =>
  sortRows(rows, { key, desc }).map((r) => r.layer).join(",");

describe("health table sorting", () => {
  it("puts missing values last in both directions", () => {
    expect(order(false)).toBe("c,a,d,e,b");
    expect(order(true)).toBe("e,d,a,c,b");
  });

  it("sorts NaN with the missing values, after every number", () => {
    const withNaN: Row[] = [...rows, { index: 5, layer: "f", grad_norm_median: "NaN" }];
    const asc = sortRows(withNaN, { key: "grad_norm_median", desc: false }).map((r) => r.layer);
    expect(asc.slice(-2)).toEqual(["b", "f"]); // missing and NaN last, in layer order
  });

  it("puts empty text last too", () => {
    const text: Row[] = [
      { index: 0, layer: "a", suggestion: "" },
      { index: 1, layer: "b", suggestion: "clip" },
      { index: 2, layer: "c", suggestion: "add residual" },
    ];
    expect(sortRows(text, { key: "suggestion", desc: false }).map((r) => r.layer)).toEqual(["c", "b", "a"]);
    expect(sortRows(text, { key: "suggestion", desc: true }).map((r) => r.layer)).toEqual(["b", "c", "a"]);
  });
});

describe("non-finite table values", () => {
  it("reads the kernel's spelling of infinities (JSON has none)", () => {
    expect(numberOf("Infinity")).toBe(Infinity);
    expect(numberOf("-Infinity")).toBe(-Infinity);
    expect(numberOf("NaN")).toBeNaN();
    expect(numberOf(1.5)).toBe(1.5);
    expect(numberOf("Linear")).toBeNull();
    expect(numberOf(null)).toBeNull();
  });

  it("shows Inf, not a huge finite number", () => {
    expect(cellText("Infinity", "num")).toBe("Inf");
    expect(cellText("-Infinity", "num")).toBe("-Inf");
    expect(cellText(1e308, "num")).toBe("1.00e+308");
    expect(cellText("Infinity", "text")).toBe("Infinity"); // text columns are shown as sent
    expect(cellText(null, "num")).toBe("");
  });
});

import { CONSTANTS } from "../src/protocol";
import { COLUMNS as TABLE_COLUMNS } from "../src/table";

describe("table keys", () => {
  it("reads only fields the kernel sends (protocol TABLE_KEYS)", () => {
    const keys = new Set<string>(CONSTANTS.table_keys);
    for (const c of TABLE_COLUMNS) expect(keys.has(c.key)).toBe(true);
    for (const k of ["index", "layer", "status", "flags", "health", "module_type"]) expect(keys.has(k)).toBe(true);
  });
});

import { shownColumns } from "../src/table";

describe("columns at notebook width", () => {
  it("shows the columns a user decides with and folds the statistics behind 'more columns'", () => {
    const present = new Set(TABLE_COLUMNS.map((c) => c.key).filter((k) => k !== "health_a" && k !== "change"));
    const few = shownColumns(present, false).map((c) => c.key);
    expect(few).toEqual(["health", "layer", "grad_norm_median", "trend", "suggestion"]);
    const all = shownColumns(present, true).map((c) => c.key);
    expect(all.length).toBe(present.size);
    expect(all).toContain("nonfinite_total");
  });
});

import { healthOrder, suggestionText, startsGroup, NAME_WIDTH } from "../src/table";
import { distinctLabels } from "../src/names";

describe("the table before a user sorts", () => {
  const act = "lower the learning rate about 10x (to 0.005): the update outgrew the weights";
  const grid: Row[] = [
    { index: 0, layer: "emb.weight", health: "Healthy", suggestion: "" },
    { index: 1, layer: "l1.weight", health: "Critical", suggestion: act, diagnosis: 0 },
    { index: 2, layer: "l1.bias", health: "Warning", suggestion: "check the init", diagnosis: 1 },
    { index: 3, layer: "l2.weight", health: "Critical", suggestion: "clip", diagnosis: 1 },
    { index: 4, layer: "l3.weight", health: "Critical", suggestion: act, diagnosis: 0 },
    { index: 5, layer: "l4.weight", health: "Unknown", suggestion: "" },
  ];

  it("groups rows by health, Critical first and Healthy last, a diagnosis' rows together", () => {
    const shown = sortRows(grid, null);
    expect(shown.map((r) => r.index)).toEqual([1, 4, 3, 2, 5, 0]);
    expect(healthOrder(grid).map((r) => r.health)).toEqual(["Critical", "Critical", "Critical", "Warning", "Unknown", "Healthy"]);
    expect(shown.map((_, i) => startsGroup(shown, i))).toEqual([true, false, false, true, true, true]);
  });

  it("puts the parameters the loss cannot move after the Healthy ones, as their own group", () => {
    const inert: Row = { index: 6, layer: "key.bias", health: "Cannot move", suggestion: "" };
    const shown = healthOrder([inert, ...grid]);
    expect(shown.map((r) => r.health).slice(-2)).toEqual(["Healthy", "Cannot move"]);
    expect(startsGroup(shown, shown.length - 1)).toBe(true);
  });

  it("says a diagnosis' action once, on its first row", () => {
    const shown = sortRows(grid, null);
    const said = shown.map((_, i) => suggestionText(shown, i));
    expect(said).toEqual([act, "", "clip", "check the init", "", ""]);
    expect(said.filter((t) => t === act)).toHaveLength(1);
    // sorted by a column the rows of one diagnosis part, and each says the action again
    const byName = sortRows(grid, { key: "layer", desc: false });
    expect(byName.map((_, i) => suggestionText(byName, i)).filter((t) => t === act)).toHaveLength(2);
  });

  it("labels BERT's names on one line, each told apart from the others", () => {
    const names = [
      "bert.embeddings.word_embeddings.weight",
      "bert.embeddings.position_embeddings.weight",
      "bert.embeddings.token_type_embeddings.weight",
      "bert.encoder.layer.0.attention.output.dense.weight",
      "bert.encoder.layer.0.intermediate.dense.weight",
      "bert.encoder.layer.0.output.dense.weight",
    ];
    const labels = distinctLabels(names, NAME_WIDTH);
    expect(new Set(labels).size).toBe(names.length);
    for (const l of labels) expect(Array.from(l).length).toBeLessThanOrEqual(NAME_WIDTH);
    expect(labels.some((l) => l.includes("word_embeddings"))).toBe(true);
    expect(labels.some((l) => l.includes("intermediate"))).toBe(true);
  });
});

import { lossRange } from "../src/series";

describe("the loss curve's range", () => {
  it("spans the finite losses, padded, and is null when none was logged", () => {
    const r = lossRange(Float32Array.from([2.3, NaN, 1.1, Infinity, 0.3]));
    expect(r).not.toBeNull();
    const [lo, hi] = r!;
    expect(lo).toBeCloseTo(0.3 - 0.1, 5);
    expect(hi).toBeCloseTo(2.3 + 0.1, 5);
    expect(lossRange(Float32Array.from([NaN, NaN]))).toBeNull();
    expect(lossRange(new Float32Array(0))).toBeNull();
    const flat = lossRange([-4, -4])!; // a flat (negative) loss still has a height
    expect(flat[0]).toBeCloseTo(-4.4, 9);
    expect(flat[1]).toBeCloseTo(-3.6, 9);
    expect(lossRange([0, 0])).toEqual([-1, 1]);
  });
});
