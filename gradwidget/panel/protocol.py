"""The contract between the kernel and the page, written once on this side (``js/src/protocol.ts``
is the other side; ``tests/test_protocol.py`` checks that the two agree).

Every synced trait is declared once, as a row of ``TRAITS``: its name, what travels (JSON, binary
buffer, scalar), the dtype and shape of a binary one, the direction (``out``: kernel -> page,
``both``: either way, ``in``: page -> kernel), its default, its validation and the widget that
carries it (``panel``: every panel; ``comparison``: a comparison's only). A widget makes its traits
from these rows (``_traits.Synced``): a value set from Python or the page is checked by its row
(``Trait.validate``: a clear error with what is allowed), and an array set on a binary trait is
encoded by ``encode``, which checks dtype and shape, so a buffer the page cannot decode is a kernel
error, not a blank panel. Flag bits and health ranks are defined here and nowhere else in Python;
the words and colours a person sees (metric labels, health and marked-cell colours) in
``gradwidget._look``, which the static figures read too.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .._look import DIFF_NODATA, DIFF_STOPS, HEALTH_COLORS, HEALTH_NOTES, MARKS, METRIC_LABELS, VIRIDIS_HEX
from ..rules import CANNOT_MOVE, merge_of
from ..run import METRICS

#: views of a comparison (the ``mode`` trait).
COMPARE_MODES = ("side", "diff")
#: the range of the ``columns`` trait (a value outside it is clamped to it): the most heatmap columns
#: (screen pixels of step axis) the panel is ever sent (a very wide, HiDPI screen), and the fewest
PANEL_MIN_COLUMNS = 16
PANEL_MAX_COLUMNS = 4096
#: the empty value of each kind of trait (a row's default when it names none).
_EMPTY: dict[str, Any] = {"bytes": b"", "int": 0, "bool": False, "str": "", "json": []}


def _one_of(what: str, allowed) -> Callable[[Any], Any]:
    def check(value):
        if value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; choose one of {list(allowed)}")
        return value

    return check


def _clamped(lo: int, hi: int) -> Callable[[Any], Any]:
    return lambda value: int(min(hi, max(lo, value)))


def _layer_ranges(value) -> list:
    """``expanded``: distinct layer ranges [start, stop] with 0 <= start < stop."""
    out: list = []
    for r in value:
        if len(r) != 2 or not 0 <= int(r[0]) < int(r[1]):
            raise ValueError(f"expanded holds layer ranges [start, stop] with 0 <= start < stop, got {r!r}")
        if [int(r[0]), int(r[1])] not in out:
            out.append([int(r[0]), int(r[1])])
    return out


@dataclass(frozen=True)
class Trait:
    name: str
    kind: str  #: json | bytes | int | bool | str
    direction: str  #: out (kernel -> page) | both | in (page -> kernel)
    doc: str
    dtype: str = ""  #: numpy dtype of a bytes trait
    shape: str = ""  #: its shape, in words of ``meta``
    default: Any = None  #: None: the kind's empty value (``_EMPTY``)
    check: Callable[[Any], Any] | None = None  #: the value's own rule, after the kind's (raises ValueError)
    owner: str = "panel"  #: panel (every panel) | comparison (a comparison's only)

    def initial(self) -> Any:
        """A fresh default value (a JSON one is never shared between widgets)."""
        return copy.deepcopy(_EMPTY[self.kind] if self.default is None else self.default)

    def validate(self, value) -> Any:
        """``value`` as the trait holds it: of the trait's kind (an array encoded for a binary
        trait), passing its rule; TypeError or ValueError that say what is allowed otherwise."""
        kind = self.kind
        if kind == "bytes":
            value = bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else encode(self.name, value)
        elif kind == "int":
            if isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{self.name} must be an int, got {value!r}")
            try:
                value = operator.index(value)
            except TypeError:
                raise TypeError(f"{self.name} must be an int, got {type(value).__name__} {value!r}") from None
        elif kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{self.name} must be True or False, got {value!r}")
            value = bool(value)
        elif kind == "str":
            if not isinstance(value, str):
                raise TypeError(f"{self.name} must be a str, got {type(value).__name__} {value!r}")
        elif kind == "json":
            want = type(self.initial())
            if not isinstance(value, want):
                raise TypeError(f"{self.name} must be a {want.__name__}, got {type(value).__name__}")
        return self.check(value) if self.check is not None else value


TRAITS: dict[str, Trait] = {
    t.name: t
    for t in [
        Trait(
            "meta",
            "json",
            "out",
            "shape (rows, cols, n_steps, n_layers), layers (one per row: a layer, or past "
            "plots.MAX_DRAWN_ROWS layers a group with start, count, depth, parent; grouped), heat metric, metrics, "
            "thresholds, first/last step, steps per column (block), histogram range, message + level, scale [lo, hi] "
            "(log10 colour range), hist_all_step",
            default={},
        ),
        Trait(
            "heat",
            "bytes",
            "out",
            "the heat metric folded to columns, depth order (a group row: its members "
            "merged as one tensor, rules.merge_layers_at)",
            "float32",
            "(rows, cols)",
        ),
        Trait("flags", "bytes", "out", "flag bits (FLAGS) OR-ed over each column's steps", "uint8", "(rows, cols)"),
        Trait("col_steps", "bytes", "out", "first user step of each column", "float64", "(cols,)"),
        Trait("loss", "bytes", "out", "mean loss per column (NaN: not logged)", "float32", "(cols,)"),
        Trait(
            "detail",
            "bytes",
            "out",
            "every metric of every row at detail_step; float64 holds the non-finite counts exactly",
            "float64",
            "(metrics, rows)",
        ),
        Trait("detail_step", "int", "out", "the recorded step of detail (-1: none)", default=-1),
        Trait(
            "hists",
            "bytes",
            "out",
            "histograms of log10|g| of hist_layer's row (a group's: added); float64 holds every count exactly",
            "float64",
            "(H, n_bins)",
        ),
        Trait("hist_steps", "bytes", "out", "their steps", "float64", "(H,)"),
        Trait("hist_layer", "int", "out", "the layer hists belong to (-1: none; its row when grouped)", default=-1),
        Trait(
            "hist_all",
            "bytes",
            "out",
            "every row's histogram at meta.hist_all_step (counts)",
            "float64",
            "(rows, n_bins)",
        ),
        Trait(
            "table",
            "json",
            "out",
            "health rows, one per heatmap row (NaN null, +-Inf the strings "
            "'Infinity'/'-Infinity'); a group's: table.group_rows",
        ),
        Trait(
            "diagnoses",
            "json",
            "out",
            "the top diagnoses: cause, title, priority, text, action, evidence, layers, layer_index, first_step",
        ),
        Trait(
            "verdict",
            "str",
            "out",
            "the analysis in one line: the top diagnosis, or 'Healthy: nothing found in N recorded steps' "
            "('': not analysed yet)",
        ),
        Trait("static_png", "str", "out", "data URL of the static image (shown when the saved state lost the buffers)"),
        Trait("static_html", "str", "out", "the health table (HTML) that goes with static_png"),
        Trait("live", "bool", "out", "updates are flowing (a recorder attached or a directory followed)"),
        Trait("step", "int", "both", "scrubbed step (a recorded user step; the widget snaps a value to the nearest)"),
        Trait(
            "layer",
            "int",
            "both",
            "selected layer (depth-order index; -1 none); inside a collapsed group, the "
            "group's row shows it (selecting a group row selects its first layer); the widget checks it against "
            "its layers",
            default=-1,
        ),
        Trait(
            "metric",
            "str",
            "both",
            "metric of the heatmap, bars and series (one of METRICS)",
            default="mean_abs",
            check=_one_of("metric", METRICS),
        ),
        Trait("follow", "bool", "both", "the cursor follows the newest step", default=True),
        Trait(
            "choice",
            "int",
            "in",
            "the number of the page's newest choice of step, follow and layer, sent with it (CHOICE_KEYS); "
            "the kernel applies a choice only when it is newer than the last it applied",
        ),
        Trait(
            "choice_applied",
            "int",
            "out",
            "the newest page choice the kernel applied: until it reaches the page's own, the page keeps its "
            "choice on screen and takes no cursor from the kernel",
        ),
        Trait(
            "columns",
            "int",
            "in",
            "step columns the heatmap can show (its width in device pixels; clamped to "
            "[PANEL_MIN_COLUMNS, PANEL_MAX_COLUMNS])",
            default=1024,
            check=_clamped(PANEL_MIN_COLUMNS, PANEL_MAX_COLUMNS),
        ),
        Trait(
            "expanded",
            "json",
            "both",
            "layer ranges [start, stop] whose groups show their members (rows.row_layout)",
            check=_layer_ranges,
        ),
        # a comparison of two runs (GradientPanel.compare), on a comparison only: heat/flags are the
        # first run's, on the same rows (layers matched by name) and columns (steps aligned by step
        # number) as these
        Trait(
            "labels",
            "json",
            "out",
            "the compared runs' labels, first (reference) then later (absent: one run)",
            owner="comparison",
        ),
        Trait(
            "heat_b",
            "bytes",
            "out",
            "the later run's heat metric on heat's rows and columns",
            "float32",
            "(rows, cols)",
            owner="comparison",
        ),
        Trait(
            "flags_b",
            "bytes",
            "out",
            "the later run's flag bits on heat's rows and columns",
            "uint8",
            "(rows, cols)",
            owner="comparison",
        ),
        Trait(
            "diff",
            "bytes",
            "out",
            "log10(heat_b / heat) (NaN: no value in one run); meta.diff_max: its colour range",
            "float32",
            "(rows, cols)",
            owner="comparison",
        ),
        Trait(
            "mode",
            "str",
            "both",
            "a comparison's view: side (both heatmaps, one scale) or diff (difference map)",
            default="side",
            check=_one_of("mode", COMPARE_MODES),
            owner="comparison",
        ),
        Trait(
            "noise",
            "bytes",
            "out",
            "the gradient noise scale per measured step (panel/noise.py): rows step, B_simple, its 95% interval "
            "lo and hi (Infinity: no upper bound), the batch per step; N <= MAX_NOISE_POINTS",
            "float64",
            "(5, N)",
        ),
        Trait("noise_text", "str", "out", "the noise scale in words, or why it is not measured ('': neither)"),
    ]
}

#: the traits a page choice sets (with ``choice``, its number): the cursor and the selected layer,
#: owned by the kernel, which applies the page's choices in their order.
CHOICE_KEYS = ("step", "follow", "layer")
#: flag bits of the ``flags`` trait (a cell can carry several).
FLAGS = {"vanishing": 1, "exploding": 2, "nonfinite": 4, "nodata": 8}
FLAG_VANISHING, FLAG_EXPLODING, FLAG_NONFINITE, FLAG_NODATA = (
    FLAGS[k] for k in ("vanishing", "exploding", "nonfinite", "nodata")
)
#: sort order of the health grades (worst first when sorted descending; a parameter the loss cannot
#: move after the Healthy ones).
HEALTH_RANK = {"Critical": 3, "Warning": 2, "Unknown": 1, "Healthy": 0, CANNOT_MOVE: -1}
#: how a group row's value is made from its members' (``rules.merge_of``), per metric: the legend and
#: the tooltip of a group row say it.
MERGE_LABELS = {
    m: {
        "l2": "the members' norms in quadrature (one L2 norm over all their entries)",
        "weighted": "the members' values weighted by size",
        "max": "the largest member's",
        "sum": "the members' counts summed",
        "pooled": "the members' variances pooled by size",
    }[merge_of(m)]
    for m in METRICS
}
#: the fields of a health-table row the page reads (columns, filter, selection); the rest stays in the Report.
#: (``health_a`` and ``change``: a comparison's first-run health and log10 change of the final gradient norm)
#: (``diagnosis``: the rank of the top diagnosis naming the row's layer, whose action ``suggestion`` is)
#: (``count``: the tensors of a group row; ``parent``: the expanded group [start, stop] a row is shown in)
TABLE_KEYS = (
    "index",
    "layer",
    "module_type",
    "numel",
    "status",
    "health",
    "health_a",
    "change",
    "flags",
    "grad_norm_median",
    "mean_abs_median",
    "max_abs_max",
    "zero_frac_mean",
    "nonfinite_total",
    "trend",
    "suggestion",
    "diagnosis",
    "count",
    "parent",
)
#: the most diagnoses the panel lists.
MAX_DIAGNOSES = 5
assert set(METRIC_LABELS) == set(METRICS)


def encode(name: str, array) -> bytes:
    """The bytes of binary trait ``name`` (C order, its dtype); a wrong dtype or rank is a bug here."""
    t = TRAITS[name]
    if t.kind != "bytes":
        raise TypeError(f"trait {name!r} is {t.kind}, not a binary buffer")
    if isinstance(array, bytes) and not array:
        return b""  # nothing to show
    a = np.asarray(array)
    want = np.dtype(t.dtype)
    if a.dtype != want and not (
        a.size == 0 or np.can_cast(a.dtype, want, "same_kind") or (want.kind == "u" and a.dtype.kind in "ui")
    ):
        raise TypeError(f"trait {name!r} carries {t.dtype}, got {a.dtype}")
    ndim = t.shape.count(",") + (0 if t.shape.endswith(",)") else 1)
    if a.size and a.ndim != ndim:
        raise ValueError(f"trait {name!r} is {t.shape}, got an array of shape {a.shape}")
    return np.ascontiguousarray(a, dtype=want).tobytes()


def constants_json() -> dict:
    """Everything ``js/src/protocol.ts`` must agree on, as JSON."""
    return {
        "traits": {n: {"kind": t.kind, "direction": t.direction, "dtype": t.dtype} for n, t in TRAITS.items()},
        "flags": FLAGS,
        "health_rank": HEALTH_RANK,
        "health_colors": HEALTH_COLORS,
        "health_notes": HEALTH_NOTES,
        "marks": MARKS,
        "metrics": list(METRICS),
        "metric_labels": METRIC_LABELS,
        "merge_labels": MERGE_LABELS,
        "max_diagnoses": MAX_DIAGNOSES,
        "table_keys": list(TABLE_KEYS),
        "compare_modes": list(COMPARE_MODES),
        "diff_stops": list(DIFF_STOPS),
        "diff_nodata": DIFF_NODATA,
        "viridis": VIRIDIS_HEX,
    }
