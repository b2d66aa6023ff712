"""The switchable tensor hooks of ``collect/_hooks.py`` (the noise probe's, off on steps it does not
measure): off, a hook is not called and the gradient is untouched; another hook in the same dict,
before or after it, runs in its place in either state; a dict that holds ours alone is unhooked
while off, and a hook the user adds meanwhile runs, ours joining it first; removed, switching puts
nothing back."""

import torch

from gradwidget.collect._hooks import TensorHooks


def _backward(w: torch.Tensor) -> None:
    w.grad = None
    (w * torch.arange(1.0, 4.0)).sum().backward()


def test_switched_off_hooks_are_not_called_and_the_users_hooks_around_them_run_in_order():
    w = torch.zeros(3, requires_grad=True)
    calls: list[str] = []
    user_before = w.register_hook(lambda g: calls.append("user before") or g * 2)
    hooks = TensorHooks()
    hooks.add(w, lambda g: calls.append(f"ours saw {g.tolist()}"))
    w.register_hook(lambda g: calls.append("user after") or g + 1)

    _backward(w)
    assert calls == ["user before", "ours saw [2.0, 4.0, 6.0]", "user after"]
    assert w.grad.tolist() == [3.0, 5.0, 7.0]

    calls.clear()
    hooks.on = False
    _backward(w)
    assert calls == ["user before", "user after"]  # ours is not called; the order of the rest holds
    assert w.grad.tolist() == [3.0, 5.0, 7.0]

    calls.clear()
    hooks.on = True
    _backward(w)
    assert calls == ["user before", "ours saw [2.0, 4.0, 6.0]", "user after"]

    user_before.remove()
    hooks.remove()
    calls.clear()
    hooks.on = False
    hooks.on = True  # after remove(): nothing to switch, nothing put back
    _backward(w)
    assert calls == ["user after"]
    assert w.grad.tolist() == [2.0, 3.0, 4.0]


def test_a_hook_added_while_off_stays_off_until_switched_on_and_remove_unhooks_the_empty_dict():
    w = torch.zeros(3, requires_grad=True)
    seen: list[list[float]] = []
    hooks = TensorHooks()
    hooks.on = False
    hooks.add(w, lambda g: seen.append(g.tolist()))
    _backward(w)
    assert seen == []
    hooks.on = True
    _backward(w)
    assert seen == [[1.0, 2.0, 3.0]]
    hooks.remove()
    assert w._backward_hooks is None  # no empty dict left for autograd to walk every backward
    _backward(w)
    assert seen == [[1.0, 2.0, 3.0]]


def test_a_dict_that_holds_only_our_hook_is_unhooked_while_off_and_hooked_again_on():
    w = torch.zeros(3, requires_grad=True)
    seen: list[list[float]] = []
    hooks = TensorHooks()
    hooks.add(w, lambda g: seen.append(g.tolist()))
    hooks.on = False
    assert w._backward_hooks is None  # autograd has no dict to walk on the steps not measured
    _backward(w)
    assert seen == []
    hooks.on = True
    _backward(w)
    assert seen == [[1.0, 2.0, 3.0]]
    hooks.on = False
    hooks.remove()
    hooks.on = True  # removed while off: nothing to switch back on
    assert w._backward_hooks is None
    _backward(w)
    assert seen == [[1.0, 2.0, 3.0]] and w.grad.tolist() == [1.0, 2.0, 3.0]


def test_a_hook_the_user_adds_while_ours_is_unhooked_runs_and_ours_joins_it_first():
    w = torch.zeros(3, requires_grad=True)
    calls: list[str] = []
    hooks = TensorHooks()
    hooks.add(w, lambda g: calls.append(f"ours saw {g.tolist()}"))
    hooks.on = False
    user = w.register_hook(lambda g: calls.append("user") or g * 2)  # a new dict: ours is unhooked
    _backward(w)
    assert calls == ["user"] and w.grad.tolist() == [2.0, 4.0, 6.0]

    calls.clear()
    hooks.on = True
    _backward(w)
    assert calls == ["ours saw [1.0, 2.0, 3.0]", "user"]  # in the order they were registered

    calls.clear()
    hooks.on = False  # the dict holds the user's hook too now: ours is a no-op in it
    _backward(w)
    assert calls == ["user"]

    hooks.remove()
    calls.clear()
    _backward(w)
    assert calls == ["user"]
    user.remove()  # the user's handle still removes the user's hook
    calls.clear()
    _backward(w)
    assert calls == [] and w.grad.tolist() == [1.0, 2.0, 3.0]


def test_a_dict_someone_else_drops_while_ours_is_off_in_it_is_not_hooked_again():
    """A library that drops a parameter's hooks (``_backward_hooks = None``) while ours is a no-op
    in the dict it shares with the user's: switching on does not hook that dict again."""
    w = torch.zeros(3, requires_grad=True)
    seen: list[str] = []
    hooks = TensorHooks()
    hooks.add(w, lambda g: seen.append("ours"))
    w.register_hook(lambda g: seen.append("user"))
    hooks.on = False
    w._backward_hooks = None
    hooks.on = True
    _backward(w)
    assert seen == [] and w._backward_hooks is None
    hooks.remove()
