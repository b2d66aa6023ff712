"""A widget's synced traits, made from their one declaration (``protocol.TRAITS``).

    class GradientPanel(anywidget.AnyWidget):
        heat = Synced()      # the row "heat": float32 (rows, cols), kernel -> page
        metric = Synced()    # the row "metric": one of METRICS, either way

A ``Synced`` trait finds its row by the attribute's name when the class is made (a name the
protocol does not declare is an error then), and takes from it its default and its validation
(``protocol.Trait.validate``: a value of the wrong kind, outside its range or choices gets a
TraitError that says what is allowed; an array set on a binary trait is stored as the protocol's
bytes, checked for dtype and shape). What a widget checks against its own state (a step it has
recorded, a layer it has) is its own ``@traitlets.validate``.
"""

from __future__ import annotations

from typing import Any

import traitlets as t

from .protocol import TRAITS, Trait


class Synced(t.TraitType[Any, Any]):
    """A trait synced with the page, declared by its row of ``protocol.TRAITS``."""

    info_text = "a synced trait declared in gradwidget/panel/protocol.py"

    def __init__(self) -> None:
        super().__init__()
        self.tag(sync=True)
        self.row: Trait | None = None

    def class_init(self, cls: type[t.HasTraits], name: str | None) -> None:
        super().class_init(cls, name)
        row = TRAITS.get(name or "")
        if row is None:
            raise TypeError(
                f"{cls.__name__}.{name} is not a trait of the protocol: declare it in gradwidget/panel/protocol.py "
                "TRAITS (and js/src/protocol.ts)"
            )
        self.row = row
        self.help = row.doc
        if row.kind != "json":  # an immutable default is the trait's default_value; a JSON one is made fresh
            self.default_value = row.initial()

    def make_dynamic_default(self) -> Any:
        assert self.row is not None
        return self.row.initial()

    def validate(self, obj: Any, value: Any) -> Any:
        assert self.row is not None
        try:
            return self.row.validate(value)
        except (TypeError, ValueError) as e:
            raise t.TraitError(str(e)) from None
