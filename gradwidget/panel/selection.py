"""Choosing rows from Python: select a layer, expand a group of layers into its members or fold it
back (the panel groups rows past ``plots.MAX_DRAWN_ROWS`` layers). A mixin of GradientPanel: it sets
the panel's ``layer`` and ``expanded`` traits, whose validators and observers send the change."""

from __future__ import annotations

from ..run import Run
from .base import PanelBase
from .rows import toggled


class PanelSelection(PanelBase):
    def select(self, layer) -> None:
        """Select a layer by name or column index (after an update a training thread is sending,
        which would write its own selection back over it: ``PanelSync.set_state``)."""
        with self._lock:
            self.layer = self._need_run().layer_index(layer)

    def expand(self, layer) -> None:
        """Show ``layer`` (a name or column index) in its own row: every group holding it (past
        ``plots.MAX_DRAWN_ROWS`` layers the panel groups them) shows its members."""
        run = self._need_run()
        i = run.layer_index(layer)
        if [i, i + 1] not in self.expanded:
            self.expanded = [*self.expanded, [i, i + 1]]

    def collapse(self, layer=None) -> None:
        """Fold back every group holding ``layer`` (a name or column index); all groups when None."""
        if layer is None:
            self.expanded = []
            return
        run = self._need_run()
        i = run.layer_index(layer)
        for g in _top_groups(run):
            if g[0] <= i <= g[-1]:
                self.expanded = toggled(self.expanded, (g[0], g[-1] + 1), expand=False)

    def _need_run(self) -> Run:
        run = self.run
        if run is None:
            raise ValueError("no step has been recorded yet: layers are known after the first step")
        return run

    @property
    def layer_name(self) -> str | None:
        run = self.run
        if run is None or self.layer < 0 or self.layer >= run.n_layers:
            return None
        return run.layers[self.layer].name


def _top_groups(run: Run) -> list:
    """The panel's top-level groups of layers (the static figures'); none below the row cap."""
    from .._rows import layer_row_groups

    g = layer_row_groups(run)
    return g[0] if g is not None else []
