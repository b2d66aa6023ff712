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


def remove_tensor_hooks(handles: list, tensors) -> None:
    """Remove the tensor hooks (``register_hook``) ``handles`` put on ``tensors``, and the hook dicts
    left empty on them. Removing a handle empties its dict but leaves the dict hooked into autograd,
    which then takes the GIL and walks it for every tensor in every backward (issue 22: +6% on the
    step of 2,000 ``Linear(2, 2)`` for the noise probe's hooks); setting an empty dict to None
    unhooks it. (A post-accumulate-grad hook's dict cannot be unhooked so: use those only where
    they stay.) A dict that still holds someone else's hook is left as it is."""
    for h in handles:
        h.remove()
    for t in tensors:
        if getattr(t, "_backward_hooks", None) == {}:
            t._backward_hooks = None
