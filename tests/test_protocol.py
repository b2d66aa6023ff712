"""The kernel <-> page contract: Python's constants are the ones js/src/protocol.ts holds, every
trait of the widget is in the trait table, and binary traits are checked when encoded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from gradwidget.panel.protocol import TRAITS, constants_json, encode

PROTOCOL_TS = Path(__file__).resolve().parents[1] / "js" / "src" / "protocol.ts"


def ts_constants() -> dict:
    text = PROTOCOL_TS.read_text()
    m = re.search(r"// BEGIN CONSTANTS\nexport const CONSTANTS = (.*) as const;\n// END CONSTANTS", text, re.S)
    assert m, "protocol.ts lost its CONSTANTS block"
    return json.loads(m.group(1))


def test_python_and_typescript_constants_agree():
    assert ts_constants() == constants_json(), (
        "js/src/protocol.ts CONSTANTS differ from gradwidget.panel.protocol.constants_json(): paste "
        "json.dumps(constants_json(), indent=2) between its BEGIN/END CONSTANTS markers"
    )


def test_every_synced_trait_is_declared_by_its_row_and_every_ts_trait_is_declared():
    """A panel carries the rows of owner "panel", a comparison those and its own; each is made from
    its row (``Synced``), none is written by hand; the page's ``Traits`` lists every row."""
    from gradwidget.panel._traits import Synced
    from gradwidget.panel.widget import ComparisonPanel, GradientPanel

    def synced(cls) -> dict:
        own = {n: t for n, t in cls.class_traits().items() if t.metadata.get("sync") and not n.startswith("_")}
        return {n: t for n, t in own.items() if n not in {"layout", "tabbable", "tooltip"}}  # ipywidgets' own

    panel, comparison = synced(GradientPanel), synced(ComparisonPanel)
    assert set(panel) == {n for n, t in TRAITS.items() if t.owner == "panel"}
    assert set(comparison) == set(TRAITS) and {TRAITS[n].owner for n in set(comparison) - set(panel)} == {"comparison"}
    assert all(isinstance(t, Synced) and t.row is TRAITS[n] for n, t in comparison.items())
    assert all(t.default_value == TRAITS[n].initial() for n, t in comparison.items() if TRAITS[n].kind != "json")
    ts = PROTOCOL_TS.read_text()
    body = re.search(r"export interface Traits \{(.*?)\n\}", ts, re.S).group(1)
    assert set(re.findall(r"^\s+(\w+):", body, re.M)) == set(TRAITS)


def test_a_trait_the_protocol_does_not_declare_is_an_error_when_the_class_is_made():
    import anywidget

    from gradwidget.panel._traits import Synced

    with pytest.raises(TypeError, match=r"Bad\.heatmap is not a trait of the protocol"):

        class Bad(anywidget.AnyWidget):
            heatmap = Synced()


def test_a_row_checks_its_values_and_gives_fresh_defaults():
    assert TRAITS["columns"].validate(10**6) == 4096 and TRAITS["columns"].validate(1) == 16
    assert TRAITS["expanded"].validate([[2, 5], [2, 5]]) == [[2, 5]]
    with pytest.raises(ValueError, match="start < stop"):
        TRAITS["expanded"].validate([[5, 2]])
    with pytest.raises(ValueError, match=r"unknown mode 'both'; choose one of \['side', 'diff'\]"):
        TRAITS["mode"].validate("both")
    with pytest.raises(TypeError, match="step must be an int"):
        TRAITS["step"].validate(1.5)
    with pytest.raises(TypeError, match="follow must be True or False"):
        TRAITS["follow"].validate("yes")
    assert TRAITS["heat"].validate(np.ones((2, 3))) == np.ones((2, 3), np.float32).tobytes()
    assert TRAITS["meta"].initial() == {} and TRAITS["meta"].initial() is not TRAITS["meta"].initial()
    assert (TRAITS["layer"].initial(), TRAITS["metric"].initial(), TRAITS["follow"].initial()) == (-1, "mean_abs", True)


def test_an_array_set_on_a_binary_trait_is_encoded_by_it():
    import traitlets

    from gradwidget.panel.widget import GradientPanel

    from test_widget import synthetic_run

    p = GradientPanel(synthetic_run(4))
    try:
        p.hist_steps = np.arange(3)
        assert p.hist_steps == np.arange(3, dtype=np.float64).tobytes()
        with pytest.raises(traitlets.TraitError, match=r"is \(rows, cols\)"):
            p.heat = np.ones(3)
        with pytest.raises(traitlets.TraitError, match="must be a str"):
            p.verdict = 3
    finally:
        p.close()


def test_encode_checks_dtype_and_rank():
    assert encode("heat", np.ones((2, 3), np.float64)) == np.ones((2, 3), np.float32).tobytes()
    assert encode("flags", np.array([[1, 2]], np.int64)) == bytes([1, 2])
    assert encode("heat", b"") == b""
    with pytest.raises(TypeError, match="carries float32"):
        encode("heat", np.array([["a"]]))
    with pytest.raises(ValueError, match=r"is \(rows, cols\)"):
        encode("heat", np.ones(3, np.float32))
    with pytest.raises(TypeError, match="not a binary buffer"):
        encode("step", np.ones(1))
