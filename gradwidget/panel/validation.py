"""The panel's trait validators (a bad value from Python gets a TraitError that says what is
allowed) and observers (a change from either side sends what it affects). A mixin of GradientPanel."""

from __future__ import annotations

import traitlets as t

from ..run import METRICS
from . import payload as P
from .base import PanelBase


class PanelValidation(PanelBase, t.HasTraits):
    """HasTraits, so that traitlets names these handlers when the class is made (it does so only for
    classes of its own); GradientPanel's traits themselves stay on GradientPanel."""

    @t.validate("metric")
    def _check_metric(self, proposal):
        return _one_of("metric", proposal["value"], METRICS)

    @t.validate("layer")
    def _check_layer(self, proposal):
        v = int(proposal["value"])
        run = self.run
        n = run.n_layers if run is not None else None
        if v < -1 or (n is not None and v >= n):
            raise t.TraitError(
                f"layer must be -1 (none) or a column index below {n}, got {v}; "
                "use panel.select(name) to select by name"
            )
        return v

    @t.validate("step")
    def _check_step(self, proposal):
        return self._snap(int(proposal["value"]))

    @t.validate("mode")
    def _check_mode(self, proposal):
        from .protocol import COMPARE_MODES

        return _one_of("mode", proposal["value"], COMPARE_MODES)

    @t.validate("expanded")
    def _check_expanded(self, proposal):
        out = []
        for r in proposal["value"]:
            if len(r) != 2 or not 0 <= int(r[0]) < int(r[1]):
                raise t.TraitError(f"expanded holds layer ranges [start, stop] with 0 <= start < stop, got {r!r}")
            if [int(r[0]), int(r[1])] not in out:
                out.append([int(r[0]), int(r[1])])
        return out

    @t.validate("columns")
    def _check_columns(self, proposal):
        return int(min(P.PANEL_MAX_COLUMNS, max(P.PANEL_MIN_COLUMNS, int(proposal["value"]))))

    @t.observe("step")
    def _step_changed(self, change):
        if self._internal or not self._ready:
            return
        run = self.run
        if run is not None and run.n_steps:
            last = int(run.steps[-1])
            # the page says "follow" (End, or the newest column) with the newest step *it* had: a
            # training cell has recorded more since, and the kernel reads the message only when the
            # cell ends. Following is the user's last action: keep it, at the newest step now.
            following = getattr(self, "_property_lock", {}).get("follow") is True
            self._internal += 1
            try:
                self.follow = following or change["new"] >= last
                if following and change["new"] != last:
                    self.step = last
            finally:
                self._internal -= 1
        self._send_detail()

    @t.observe("layer")
    def _layer_changed(self, change):
        if not self._internal and self._ready:
            self._layer_chosen = True  # by the user (page or Python): the analysis never moves it
            self._send_detail()

    @t.observe("metric", "columns")
    def _view_changed(self, change):
        if not self._internal and self._ready:
            self._push(force=True)

    @t.observe("expanded")
    def _rows_changed(self, change):
        """Expanding or collapsing a group changes the rows: the heatmap and the table are sent again."""
        if not self._internal and self._ready:
            with self._lock:
                self._push(force=True)
                self._regroup_table()


def _one_of(what: str, value, allowed) -> str:
    """A trait value from a fixed set, or a TraitError that lists the set."""
    if value not in allowed:
        raise t.TraitError(f"unknown {what} {value!r}; choose one of {list(allowed)}")
    return value
