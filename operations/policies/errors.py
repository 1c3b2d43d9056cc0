"""The refusal of a policy text, with Cedar's own messages."""

from approvals.errors import Refusal


class PolicyInvalid(Refusal):
    code, status, title = "policy_invalid", 422, "The policy is not valid"

    def __init__(self, detail: str, problems: list[str] | None = None) -> None:
        super().__init__(detail, problems=problems or [detail])
        self.problems = problems or [detail]
