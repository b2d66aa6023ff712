// Rows of a grouped panel (issue 17): past the kernel's cap a row is a group of consecutive layers;
// the page maps layers to rows, marks groups (▸) and the first row of an expanded group (▾).
import { describe, expect, it } from "vitest";
import { emptyMeta, type LayerMeta, type Meta, rowCount, rowOfLayer, rowStarts } from "../src/protocol";
import { groupMark } from "../src/table";
import { rowLabel } from "../src/view/draw";

const grouped = (layers: LayerMeta[], n: number): Meta => ({ ...emptyMeta(), n_layers: n, layers, grouped: true });
// 12 layers: a group of 4, the group [4, 8) expanded into its members, a group of 4
const meta = grouped([
  { name: "enc (4 tensors)", start: 0, count: 4, depth: 0, parent: null },
  ...[4, 5, 6, 7].map((i) => ({ name: `mid.${i}`, start: i, count: 1, depth: 1, parent: [4, 8] as [number, number] })),
  { name: "dec (4 tensors)", start: 8, count: 4, depth: 0, parent: null },
], 12);

describe("grouped rows", () => {
  it("maps every layer to the row that shows it", () => {
    const starts = rowStarts(meta);
    expect(Array.from(starts)).toEqual([0, 4, 5, 6, 7, 8]);
    expect([0, 3, 4, 7, 8, 11].map((l) => rowOfLayer(starts, 12, l))).toEqual([0, 0, 1, 4, 5, 5]);
    expect(rowOfLayer(starts, 12, 12)).toBe(-1);
    expect(rowOfLayer(starts, 12, -1)).toBe(-1);
    expect(rowCount(meta)).toBe(6);
  });

  it("is the identity without groups", () => {
    const plain: Meta = { ...emptyMeta(), n_layers: 3, layers: [{ name: "a" }, { name: "b" }, { name: "c" }] };
    const starts = rowStarts(plain);
    expect(Array.from(starts)).toEqual([0, 1, 2]);
    expect(rowOfLayer(starts, 3, 2)).toBe(2);
    expect(rowCount(plain)).toBe(3);
    expect(rowLabel(plain, 1)).toBe("b");
  });

  it("marks groups ▸ and the first row of an expanded group ▾ in the gutter and the table", () => {
    expect([0, 1, 2, 5].map((r) => rowLabel(meta, r))).toEqual(["▸ enc (4 tensors)", "▾ mid.4", "mid.5", "▸ dec (4 tensors)"]);
    expect(groupMark({ index: 0, layer: "enc (4 tensors)", count: 4, parent: null })).toBe("▸");
    expect(groupMark({ index: 5, layer: "mid.5", parent: [4, 8] })).toBe("▾");
    expect(groupMark({ index: 5, layer: "plain" })).toBe("");
  });
});
