"""``gradwidget.frames``: the old name of ``gradwidget.outputs`` (the original crate's JSON frames,
CSV timeline, ASCII heatmap and summary), kept importable: it *is* that module, so a name set on
one is seen on the other."""

import sys

from . import outputs

sys.modules[__name__] = outputs
