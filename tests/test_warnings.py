"""Every warning gradwidget gives is a GradwidgetWarning, so the tests' filterwarnings (pyproject)
turns each one a test did not expect into a failure, and a user can silence them all at once."""

import ast
import warnings
from pathlib import Path

import pytest

import gradwidget
from gradwidget import GradwidgetWarning
from gradwidget._warnings import GradwidgetDeprecationWarning
from gradwidget.storage import RunWriteWarning

PACKAGE = Path(gradwidget.__file__).parent
CATEGORIES = {"GradwidgetWarning", "GradwidgetDeprecationWarning", "RunWriteWarning"}


def _warn_calls(tree):
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "warn"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "warnings"
        ):
            yield node


def test_every_warning_in_the_package_names_a_gradwidget_category():
    found, bare = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for call in _warn_calls(ast.parse(path.read_text(encoding="utf-8"))):
            found += 1
            cat = (
                call.args[1]
                if len(call.args) > 1
                else next((k.value for k in call.keywords if k.arg == "category"), None)
            )
            if not (isinstance(cat, ast.Name) and cat.id in CATEGORIES):
                bare.append(f"{path.relative_to(PACKAGE)}:{call.lineno}")
    assert found >= 15 and bare == []


def test_the_categories_derive_from_the_base_and_keep_their_kind():
    assert issubclass(RunWriteWarning, GradwidgetWarning) and issubclass(RunWriteWarning, RuntimeWarning)
    assert issubclass(GradwidgetDeprecationWarning, DeprecationWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GradwidgetWarning)  # one filter silences all of them
        warnings.warn("quiet", RunWriteWarning)
    with pytest.raises(GradwidgetWarning):  # pyproject's filterwarnings: unexpected ones fail the test
        warnings.warn("loud", RunWriteWarning)
