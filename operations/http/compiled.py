"""Request validation compiled from the request serializers, for the hot endpoints.

A DRF serializer costs the hot path more than the checks it makes: each instance
deep-copies its declared fields, and each field runs a chain of methods. ``Compiled``
reads a serializer's fields once, at import, into plain checks: the JSON type each
takes (``serializers._JSON_TYPES``, what ``StrictSerializer`` enforces), the fields'
own validators (lengths, ranges, patterns, NUL and surrogates), choices, defaults,
nullability, nested serializers and the serializer's ``validate``.

The compiled checks only ever *accept*: a body they accept yields what the serializer's
``validated_data`` would be; any body they do not accept outright (a wrong type, an
unknown field, a string with surrounding blanks the serializer would trim) goes to the
serializer itself, which words the refusal, or accepts it. So the refusals are the
serializer's by construction, and the OpenAPI document, built from the same
serializers, describes what is accepted (tests/operations/test_lean_views.py holds the
two to each other on generated bodies).
"""

import math
from collections.abc import Callable
from typing import Any, cast

from django.core import validators as django_validators
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from .serializers import AnyJSON, JSONObject, StrictSerializer


class _Undecided(Exception):
    """The compiled checks do not accept the value outright: the serializer decides."""


Check = Callable[[Any], Any]

_KNOWN_VALIDATORS = (
    django_validators.MaxLengthValidator,
    django_validators.MinLengthValidator,
    django_validators.MaxValueValidator,
    django_validators.MinValueValidator,
    django_validators.RegexValidator,
    django_validators.ProhibitNullCharactersValidator,
    ProhibitSurrogateCharactersValidator,
)


def _validated(check: Check, field: serializers.Field) -> Check:
    found = list(field.validators)
    for validator in found:
        if not isinstance(validator, _KNOWN_VALIDATORS):
            raise TypeError(f"No compiled check for the validator {validator!r}.")
    if not found:
        return check

    def run(value: Any) -> Any:
        converted = check(value)
        for validator in found:
            try:
                cast(Any, validator)(converted)
            except Exception as refused:
                raise _Undecided from refused
        return converted

    return run


def _string(field: serializers.CharField) -> Check:
    allow_blank = field.allow_blank

    def check(value: Any) -> Any:
        if type(value) is not str or value.strip() != value or (not value and not allow_blank):
            raise _Undecided
        return value

    return check


def _integer(value: Any) -> Any:
    if type(value) is not int:
        raise _Undecided
    return value


def _number(value: Any) -> Any:
    if type(value) not in (int, float):
        raise _Undecided
    try:
        number = float(value)
    except OverflowError:
        raise _Undecided from None
    if not math.isfinite(number):
        raise _Undecided
    return number


def _boolean(value: Any) -> Any:
    if type(value) is not bool:
        raise _Undecided
    return value


def _object(value: Any) -> Any:
    if type(value) is not dict:
        raise _Undecided
    return value


def _any(value: Any) -> Any:
    return value


def _choice(field: serializers.ChoiceField) -> Check:
    allowed = frozenset(str(choice) for choice in field.choices)

    def check(value: Any) -> Any:
        if type(value) is not str or value not in allowed:
            raise _Undecided
        return value

    return check


def _field_check(field: serializers.Field) -> Check:
    if isinstance(field, StrictSerializer):
        return _fields_check(field)
    if isinstance(field, serializers.Serializer):
        raise TypeError(f"A nested serializer must be strict: {field!r}.")
    if isinstance(field, JSONObject):
        check: Check = _object
    elif isinstance(field, AnyJSON):
        check = _any
    elif isinstance(field, serializers.ChoiceField):
        check = _choice(field)
    elif isinstance(field, serializers.CharField):  # RegexField too: its validator
        check = _string(field)
    elif isinstance(field, serializers.BooleanField):
        check = _boolean
    elif isinstance(field, serializers.IntegerField):
        check = _integer
    elif isinstance(field, serializers.FloatField):
        check = _number
    else:
        raise TypeError(f"No compiled check for the field {field!r}.")
    return _validated(check, field)


def _fields_check(serializer: serializers.Serializer) -> Check:
    cls = type(serializer)
    fields = []
    for name, field in serializer.fields.items():
        if hasattr(cls, f"validate_{name}"):
            raise TypeError(f"{cls.__name__} validates {name} in a method: not compiled.")
        if field.read_only or field.source != name:
            raise TypeError(f"{cls.__name__}.{name}: only plain writable fields compile.")
        fields.append((name, _field_check(field), field.required, field.default, field.allow_null))
    names = frozenset(name for name, *_ in fields)
    validate = cls.validate if cls.validate is not serializers.Serializer.validate else None

    def check(data: Any) -> Any:
        if type(data) is not dict or not names.issuperset(data):
            raise _Undecided
        out: dict[str, Any] = {}
        for name, field_check, required, default, allow_null in fields:
            if name not in data:
                if required:
                    raise _Undecided
                if default is not empty:
                    out[name] = default() if callable(default) else default
                continue
            value = data[name]
            if value is None:
                if not allow_null:
                    raise _Undecided
                out[name] = None
            else:
                out[name] = field_check(value)
        if validate is not None:
            try:
                out = validate(serializer, out)
            except serializers.ValidationError:
                raise _Undecided from None
        return out

    return check


class Compiled:
    """``Compiled(OperationIn)(body)``: the body's validated data, as
    ``OperationIn(data=body).validated_data``, or the serializer's ``ValidationError``."""

    def __init__(self, serializer_class: type[StrictSerializer]) -> None:
        self.serializer_class = serializer_class
        self._check = _fields_check(serializer_class())

    def accepts(self, data: Any) -> dict[str, Any] | None:
        """The compiled checks alone: the validated data, or None when they leave the
        body to the serializer."""
        try:
            return self._check(data)
        except _Undecided:
            return None

    def __call__(self, data: Any) -> dict[str, Any]:
        accepted = self.accepts(data)
        if accepted is not None:
            return accepted
        serializer = self.serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)
