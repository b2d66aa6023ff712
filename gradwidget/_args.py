"""Checks of the options users pass, shared by every entry point (the lowest layer: imports nothing of
gradwidget), so an option is refused where it is given, naming it and what it may be."""

from __future__ import annotations


def check_bool(name: str, value) -> bool:
    """A yes/no option: True or False only (``None``, 0 or ``"no"`` are refused, not read as a
    truth value: ``step_hooks=None`` silently recorded nothing)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return value


def check_bool_or_auto(name: str, value) -> bool | str:
    """A three-way option (``trace_nonfinite``, ``noise_scale``): True, False or "auto" only."""
    if isinstance(value, (bool, str)) and value in (True, False, "auto"):
        return value
    raise TypeError(f"{name} must be True, False or 'auto', got {type(value).__name__} {value!r}")


def check_count(name: str, value, minimum: int, also: str = "") -> int:
    """A whole-number option of at least ``minimum`` (0 or 1), checked up front so a bad value fails
    here, not inside a training hook (a bool is an int to Python, but never what was meant).
    ``also``: the other values the option takes, said first (``"'auto', None or "``)."""
    import numpy as np

    kind = "a positive int" if minimum == 1 else "a non-negative int"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {also}{kind}, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {also}{kind}, got {value!r}")
    return int(value)


#: what ``objective=`` accepts: ``"auto"`` reads the loss's graph; ``"loss"`` says it is a loss to
#: minimise (its trajectory is judged); the others say it is not (no trajectory claims).
OBJECTIVES = ("auto", "loss", "adversarial", "policy_gradient", "other")


def check_objective(objective) -> str:
    """``objective`` if it is one of ``OBJECTIVES``; a clear error otherwise (the API's edge)."""
    if not isinstance(objective, str) or objective not in OBJECTIVES:
        raise ValueError(
            f"objective must be one of {', '.join(repr(o) for o in OBJECTIVES)} (what the loss is: 'loss' "
            f"for a loss to minimise, 'adversarial' for a GAN's, 'policy_gradient', 'other'), not {objective!r}"
        )
    return objective
