"""The one JSON sanitiser: the page's infinities, a file's nulls, and what each caller sends."""

import dataclasses
import enum
import json

import numpy as np
import pandas as pd
import pytest

from gradwidget.jsonsafe import jsonable, number
from gradwidget.outputs import export_json


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Holder:
    kept: float
    hidden: object = dataclasses.field(default=None, metadata={"json": False})


def test_infinities_are_strings_for_the_page_and_null_in_files():
    vals = [np.float32(np.inf), -np.inf, float("nan"), np.float64(2.5)]
    assert jsonable(vals) == ["Infinity", "-Infinity", None, 2.5]
    assert jsonable(vals, inf="null") == [None, None, None, 2.5]
    assert number(np.float16(-np.inf)) == "-Infinity" and number(3) == 3.0
    with pytest.raises(ValueError, match="inf must be"):
        jsonable(1.0, inf="zero")


def test_numpy_enums_dataclasses_and_frames_become_plain_json():
    df = pd.DataFrame({"a": [1.0, np.nan], "b": ["x", None]})
    out = jsonable(
        {
            "i": np.int64(3),
            "b": np.bool_(True),
            "e": Colour.RED,
            "arr": np.array([[1, 2]]),
            "dc": Holder(np.float32(0.5), hidden=object()),
            "df": df,
            7: (1, "s"),
        }
    )
    assert out == {
        "i": 3,
        "b": True,
        "e": "red",
        "arr": [[1, 2]],
        "dc": {"kept": 0.5},
        "df": [{"a": 1.0, "b": "x"}, {"a": None, "b": None}],
        "7": [1, "s"],
    }
    assert type(out["i"]) is int and type(out["b"]) is bool
    json.dumps(out, allow_nan=False)


def test_report_json_and_frames_have_no_infinities(tmp_path):
    from gradwidget import analyze
    from gradwidget.run import METRICS, Run

    run = Run(["a", "b"])
    for s in range(6):
        v = np.full((len(METRICS), 2), 0.01, np.float32)
        if s == 3:
            v[METRICS.index("max_abs"), 0] = np.inf
            v[METRICS.index("nonfinite"), 0] = 2
        run.append(s, v, {"loss": 1.0})
    text = analyze(run).to_json()
    assert '"Infinity"' not in text and json.loads(text)["run"]["n_steps"] == 6  # allow_nan=False wrote it
    export_json(run, tmp_path / "f.json")
    frames = json.loads((tmp_path / "f.json").read_text())
    assert frames[3]["layers"][0]["max_abs_grad"] is None and frames[3]["layers"][0]["is_exploding"] is True
