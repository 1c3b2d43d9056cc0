"""Hostile values for path segments and query parameters, already percent-encoded.

Each is what a client can put in a URL: text PostgreSQL refuses (U+0000), bytes that
are not UTF-8 or encode a lone surrogate, integers no column or date holds, other
scripts' digits, line breaks, path tricks, very long text and percent-encodings that
decode to something else.
"""

from urllib.parse import quote


def _text(value: str) -> str:
    return quote(value, safe="")


# (label, encoded) pairs; the label names the case in a failure report.
HOSTILE: list[tuple[str, str]] = [
    ("NUL", _text("\x00")),
    ("NUL inside", _text("op_\x00x")),
    ("surrogate bytes", "%ED%A0%80"),  # U+D800 written as UTF-8 would be: not UTF-8
    ("escaped surrogate", _text("\\ud800")),  # the JSON escape, as text
    ("invalid UTF-8", "%FF%FE"),
    ("overlong UTF-8", "%C0%AF"),
    ("20 digits", "9" * 20),
    ("5,000 digits", "9" * 5000),
    ("2^53", str(2**53)),
    ("negative", "-1"),
    ("negative 20 digits", "-" + "9" * 20),
    ("1e300", "1e300"),
    ("NaN", "NaN"),
    ("superscript digits", _text("\u00b2\u00b3")),
    ("Arabic-Indic digits", _text("\u0661\u0662")),
    ("non-ASCII", _text("caf\u00e9 \u65e5\u672c \U0001f600")),
    ("bidi override", _text("\u202eabc")),
    ("newline", _text("nltool\n")),
    ("CRLF", _text("a\r\nb")),
    ("dot-dot-slash", _text("../../etc/passwd")),
    ("dot-dot", ".."),
    ("double-encoded NUL", "%2500"),
    ("lone percent", "%"),
    ("very long", "a" * 10_000),
    ("blank", _text(" ")),
    ("quote and markup", _text("'\"<script>x</script>")),
    ("SQL", _text("' OR 1=1--")),
    ("empty", ""),
]
