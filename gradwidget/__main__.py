"""``python -m gradwidget``: the command line (``gradwidget.cli``), for a kernel whose environment's
scripts are not on the PATH (``!python -m gradwidget analyze run_dir`` in a notebook)."""

import sys

from .cli import main

sys.exit(main())
