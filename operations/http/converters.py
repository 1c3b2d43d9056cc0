"""Path converters for the URL patterns of the API and the console.

``<count:name>`` takes the place of Django's ``<int:name>``, which accepts any number
of digits: a path like ``/attempts/99999999999999999999/outcome`` then reached the
database with an integer no column holds (SQLite refuses it outright) and answered 500.
"""

from django.urls import register_converter

from ..params import parse_count
from ..strictjson import MAX_SAFE_INTEGER

# Enough digits for every integer up to MAX_SAFE_INTEGER (16 digits), and no more.
_DIGITS = len(str(MAX_SAFE_INTEGER))


class CountConverter:
    """A non-negative integer of at most ±(2^53-1), the API's integer range; a path
    with a larger one matches no pattern, so it answers 404 like any unknown path."""

    regex = f"[0-9]{{1,{_DIGITS}}}"

    def to_python(self, value: str) -> int:
        number = parse_count(value, maximum=MAX_SAFE_INTEGER)
        if number is None:
            raise ValueError(f"{value} is beyond {MAX_SAFE_INTEGER}.")
        return number

    def to_url(self, value: int) -> str:
        return str(value)


def register() -> None:
    """Called once, from ``OperationsConfig.ready``, before any URL pattern is read."""
    register_converter(CountConverter, "count")
