"""The suite's own collection: which modules ``-m`` deselects whole without importing them
(tests/support/collection.py, used by ``pytest_ignore_collect`` in tests/conftest.py)."""

import pytest

from tests.support.collection import deselected_whole, module_marks, never_selected

CHECK = "not slow and not browser"  # make check's expression
PATTERNS = ["test_*.py"]


def test_module_marks_are_read_from_a_single_mark_or_a_list():
    assert module_marks("import pytest\npytestmark = pytest.mark.slow\n") == {"slow"}
    source = "pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), other()]"
    assert module_marks(source) == {"slow", "django_db"}
    assert module_marks("def test_x():\n    pytestmark = pytest.mark.slow\n") == set()
    assert module_marks("x = 1\n") == set()


@pytest.mark.parametrize(
    ("expression", "marks", "never"),
    [
        (CHECK, {"slow"}, True),
        (CHECK, {"browser", "django_db"}, True),
        (CHECK, {"django_db"}, False),  # its tests are selected
        (CHECK, set(), False),
        ("slow", set(), False),  # a test of the module may be marked slow itself
        ("not slow", set(), False),
        ("slow or browser", {"slow"}, False),
        ("slow and not browser", {"slow"}, False),  # unless a test is also marked browser
        ("browser and not slow", {"slow"}, True),
        ("not (slow or browser)", {"browser"}, True),
        ('not slow(reason="x")', {"slow"}, False),  # arguments are not in the source's marks
    ],
)
def test_a_module_is_ruled_out_only_if_no_marks_of_its_tests_could_select_it(
    expression, marks, never
):
    assert never_selected(expression, frozenset(marks)) is never


def test_only_test_modules_with_a_ruling_pytestmark_are_left_uncollected(tmp_path):
    slow = tmp_path / "test_slow.py"
    slow.write_text("import pytest\n\npytestmark = pytest.mark.slow\n")
    fast = tmp_path / "test_fast.py"
    fast.write_text("import pytest\n\npytestmark = pytest.mark.django_db\n")
    helper = tmp_path / "helper.py"
    helper.write_text("import pytest\n\npytestmark = pytest.mark.slow\n")

    assert deselected_whole(slow, expression=CHECK, patterns=PATTERNS)
    assert not deselected_whole(slow, expression="", patterns=PATTERNS)  # no -m: all of it
    assert not deselected_whole(fast, expression=CHECK, patterns=PATTERNS)
    assert not deselected_whole(helper, expression=CHECK, patterns=PATTERNS)
    assert not deselected_whole(tmp_path, expression=CHECK, patterns=PATTERNS)
