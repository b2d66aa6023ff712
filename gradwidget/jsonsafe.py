"""The one JSON sanitiser: numpy values, enums, dataclasses and DataFrames to plain JSON types.

JSON has neither NaN nor infinities. NaN always means "not recorded" and becomes null. Infinities
are kept where a reader can read them back (``inf="string"``: the page's ``numberOf`` in
``js/src/table.ts`` turns "Infinity"/"-Infinity" into numbers again) and become null in files
written for any JSON reader (``inf="null"``, e.g. ``Report.to_json`` and ``export_json``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

#: how an infinity is written: as the strings "Infinity"/"-Infinity", or as null.
INF_STYLES = ("string", "null")


def number(x: Any, inf: str = "string") -> float | str | None:
    """One float as JSON: NaN is null, +-Inf as ``inf`` says."""
    f = float(x)
    if math.isfinite(f):
        return f
    if f != f or inf == "null":
        return None
    return "Infinity" if f > 0 else "-Infinity"


def jsonable(x: Any, inf: str = "string") -> Any:
    """``x`` as plain JSON types. Dataclass fields whose metadata says ``json=False`` (a Report's
    Run, its caches) are left out; anything unknown is written as its ``str``."""
    if inf not in INF_STYLES:
        raise ValueError(f"inf must be one of {INF_STYLES}, not {inf!r}")
    return _plain(x, inf)


def _plain(x: Any, inf: str) -> Any:
    import numpy as np

    if x is None or isinstance(x, str):
        return x
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return number(x, inf)
    if isinstance(x, enum.Enum):
        return _plain(x.value, inf)
    if isinstance(x, dict):
        return {str(k): _plain(v, inf) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v, inf) for v in x]
    if isinstance(x, np.ndarray):
        return [_plain(v, inf) for v in x.tolist()]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name), inf) for f in dataclasses.fields(x) if f.metadata.get("json", True)}
    import pandas as pd

    if isinstance(x, pd.DataFrame):
        return [_plain(r, inf) for r in x.to_dict(orient="records")]
    try:
        if pd.isna(x):
            return None
    except (TypeError, ValueError):
        pass
    return str(x)
