"""Request ids: one per HTTP answer, in its ``X-Request-Id`` header, in the body of every
API problem (``request_id``) and in every log record written while the request runs.

A caller that sends its own ``X-Request-Id`` (a proxy's, a runner's trace id) gets it
back when it is a plain token (``VALID``: a letter or digit, then up to 127 letters,
digits or ``._:-``); anything else is replaced, never echoed, so that no header the
server writes and no log line carries text a caller chose beyond that alphabet. The
server's own ids are ``req_`` and 26 lowercase Crockford base32 characters: 48 bits of
milliseconds then 80 random bits, so ids sort by time like ULIDs.

Pure: no Django import. The middleware (``console.middleware.RequestIdMiddleware``) sets
the current id for the request; ``current()`` reads it anywhere below.
"""

import contextvars
import logging
import os
import re
import time

HEADER = "X-Request-Id"
META_KEY = "HTTP_X_REQUEST_ID"
# ``fullmatch``: ``$`` would let a final newline through.
VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# What a log record written outside any request carries.
NONE = "-"

_current: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)


def make() -> str:
    """A new id: ``req_`` and 26 characters (128 bits, time first)."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "req_" + "".join(reversed(chars))


def accept(sent: str | None) -> str:
    """The caller's id when it is valid, else a new one."""
    if sent and VALID.fullmatch(sent):
        return sent
    return make()


def current() -> str | None:
    """The id of the request being answered, or None outside a request."""
    return _current.get()


def bind(request_id: str) -> contextvars.Token[str | None]:
    return _current.set(request_id)


def unbind(token: contextvars.Token[str | None]) -> None:
    _current.reset(token)


class RequestIdFilter(logging.Filter):
    """Gives each record a ``request_id`` attribute (the current request's id, or ``-``)
    for the formatters: ``LOGGING`` in console/settings.py puts it on its handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _current.get() or NONE
        return True
