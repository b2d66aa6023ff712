"""How values look to a person, in the panel, its static copy and every figure: metric labels, the
colours of health grades and of marked cells. Defined once here (below the figures and the panel, so
neither imports the other for them); ``panel/protocol.py`` hands them to the page."""

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
#: a difference-map cell where either run has no value (matplotlib's grey "0.8", off the diverging map).
DIFF_NODATA = "#cccccc"
