"""The base of every domain error, and the approvals app's own refusals.

It lives in the lowest layer so both apps raise the same kind of error; the API's
exception handler and the console map any ``Refusal`` by its ``code`` and ``status``.
"""

from typing import Any


class Refusal(Exception):
    code = "invalid_request"
    status = 400
    title = "The request cannot be carried out"

    def __init__(self, detail: str | None = None, **extra: Any) -> None:
        self.detail = detail or self.title
        self.extra = extra
        super().__init__(self.detail)


class PermissionRefused(Refusal):
    """A person lacks the object permission for an action (console and admin)."""

    code, status, title = "forbidden", 403, "You may not do this"


class DecisionRefused(Refusal):
    """Separation of duties or a closed request refuses a decision."""

    code, status, title = "decision_refused", 409, "This decision is not allowed"
