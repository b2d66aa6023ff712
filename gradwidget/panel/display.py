"""The notebook outputs, a part of the panel: the outputs it was displayed in, kept current.

A panel is usually shown before training (``panel`` in one cell, the loop in the next), when there
is nothing to draw yet. It is therefore displayed with a display id (``show``), and after each cell
that recorded steps the outputs it was shown in are updated (``update``, IPython's
``update_display``) with the static panel of the run as it ended: a notebook saved from JupyterLab
or Notebook 7 (which apply an update from a later cell to the earlier output) or executed headless
(nbclient, ``nbconvert --execute``) holds the final state in its outputs, not only in its widget
state. The panel makes the mime bundle; this part owns the display handles, the run version they
show, and whether a front end drew the panel."""

from __future__ import annotations

from typing import Callable


class Outputs:
    def __init__(self) -> None:
        self._displays: list = []  # [IPython display handle, run version it shows]
        #: the run version the outputs show (-1: none)
        self.version = -1
        self._due = False  # the analysis thread updates them after its next final static panel
        #: a front end drew the panel (its page said so)
        self.seen = False

    def show(self, bundle: tuple[dict, dict], version: int) -> None:
        """Publish the panel's mime bundle as an output with a display id that later updates reuse
        (``version``: the run version its static panel shows, -1: none yet)."""
        from IPython.display import display

        data, md = bundle
        handle = display(data, metadata=md, raw=True, display_id=True)
        if handle is not None:
            self._displays.append([handle, version])

    def update(self, bundle: Callable[[], tuple[dict, dict]], version: int) -> None:
        """Every output that shows an older state than run version ``version``, again: the same
        widget view, the new static panel (an output made at the end of the cell that trained
        already shows it, and is left alone: updating it would only render its view again)."""
        self.version = version
        stale = [d for d in self._displays if d[1] != version]
        if not stale:
            return
        data, md = bundle()
        for d in stale:
            d[0].update(data, metadata=md, raw=True)
            d[1] = version

    def due_after_analysis(self, version: int) -> None:
        """The outputs show run version ``version`` once the analysis thread has made its static panel."""
        self.version = version
        self._due = True

    def take_due(self, current: bool) -> bool:
        """The analysis thread made a final static panel (``current``: of the run as it is now):
        True once, when the outputs wait for it (then update them)."""
        due = self._due and current
        self._due = self._due and not due
        return due
