"""The selection, a part of the panel: which layer is selected and in what order the page's
choices are applied.

The cursor and the selected layer (``protocol.CHOICE_KEYS``) have one owner, the kernel, and one
order: the page numbers each choice it makes (the ``choice`` trait) and the kernel applies one only
when it is newer than the last it applied (``choice_applied``, sent back in the same update), so a
drag position that arrives late never overwrites a later one. A layer chosen by the user (from the
page or Python) is never moved by the analysis; before one is, the panel shows the layer given to
its constructor, else the top diagnosis' first layer, else the layer a user would look at first.

The panel asks this part; the part keeps its state and touches no trait (the panel sets them)."""

from __future__ import annotations

from ..run import Run
from .protocol import CHOICE_KEYS
from .rows import toggled


class Selection:
    def __init__(self, initial_layer=None) -> None:
        #: the layer given to the constructor (a name or column index; None: none)
        self.initial = initial_layer
        self._chosen = False

    def page_choice(self, sync_data: dict, applied: int) -> tuple[dict, int | None]:
        """A message from the page, without a choice older than the newest applied (``applied``),
        and the number of the choice it carries when that one is new (None: none or a stale one)."""
        seq = sync_data.get("choice")
        if seq is None:
            return sync_data, None
        if int(seq) > applied:
            return sync_data, int(seq)
        return {k: v for k, v in sync_data.items() if k not in CHOICE_KEYS and k != "choice"}, None

    def chose(self) -> None:
        """The user selected a layer (then the analysis never moves it)."""
        self._chosen = True

    def analysis_may_pick(self) -> bool:
        """The analysis may select its top diagnosis' first layer: nothing chosen or given yet."""
        return not self._chosen and self.initial is None

    def default_layer(self, run: Run) -> int:
        """The layer shown before one is chosen: the one given to the constructor, else the layer a
        user would look at first (``_rows.default_layer``)."""
        if self.initial is not None:
            try:
                return run.layer_index(self.initial)
            except (KeyError, IndexError):
                pass
        from .._rows import default_layer

        return int(default_layer(run))


def need_run(run: Run | None) -> Run:
    if run is None:
        raise ValueError("no step has been recorded yet: layers are known after the first step")
    return run


def expanded_with(run: Run, expanded: list, layer) -> list:
    """``expanded`` with every group holding ``layer`` (a name or column index) showing its members."""
    i = run.layer_index(layer)
    return expanded if [i, i + 1] in expanded else [*expanded, [i, i + 1]]


def collapsed(run: Run, expanded: list, layer) -> list:
    """``expanded`` with every group holding ``layer`` (a name or column index) folded back."""
    from .._rows import layer_row_groups

    i = run.layer_index(layer)
    groups = layer_row_groups(run)  # the panel's top-level groups (the static figures'); none below the row cap
    for g in groups[0] if groups is not None else []:
        if g[0] <= i <= g[-1]:
            expanded = toggled(expanded, (g[0], g[-1] + 1), expand=False)
    return expanded
