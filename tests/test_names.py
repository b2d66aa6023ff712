"""Layer names elided the same way by the kernel (figures, the static panel) and the page (the
heatmap's gutter): js/tests/names.cases.ts holds the kernel's answers, which the page's vitest
test (js/tests/names.test.ts) checks against js/src/names.ts."""

from __future__ import annotations

import json
from pathlib import Path

from gradwidget._look import elide

CASES_TS = Path(__file__).resolve().parents[1] / "js" / "tests" / "names.cases.ts"


def cases() -> list:
    text = CASES_TS.read_text()
    return json.loads(text[text.index("= ") + 2 : text.rindex(";")])


def test_the_cases_the_page_is_checked_against_are_the_kernels_answers():
    got = cases()
    assert len(got) >= 50
    assert [elide(n, w) for n, w, _ in got] == [want for _, _, want in got]


def test_block_index_and_parameter_survive_and_the_middle_goes_first():
    assert elide("transformer.h.3.attn.c_attn.weight", 20) == "…h.3…c_attn.weight"
    assert elide("transformer.h.3.attn.c_attn.weight", 30) == "…h.3.attn.c_attn.weight"
    assert elide("encoder.layers.11.self_attn.out_proj.bias", 24) == "…layers.11…out_proj.bias"
    assert elide("short.weight", 40) == "short.weight"
    for n, w, got in cases():
        assert len(got) <= max(w, len(n) if len(n) <= w else w)


def test_neighbouring_gpt2_rows_stay_distinct_at_the_gutters_width():
    names = [
        f"transformer.h.{i}.{m}.{p}" for i in range(12) for m in ("attn.c_attn", "mlp.c_fc") for p in ("weight", "bias")
    ]
    short = [elide(n, 18) for n in names]
    assert len(set(short)) == len(names)
