"""``gradwidget.widget``: where GradientPanel used to live; it is ``gradwidget.panel.widget`` now."""
from .panel.payload import MAX_COLUMNS, MAX_HISTS, block_reduce, cell_flags, column_block  # noqa: F401
from .panel.protocol import FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING  # noqa: F401
from .panel.table import jsonable, table_from_report, table_from_run  # noqa: F401
from .panel.widget import BUNDLE_MISSING, GradientPanel  # noqa: F401
