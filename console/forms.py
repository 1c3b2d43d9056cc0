import json
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms

from approvals.errors import Refusal
from approvals.policy import is_missing, parse_pointer, resolve_pointer
from operations.contracts.paths import Unproven, locate
from operations.services import StandingTerms
from operations.strictjson import loads_strict
from operations.text import hidden_characters


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


# --- standing grants ---------------------------------------------------------------------

# The empty pin rows a form offers beside the ones it is pre-filled with, and the most
# rows one is read with (a grant holds at most 50 pins).
SPARE_PINS = 2
MAX_PIN_ROWS = 60
VALID_FOR_UNITS = {"minutes": 60, "hours": 3600, "days": 86400}


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def standing_form_initial(
    *, tool: str = "", op: Any = None, approvals_required: int | None = None
) -> dict[str, Any]:
    """What the standing grant form starts with: empty for a tool, or, from an approval
    page, ``op``'s principal and one ``eq`` pin per argument (edit them, clear a path to
    drop its pin). ``approvals_required`` None: left empty, the tool's quorum."""
    pins, unpinned = [], []
    if op is not None and isinstance(op.arguments, dict):
        for key, value in op.arguments.items():
            # An input cannot show a character that hides: such an argument is listed
            # (revealed) instead of pinned. Values are JSON, where they are escapes.
            if hidden_characters(key):
                unpinned.append(key)
                continue
            pins.append({"path": f"/{_pointer_token(key)}", "op": "eq", "text": json.dumps(value)})
    rows = [*pins, *({"path": "", "op": "eq", "text": ""} for _ in range(SPARE_PINS))]
    return {
        "unpinned": unpinned,
        "tool": op.tool_id if op is not None else tool,
        "principal": op.principal if op is not None else "",
        "run": op.run_id if op is not None else "",
        "pins": [{"index": index, **row} for index, row in enumerate(rows)],
        "max_uses": 10,
        "valid_for": 24,
        "valid_unit": "hours",
        "approvals_required": approvals_required,
        "units": list(VALID_FOR_UNITS),
    }


def _whole(data: Any, name: str, label: str, *, default: int | None = None) -> int | None:
    text = (data.get(name) or "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError as exc:
        raise ValueError(f"{label}: {text!r} is not a whole number.") from exc


def parse_standing_terms(data: Any, *, tool: str, now: datetime) -> StandingTerms:
    """The ``StandingTerms`` a standing grant form carries; ``ValueError`` with a
    sentence for the person when a field cannot be read. Whether the terms can be
    issued is the service's to say."""
    pins = []
    for index in range(MAX_PIN_ROWS):
        path = (data.get(f"pin-{index}-path") or "").strip()
        if not path:
            continue
        text = data.get(f"pin-{index}-value") or ""
        try:
            value = loads_strict(text)
        except (ValueError, Refusal) as exc:
            raise ValueError(
                f"Pin {path}: the value is JSON (a string in double quotes, a number, true, "
                'false, null, or for "one of" a list like ["EUR", "USD"]).'
            ) from exc
        pins.append({"path": path, "op": data.get(f"pin-{index}-op") or "eq", "value": value})
    max_uses = _whole(data, "max_uses", "Uses")
    if max_uses is None:
        raise ValueError("Say how many operations it may approve.")
    valid_for = _whole(data, "valid_for", "Valid for")
    unit = VALID_FOR_UNITS.get(data.get("valid_unit") or "", 0)
    if not valid_for or valid_for < 1 or not unit:
        raise ValueError("Say how long it is valid: a whole number of minutes, hours or days.")
    max_sum_text = (data.get("max_sum") or "").strip()
    try:
        max_sum = Decimal(max_sum_text) if max_sum_text else None
    except InvalidOperation as exc:
        raise ValueError(f"Maximum sum: {max_sum_text!r} is not a number.") from exc
    return StandingTerms(
        tool=tool,
        principal=(data.get("principal") or "").strip(),
        run_id=(data.get("run") or "").strip(),
        pins=pins,
        max_uses=max_uses,
        expires_at=now + timedelta(seconds=min(valid_for, 10**6) * unit),
        sum_path=(data.get("sum_path") or "").strip(),
        max_sum=max_sum,
        approvals_required=_whole(data, "approvals_required", "Signatures needed"),
    )
