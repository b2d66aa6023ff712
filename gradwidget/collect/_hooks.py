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
    which then takes the GIL and walks it for every tensor in every backward (issue 22: +6% on the
    step of 2,000 ``Linear(2, 2)`` for the noise probe's hooks); setting an empty dict to None
    unhooks it. (A post-accumulate-grad hook's dict cannot be unhooked so: use those only where
    they stay.) A dict that still holds someone else's hook is left as it is."""
    for h in handles:
        h.remove()
    for t in tensors:
        if getattr(t, "_backward_hooks", None) == {}:
            t._backward_hooks = None


#: a tensor hook that does nothing, in C: a ``deque(maxlen=0)`` keeps nothing it is given, and its
#: ``append`` returns None without a Python frame (a Python function that returns at once costs the
#: engine 0.6 µs more a call: 2,000 ``Linear(2, 2)``'s 4,000 hooks, +6.6 against +4.1 ms a backward)
_DISCARD: Callable[[Any], None] = collections.deque(maxlen=0).append


class TensorHooks:
    """Tensor hooks (``register_hook``) that can be switched off without being removed: off, each
    one's entry in its tensor's hook dict holds ``_DISCARD``; on, its function again. Switching
    rewrites dict values only, so no handle is made or dropped (re-registering 4,000 hooks for
    every measured step cost 10 ms, and full garbage collections), and the dicts keep their order
    and whatever other hooks they hold."""

    def __init__(self) -> None:
        self._handles: list = []
        self._tensors: list[torch.Tensor] = []
        self._entries: list[tuple[dict, int, Callable]] = []  # (the tensor's hook dict, key, function)
        self._on = True

    def add(self, t: torch.Tensor, fn: Callable[[torch.Tensor], None]) -> None:
        handle = t.register_hook(fn)
        hooks = t._backward_hooks
        assert hooks is not None  # register_hook made it
        self._handles.append(handle)
        self._tensors.append(t)
        self._entries.append((hooks, handle.id, fn))
        if not self._on:
            hooks[handle.id] = _DISCARD

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        if bool(value) == self._on:
            return
        self._on = bool(value)
        for hooks, key, fn in self._entries:
            if key in hooks:  # not removed since
                hooks[key] = fn if self._on else _DISCARD

    def remove(self) -> None:
        remove_tensor_hooks(self._handles, self._tensors)
        self._handles, self._tensors, self._entries = [], [], []
