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


def test_every_synced_trait_is_in_the_table_and_every_ts_trait_is_declared():
    from gradwidget.panel.widget import GradientPanel

    synced = {n for n, t in GradientPanel.class_traits().items() if t.metadata.get("sync")}
    synced -= {n for n in synced if n.startswith("_")}  # ipywidgets' and anywidget's own
    assert synced - {"layout", "tabbable", "tooltip"} == set(TRAITS)
    ts = PROTOCOL_TS.read_text()
    body = re.search(r"export interface Traits \{(.*?)\n\}", ts, re.S).group(1)
    assert set(re.findall(r"^\s+(\w+):", body, re.M)) == set(TRAITS)


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
