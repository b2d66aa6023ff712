"""The hooks gradwidget puts on the user's modules, made so that copying a module does not copy the
Recorder with it: ``torch.save(model)`` pickles a module's hook dicts and ``copy.deepcopy(model)``
(an EMA copy) copies them, which failed on a local function or gave the copy hooks bound to the
original Recorder (recording the copy's forwards into it). A ``Hook`` is copied and pickled as an
inert one: the copy runs a no-op where the original runs the Recorder's hook, and holds nothing of
it (a pickle then names ``gradwidget.collect._hooks.inert``: gradwidget must be importable to load
it, as for any object pickled with a reference to a package). Private to ``gradwidget.collect``."""

from __future__ import annotations

from typing import Any, Callable


class Hook:
    """Calls ``fn``; a copy or a pickle of it is ``inert()``."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __reduce__(self):
        return (inert, ())


def _nothing(*args, **kwargs) -> None:
    return None


def inert() -> Hook:
    """The hook a copied module holds in place of the Recorder's: it does nothing."""
    return Hook(_nothing)
