"""Integers a client writes as text: in a path, a query parameter or a header (pure).

``int()`` reads any number of digits (and raises past 4300 of them), and
``str.isdigit()`` admits superscripts and other scripts' digits that ``int()`` refuses
or reads: a 20-digit count overflowed the arithmetic or the column it met, a 5,000-digit
one or a "²" raised, and either answered 500. Every such integer is read here instead:
plain ASCII digits, no more of them than the largest allowed value has, within bounds.
"""


def parse_count(text: str, *, maximum: int, minimum: int = 0) -> int | None:
    """``text`` as an integer from ``minimum`` to ``maximum`` (both at least 0), or
    None when it is anything else: empty, signed, not ASCII digits, or out of bounds."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(maximum)):
        return None
    value = int(text)
    return value if minimum <= value <= maximum else None
