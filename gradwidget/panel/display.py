"""A panel's notebook outputs: the widget view plus the static panel (``rendition``) for places
where no widget runs, and the outputs kept current. A mixin of GradientPanel.

A panel is usually shown before training (``panel`` in one cell, the loop in the next), when there
is nothing to draw yet. It is therefore displayed with a display id (``_ipython_display_``), and
after each cell that recorded steps the outputs it was shown in are updated (``_update_outputs``,
IPython's ``update_display``) with the static panel of the run as it ended: a notebook saved from
JupyterLab or Notebook 7 (which apply an update from a later cell to the earlier output) or
executed headless (nbclient, ``nbconvert --execute``) holds the final state in its outputs, not
only in its widget state. Called from the main thread after the cell, or from the analysis thread
once it has made the static panel (``background._after_cell``)."""

from __future__ import annotations

import base64

from ..outputs import to_ascii
from .base import PanelBase


class PanelDisplay(PanelBase):
    def _ipython_display_(self, **kwargs) -> None:
        """Shown as a notebook output (the last expression of a cell, or ``display(panel)``): the
        mime bundle published with a display id that later updates reuse."""
        from IPython.display import display

        data, md = self._repr_mimebundle_()
        handle = display(data, metadata=md, raw=True, display_id=True)
        if handle is not None:
            run = self.run
            # with the run's version its static panel shows (-1: none yet)
            self._displays.append([handle, run.version if run is not None and run.n_steps else -1])

    def _update_outputs(self) -> None:
        """Every output this panel was displayed in that shows an older state, again: the same
        widget view, the new static panel (an output made at the end of the cell that trained
        already shows it, and is left alone: updating it would only render its view again)."""
        run = self.run
        version = run.version if run is not None else -1
        self._outputs_version = version
        stale = [d for d in self._displays if d[1] != version]
        if not stale:
            return
        data, md = self._repr_mimebundle_()
        for d in stale:
            d[0].update(data, metadata=md, raw=True)
            d[1] = version

    def _static_bundle(self) -> dict:
        """``image/png`` (the heatmap), ``text/html`` (the static panel) and ``text/plain`` (an ASCII
        heatmap) of the run as it is now (the analysis of this state is waited for)."""
        from ..fallback import FALLBACK_CLASS, static_fallback_html
        from .background import AFTER_CELL_WAIT
        from .rendition import rendition_html

        run = self.run
        if run is not None and run.n_steps:
            self._final_static(AFTER_CELL_WAIT)
        if run is None or run.n_steps == 0 or not self.static_png:
            meta = {**self.meta, "message": self.meta.get("message") or "no step recorded yet"}
            note = f"GradientPanel: {meta['message']}"
            return {"text/html": rendition_html(meta, {}, None, None, [], ""), "text/plain": note}
        png64 = self.static_png.split(",", 1)[1]
        html = self.static_html
        if FALLBACK_CLASS not in html:  # a comparison: its figures' image and its table
            html = static_fallback_html(base64.b64decode(png64), html)
        return {"image/png": png64, "text/html": html, "text/plain": to_ascii(run, width=60)}
