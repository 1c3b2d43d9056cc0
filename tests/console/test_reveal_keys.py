"""Everything a person decides on is shown with hidden characters made visible: argument
keys, rule paths and values, the policy's reason, as well as the values (issue: a
review found keys that read ``/to`` three times)."""

from django.test import Client
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest
from operations.models import Tool
from tests.approvals.conftest import person
from tests.conftest import contract

KEYS = ["to", "t\u200bo", "\u202eot"]
SCHEMA = {
    "type": "object",
    "required": KEYS,
    "properties": {key: {"type": "string"} for key in KEYS},
    "additionalProperties": False,
}


def _pages(api) -> tuple[str, str]:
    rule = {"path": "/t\u200bo", "op": "eq", "value": "bob\u2066"}
    api.tool(
        "mail",
        contract("irreversible", input_schema=SCHEMA, approval={"mode": "rules", "rules": [rule]}),
    )
    op = api.register(api.run(), "mail", {"to": "a", "t\u200bo": "bob\u2066", "\u202eot": "c"})
    request = ApprovalRequest.objects.get(operation_id=op["id"])
    user = person()
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="mail"))
    client = Client()
    client.force_login(user)
    approval = client.get(f"/approvals/{request.id}/").content.decode()
    operation = client.get(f"/operations/{op['id']}/").content.decode()
    return approval, operation


def test_hidden_characters_in_argument_keys_are_revealed(api):
    approval, operation = _pages(api)
    for html in (approval, operation):
        # Only the keys hold these two characters; each is a visible marker.
        assert "\u27e8U+200B\u27e9</span>o" in html
        assert "\u27e8U+202E\u27e9</span>ot" in html
        assert "\u202e" not in html
        assert "\u200b" not in html


def test_rule_paths_and_values_are_revealed(api):
    approval, _ = _pages(api)
    assert "\u2066" not in approval
    assert "U+2066" in approval
