"""How values look to a person, in the panel, its static copy and every figure: metric labels, the
colours of health grades and of marked cells, the colour map, the health table's columns and cell
formats, and a layer name shortened to fit. Defined once here (below the figures and the panel, so
neither imports the other for them); ``panel/protocol.py`` hands them to the page."""

from typing import Sequence

import numpy as np

from .rules import CANNOT_MOVE, CANNOT_MOVE_WHY

#: the colour of each health grade (a parameter the loss cannot move: a neutral blue-grey, neither
#: a warning nor Healthy's green).
HEALTH_COLORS = {
    "Healthy": "#2e7d32",
    "Warning": "#ef8f00",
    "Critical": "#c62828",
    "Unknown": "#8a8a8a",
    CANNOT_MOVE: "#546e7a",
}
#: what a health grade means where its name alone does not say (a badge's tooltip, a cell's title).
HEALTH_NOTES = {CANNOT_MOVE: CANNOT_MOVE_WHY}
#: colours of marked cells, outside viridis' gamut (heatmap, bars, legend, static images).
MARKS = {"vanishing": "#c8c8c8", "exploding": "#e3120b", "nonfinite": "#ff00ff", "nodata": "#ffffff"}
#: a metric in words.
METRIC_LABELS = {
    "grad_norm": "gradient L2 norm",
    "mean_abs": "mean |g|",
    "max_abs": "max |g|",
    "std": "std of g",
    "zero_frac": "fraction of zero entries",
    "nonfinite": "non-finite entries",
    "weight_norm": "weight L2 norm",
    "update_norm": "update L2 norm",
}
#: the difference map's colours (``plots.DIFF_CMAP``, matplotlib's diverging "RdBu_r", centred on no
#: change, sampled at 17 even stops from -meta.diff_max to +meta.diff_max; the page interpolates
#: between them): tests/test_look.py checks them against matplotlib's map.
DIFF_STOPS = (
    "#053061",
    "#175290",
    "#2a71b2",
    "#3f8ec0",
    "#6bacd1",
    "#9bc9e0",
    "#c2ddec",
    "#e0ecf3",
    "#f7f6f6",
    "#fbe5d8",
    "#fbccb4",
    "#f5aa89",
    "#e48066",
    "#d05548",
    "#ba2832",
    "#930e26",
    "#67001f",
)
#: a difference-map cell where either run has no value (matplotlib's grey "0.8", off the diverging map).
DIFF_NODATA = "#cccccc"
#: viridis (perceptually uniform, readable with the common colour-vision deficiencies and in
#: greyscale) as 256 RGB colours in hex, the page's and the static image's colour map (matplotlib's
#: ``viridis`` rounded to 8 bits: tests/test_look.py).
VIRIDIS_HEX = (
    "44015444025645045745055946075a46085c460a5d460b5e470d60470e61471063471164471365481467481668481769"
    "48186a481a6c481b6d481c6e481d6f481f70482071482173482374482475482576482677482878482979472a7a472c7a"
    "472d7b472e7c472f7d46307e46327e46337f463480453581453781453882443983443a83443b84433d84433e85423f85"
    "4240864241864142874144874045884046883f47883f48893e49893e4a893e4c8a3d4d8a3d4e8a3c4f8a3c508b3b518b"
    "3b528b3a538b3a548c39558c39568c38588c38598c375a8c375b8d365c8d365d8d355e8d355f8d34608d34618d33628d"
    "33638d32648e32658e31668e31678e31688e30698e306a8e2f6b8e2f6c8e2e6d8e2e6e8e2e6f8e2d708e2d718e2c718e"
    "2c728e2c738e2b748e2b758e2a768e2a778e2a788e29798e297a8e297b8e287c8e287d8e277e8e277f8e27808e26818e"
    "26828e26828e25838e25848e25858e24868e24878e23888e23898e238a8d228b8d228c8d228d8d218e8d218f8d21908d"
    "21918c20928c20928c20938c1f948c1f958b1f968b1f978b1f988b1f998a1f9a8a1e9b8a1e9c891e9d891f9e891f9f88"
    "1fa0881fa1881fa1871fa28720a38620a48621a58521a68522a78522a88423a98324aa8325ab8225ac8226ad8127ad81"
    "28ae8029af7f2ab07f2cb17e2db27d2eb37c2fb47c31b57b32b67a34b67935b77937b87838b9773aba763bbb753dbc74"
    "3fbc7340bd7242be7144bf7046c06f48c16e4ac16d4cc26c4ec36b50c46a52c56954c56856c66758c7655ac8645cc863"
    "5ec96260ca6063cb5f65cb5e67cc5c69cd5b6ccd5a6ece5870cf5773d05675d05477d1537ad1517cd2507fd34e81d34d"
    "84d44b86d54989d5488bd6468ed64590d74393d74195d84098d83e9bd93c9dd93ba0da39a2da37a5db36a8db34aadc32"
    "addc30b0dd2fb2dd2db5de2bb8de29bade28bddf26c0df25c2df23c5e021c8e020cae11fcde11dd0e11cd2e21bd5e21a"
    "d8e219dae319dde318dfe318e2e418e5e419e7e419eae51aece51befe51cf1e51df4e61ef6e620f8e621fbe723fde725"
)


#: columns of the health table, in order, with their headers and formats.
HEALTH_COLUMNS = (
    ("layer", "layer", "{}"),
    ("module_type", "type", "{}"),
    ("health", "health", "{}"),
    ("grad_norm_median", "median ‖g‖", "{:.2e}"),
    ("mean_abs_median", "median mean|g|", "{:.2e}"),
    ("max_abs_max", "max |g|", "{:.2e}"),
    ("zero_frac_mean", "zeros", "{:.0%}"),
    ("trend", "trend", "{}"),
    ("flags", "flags", "{}"),
)


def format_cell(value, fmt: str) -> str:
    """A health-table cell in words: ``fmt`` on a number, a list joined, "–" for a missing value."""
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return ", ".join(str(v) for v in value)
    if value is None:
        return ""
    if isinstance(value, float) and value != value:
        return "–"
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


def _joined(parts: Sequence[str], kept: Sequence[bool]) -> str:
    """The kept parts joined by '.', each run of dropped ones shown as one '…'."""
    out = ""
    gap = False
    for p, k in zip(parts, kept):
        if not k:
            gap = True
            continue
        out += ("…" if gap else "." if out else "") + p
        gap = False
    return out + ("…" if gap else "")


def elide(name: str, width: int = 28) -> str:
    """A layer name in at most ``width`` characters, keeping what tells it from its neighbours: the
    parameter (``weight``), its module (``c_attn``) and every block index with the word before it
    (``h.3``); the other parts of the path go first, the outermost first (``transformer.h.3.attn.
    c_attn.weight`` -> ``…h.3…c_attn.weight``), then the block words, then the module; a name still
    too long is cut in the middle. ``js/src/names.ts`` is the page's copy (tests/test_names.py)."""
    if len(name) <= width:
        return name
    parts = name.split(".")
    n = len(parts)
    index = {i for i, p in enumerate(parts) if p.isdigit()}
    before = {i - 1 for i in index if i > 0} - index
    leaf = {n - 1, n - 2} if n > 2 else set(range(n))
    order = [i for i in range(n) if i not in index | before | leaf]
    order += sorted(before - leaf) + [i for i in sorted(leaf) if i != n - 1]
    kept = [True] * n
    text = name
    for i in order:
        kept[i] = False
        text = _joined(parts, kept)
        if len(text) <= width:
            return text
    if len(text) > width:
        tail = (width - 1) // 2 + (width - 1) % 2
        text = text[: width - 1 - tail] + "…" + text[-tail:]
    return text
