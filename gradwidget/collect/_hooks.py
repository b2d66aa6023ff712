"""The hooks gradwidget puts on the user's modules, made so that copying a module does not copy the
Recorder with it: ``torch.save(model)`` pickles a module's hook dicts and ``copy.deepcopy(model)``
(an EMA copy) copies them, which failed on a local function or gave the copy hooks bound to the
original Recorder (recording the copy's forwards into it). A ``Hook`` is copied and pickled as an
inert one: the copy runs a no-op where the original runs the Recorder's hook, and holds nothing of
it (a pickle then names ``gradwidget.collect._hooks.inert``: gradwidget must be importable to load
it, as for any object pickled with a reference to a package). Private to ``gradwidget.collect``."""

from __future__ import annotations

import collections
from typing import Any, Callable

import torch


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
    which then takes the GIL and walks it for every tensor in every backward (a cost that grows with
    the number of tensors: docs/costs.md); setting an empty dict to None
    unhooks it. (A post-accumulate-grad hook's dict cannot be unhooked so: use those only where
    they stay.) A dict that still holds someone else's hook is left as it is."""
    for h in handles:
        h.remove()
    for t in tensors:
        unhook_if_empty(t)


def unhook_if_empty(t) -> None:
    """Take ``t``'s hook dict off autograd if it is empty (``remove_tensor_hooks``: an empty dict
    left hooked is still walked for every tensor in every backward)."""
    if getattr(t, "_backward_hooks", None) == {}:
        t._backward_hooks = None


#: a tensor hook that does nothing, in C: a ``deque(maxlen=0)`` keeps nothing it is given, and its
#: ``append`` returns None without a Python frame (a Python function that returns at once costs the
#: engine a Python frame per call, per tensor, per backward)
_DISCARD: Callable[[Any], None] = collections.deque(maxlen=0).append


class _Entry:
    """One switchable hook: its tensor, the hook dict that holds it under ``key``, its function, and
    whether this entry unhooked the dict (``unhooked``)."""

    __slots__ = ("tensor", "hooks", "key", "fn", "unhooked")

    def __init__(self, tensor: torch.Tensor, hooks: dict, key: int, fn: Callable) -> None:
        self.tensor, self.hooks, self.key, self.fn = tensor, hooks, key, fn
        self.unhooked = False

    def off(self) -> None:
        """A leaf tensor whose dict holds this hook alone (a parameter no one else hooks, the usual
        case) has the dict unhooked from autograd, kept here: a dict autograd holds costs it the
        GIL, the gradient's Python object and a walk per tensor per backward whatever it holds.
        Any other keeps its dict, with ``_DISCARD`` in
        this hook's place, so that the other hooks in it run, in their order."""
        t, hooks = self.tensor, self.hooks
        if self.key not in hooks:
            return  # taken out from under us: nothing to switch
        if t._backward_hooks is hooks and len(hooks) == 1 and t.grad_fn is None:
            t._backward_hooks = None
            self.unhooked = True
        else:
            hooks[self.key] = _DISCARD

    def on(self) -> None:
        t, hooks = self.tensor, self.hooks
        if self.key not in hooks:
            return
        hooks[self.key] = self.fn
        if not self.unhooked:
            return  # its dict stayed where it was (or someone replaced it: not ours to put back)
        self.unhooked = False
        now = t._backward_hooks
        if now is None:
            t._backward_hooks = hooks
        elif now is not hooks:
            # hooked by someone while this dict was unhooked (``register_hook`` made a new dict):
            # this hook joins that dict, first, as it was registered before them
            del hooks[self.key]
            rest = list(now.items())
            now.clear()
            now[self.key] = self.fn
            now.update(rest)
            self.hooks = now

    def remove(self) -> None:
        self.hooks.pop(self.key, None)
        unhook_if_empty(self.tensor)


class TensorHooks:
    """Tensor hooks (``register_hook``) that can be switched off without being removed (``_Entry``:
    a dict that holds one of them alone is unhooked from autograd and hooked again, any other
    holds a no-op in its place). Switching makes and drops no handle (re-registering thousands of
    hooks for every measured step costs time and full garbage collections), and the tensors' other
    hooks keep running, in their order."""

    def __init__(self) -> None:
        self._entries: list[_Entry] = []
        self._on = True

    def add(self, t: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
        key = t.register_hook(fn).id
        hooks = t._backward_hooks
        assert hooks is not None  # register_hook made it
        entry = _Entry(t, hooks, key, fn)
        self._entries.append(entry)
        if not self._on:
            entry.off()

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        if bool(value) == self._on:
            return
        self._on = bool(value)
        for entry in self._entries:
            entry.on() if self._on else entry.off()

    def remove(self) -> None:
        for entry in self._entries:
            entry.remove()
        self._entries = []
