"""The base class of every warning gradwidget gives, so that a user (or the test suite's
``filterwarnings``) can silence or escalate all of gradwidget's own warnings and no one else's."""


class GradwidgetWarning(UserWarning):
    """A warning from gradwidget: something went wrong that training survives (a failed write, a
    parameter left out, a panel update that failed)."""


class GradwidgetDeprecationWarning(GradwidgetWarning, DeprecationWarning):
    """A gradwidget name that still works but will go: its docstring names the new one."""
