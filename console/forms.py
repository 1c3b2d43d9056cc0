import json
from typing import Any

from django import forms

from approvals.errors import Refusal
from approvals.policy import is_missing, parse_pointer, resolve_pointer
from operations.contracts.paths import Unproven, locate
from operations.strictjson import loads_strict


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)


class RevokeForm(forms.Form):
    reason = forms.CharField(max_length=2000)


class ResolveForm(forms.Form):
    result = forms.ChoiceField(
        choices=[
            ("committed", "It happened (committed)"),
            ("not_found", "It did not happen"),
            ("still_unknown", "Still unknown: look again later"),
        ]
    )
    downstream_id = forms.CharField(required=False, max_length=255)
    note = forms.CharField(required=False, max_length=4000, widget=forms.Textarea)
    snooze_until = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M"],
        help_text="UTC",
    )


class NoteForm(forms.Form):
    note = forms.CharField(max_length=4000, widget=forms.Textarea)


class ConfirmForm(forms.Form):
    decision = forms.ChoiceField(choices=[("confirm", "Confirm"), ("dispute", "Dispute")])
    note = forms.CharField(required=False, max_length=4000, widget=forms.Textarea)


# --- edit before approve ------------------------------------------------------------------


def _kind(schema: dict[str, Any], pointer: str) -> str:
    """How a person types the value at ``pointer``: the JSON type the schema declares
    there when it is one simple type, else JSON text."""
    try:
        types = locate(schema, parse_pointer(pointer)).types
    except Unproven:
        return "json"
    simple = types - {"null"}
    if simple == {"integer"}:
        return "integer"
    if simple <= {"integer", "number"} and simple:
        return "number"
    if simple == {"boolean"}:
        return "boolean"
    if simple == {"string"}:
        return "string"
    return "json"


def editable_fields(op: Any) -> list[dict[str, Any]]:
    """The fields a person may change when approving ``op`` (contract
    ``approval.editable``), each with its input's name, label, kind and current text."""
    contract = op.tool_version.contract
    labels = (contract.get("display") or {}).get("fields", {})
    fields = []
    for index, pointer in enumerate(contract["approval"].get("editable", [])):
        kind = _kind(contract["input_schema"], pointer)
        value = resolve_pointer(op.arguments, pointer)
        if is_missing(value) or value is None:
            text = ""
        elif kind == "string":
            text = str(value)
            if "\n" in text or "\r" in text:
                kind = "json"  # a text input would drop the line breaks: edit it as JSON
                text = json.dumps(value, ensure_ascii=False)
        else:
            text = json.dumps(value, ensure_ascii=False)
        label = (labels.get(pointer) or {}).get("label") or pointer
        fields.append(
            {
                "name": f"edit-{index}",
                "pointer": pointer,
                "label": label,
                "kind": kind,
                "text": text,
            }
        )
    return fields


def parse_edits(op: Any, data: Any) -> dict[str, Any]:
    """The edits a decision form carries (only fields whose text changed), typed by the
    schema; ``ValueError`` with a sentence for the person when one cannot be read."""
    edits = {}
    for field in editable_fields(op):
        text = data.get(field["name"])
        if text is None or text == field["text"]:
            continue
        if field["kind"] != "string" and not text.strip():
            continue  # left empty (a missing value, or a boolean's "unchanged")
        kind = field["kind"]
        try:
            if kind == "string":
                value: Any = text
            elif kind == "integer":
                value = int(text.strip())
            elif kind == "boolean":
                value = {"true": True, "false": False}[text.strip()]
            else:
                # As strictly as a runner's body: no NaN, duplicate keys, U+0000 or
                # numbers the stored arguments could not give back as typed.
                value = loads_strict(text)
                if kind == "number" and (
                    isinstance(value, bool) or not isinstance(value, int | float)
                ):
                    raise ValueError
        except (ValueError, KeyError, Refusal) as exc:
            raise ValueError(f"{field['label']}: {text!r} is not a valid {kind}.") from exc
        edits[field["pointer"]] = value
    return edits
