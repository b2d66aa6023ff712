import { describe, expect, it } from "vitest";
import { elide } from "../src/names";
import { CASES as cases } from "./names.cases";

describe("elide", () => {
  it("gives the kernel's names (gradwidget.plots.common.elide) on every case", () => {
    for (const [name, width, want] of cases) expect([name, width, elide(name, width)]).toEqual([name, width, want]);
  });
  it("keeps the block index and the parameter of a GPT-2 name", () => {
    expect(elide("transformer.h.3.attn.c_attn.weight", 20)).toBe("…h.3…c_attn.weight");
  });
});
