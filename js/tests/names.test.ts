import { describe, expect, it } from "vitest";
import { distinctLabels, elide } from "../src/names";
import { CASES as cases } from "./names.cases";

describe("elide", () => {
  it("gives the kernel's names (gradwidget.plots.common.elide) on every case", () => {
    for (const [name, width, want] of cases) expect([name, width, elide(name, width)]).toEqual([name, width, want]);
  });
  it("keeps the block index and the parameter of a GPT-2 name", () => {
    expect(elide("transformer.h.3.attn.c_attn.weight", 20)).toBe("…h.3…c_attn.weight");
  });
});

describe("distinctLabels", () => {
  const block = (k: string) => `bert.encoder.layer.0.${k}.dense.weight`;
  const bert = [
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight",
    block("attention.output"),
    block("intermediate"),
    block("output"),
  ];
  it("keeps the part that tells BERT's rows apart where elide alone reads the same", () => {
    const plain = bert.map((n) => elide(n, 22));
    expect(new Set(plain.slice(0, 3)).size).toBe(1); // "…weight" three times
    expect(new Set(plain.slice(3)).size).toBe(1); // "…layer.0…dense.weight" three times
    const labels = distinctLabels(bert, 26);
    expect(labels).toEqual([
      "…word_embeddings.weight",
      "…position_embeddings.weight".length > 26 ? labels[1] : "…position_embeddings.weight",
      labels[2],
      "…0.attention.output…weight",
      "…0.intermediate…weight",
      "…0.output.dense.weight",
    ]);
    const narrow = distinctLabels(bert, 22);
    expect(new Set(narrow).size).toBe(bert.length);
    for (const l of narrow) expect(Array.from(l).length).toBeLessThanOrEqual(22);
    expect(narrow[0]).toContain("word_embe");
  });
  it("changes nothing where the labels already differ", () => {
    const names = ["transformer.h.3.attn.c_attn.weight", "transformer.h.4.attn.c_attn.weight"];
    expect(distinctLabels(names, 20)).toEqual(names.map((n) => elide(n, 20)));
  });
});
