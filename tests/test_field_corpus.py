"""The field corpus (bench/field_corpus) without its packages: a case names what it needs and is
skipped with a message saying what to install; the corpus imports without any of them."""

from field_corpus import FIELD, FieldCase, Health


def _never():
    raise AssertionError("a skipped case is never trained")


def test_a_case_whose_package_is_missing_says_what_to_install():
    case = FieldCase("x", "some-dist", ("json", "gradwidget_no_such_module"), "a task", _never)
    assert case.missing() == ["gradwidget_no_such_module"]
    assert case.skip_reason() == "gradwidget_no_such_module not installed (pip install some-dist)"


def test_a_case_with_its_packages_installed_is_not_skipped():
    case = FieldCase("x", "json", ("json",), "a task", _never)
    assert case.missing() == [] and case.skip_reason() is None


def test_the_corpus_lists_its_cases_and_packages_without_importing_them():
    ids = [c.id for c in FIELD]
    assert len(ids) == len(set(ids)) >= 8
    assert all(c.requires and c.package for c in FIELD)


def test_health_round_trips_through_run_meta():
    h = Health("validation accuracy", 0.1, 0.95, "after >= 0.9", True)
    assert Health(**h.as_meta()) == h
    assert str(h) == "validation accuracy 0.1 -> 0.95 (after >= 0.9: holds)"
