"""``gradwidget.widget``: where GradientPanel used to live; it is ``gradwidget.panel.widget`` now."""

from .panel.payload import MAX_HISTS, cell_flags, column_block  # noqa: F401
from .panel.protocol import FLAG_EXPLODING, FLAG_NODATA, FLAG_NONFINITE, FLAG_VANISHING, PANEL_MAX_COLUMNS  # noqa: F401
from .jsonsafe import jsonable  # noqa: F401
from .panel.table import table_from_report, table_from_run  # noqa: F401
from .panel.widget import BUNDLE_MISSING, GradientPanel  # noqa: F401
