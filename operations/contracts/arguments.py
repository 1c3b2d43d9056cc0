"""Argument validation and freezing (docs/api.md, The intent hash).

1. Validate the arguments against the contract's JSON Schema (draft 2020-12), listing
   every error by JSON pointer. A message about a value that is, or contains, a
   sensitive field never repeats the value.
2. Freeze: replace every ``"x-sensitive": true`` value by
   ``"hmac-sha256:<key id>:<hex>"``, an HMAC over its canonical JSON keyed by a server
   secret. The frozen arguments are what is stored, hashed into the intent and shown.
3. The concurrency value: the digest of what the contract's ``concurrency_key`` points
   at in the frozen arguments, the resource an operation holds while its effect is
   unresolved.

Pure functions: the key is passed in.
"""

import copy
import hashlib
import hmac
from typing import Any

from approvals.policy import is_missing, json_equal, parse_pointer, resolve_pointer

from ..canonical import canonical_json
from ..errors import InvalidArguments
from .safety import MAX_STRING, TooComplex, bounded, validator_for
from .validation import sensitive_paths

SENSITIVE_PREFIX = "hmac-sha256:"


def _pointer(parts) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def _touches_secret(path: tuple, secrets: list[tuple[str, ...]]) -> bool:
    tokens = tuple(str(part) for part in path)
    for secret in secrets:
        shared = min(len(tokens), len(secret))
        if all(a == b or b == "*" for a, b in zip(tokens[:shared], secret[:shared], strict=True)):
            return True
    return False


def _long_string(arguments: Any) -> str | None:
    """The pointer of the first string (value or name) longer than MAX_STRING, if any."""
    stack: list[tuple[str, Any]] = [("", arguments)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, str) and len(node) > MAX_STRING:
            return pointer
        if isinstance(node, dict):
            for name, child in node.items():
                if len(name) > MAX_STRING:
                    return pointer
                stack.append((pointer + _pointer((name,)), child))
        elif isinstance(node, list):
            stack.extend((f"{pointer}/{i}", child) for i, child in enumerate(node))
    return None


def _schema_errors(schema: dict[str, Any], document: Any) -> list[Any]:
    """Every validation error, in path order, under the bounds of ``safety``."""
    long = _long_string(document)
    if long is not None:
        raise InvalidArguments(
            f"A string in the arguments is longer than {MAX_STRING} characters.",
            errors=[{"path": "/arguments" + long, "message": f"longer than {MAX_STRING}"}],
        )
    validator = validator_for(schema)
    try:
        return bounded(
            lambda: sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        )
    except TooComplex as exc:
        raise InvalidArguments(
            f"The arguments cannot be checked: {exc.reason}.",
            errors=[{"path": "/arguments", "message": exc.reason}],
        ) from None


def validate_arguments(schema: dict[str, Any], arguments: Any) -> None:
    secrets = sensitive_paths(schema)
    errors = []
    for error in _schema_errors(schema, arguments):
        if _touches_secret(tuple(error.absolute_path), secrets):
            message = f"failed the {error.validator!r} check (value not shown: sensitive)"
        else:
            message = error.message
        errors.append({"path": "/arguments" + _pointer(error.absolute_path), "message": message})
    if errors:
        raise InvalidArguments(f"{len(errors)} argument error(s); see errors.", errors=errors[:50])


def digest_sensitive(value: Any, *, key: str, key_id: str) -> str:
    mac = hmac.new(key.encode(), canonical_json(value), hashlib.sha256).hexdigest()
    return f"{SENSITIVE_PREFIX}{key_id}:{mac}"


def freeze_arguments(schema: dict[str, Any], arguments: Any, *, key: str, key_id: str) -> Any:
    """A deep copy of ``arguments`` with every sensitive value replaced by its digest."""
    frozen = copy.deepcopy(arguments)

    def replace(node: Any, path: tuple[str, ...]) -> Any:
        if not path:
            return digest_sensitive(node, key=key, key_id=key_id)
        head, rest = path[0], path[1:]
        if head == "*" and isinstance(node, list):
            return [replace(item, rest) for item in node]
        if isinstance(node, dict) and head in node:
            node[head] = replace(node[head], rest)
        return node

    for secret in sensitive_paths(schema):
        frozen = replace(frozen, secret)
    return frozen


def _under_secret(path: tuple, secrets: list[tuple[str, ...]]) -> bool:
    tokens = tuple(str(part) for part in path)
    return any(
        len(tokens) >= len(secret)
        and all(a == b or b == "*" for a, b in zip(tokens, secret, strict=False))
        for secret in secrets
    )


def validate_frozen(schema: dict[str, Any], frozen: Any) -> None:
    """Validate arguments that are already frozen (a person's edit of stored arguments):
    a sensitive value is a digest there, so checks of it or inside it are skipped; every
    other error is reported as ``validate_arguments`` does."""
    secrets = sensitive_paths(schema)
    errors = [
        {"path": "/arguments" + _pointer(error.absolute_path), "message": error.message}
        for error in _schema_errors(schema, frozen)
        if not _under_secret(tuple(error.absolute_path), secrets)
    ]
    if errors:
        raise InvalidArguments(f"{len(errors)} argument error(s); see errors.", errors=errors[:50])


def apply_edits(frozen: Any, edits: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """A copy of ``frozen`` with each JSON pointer of ``edits`` set to its value, and the
    list of changes (``{"path", "from", "to"}``, ``from`` null where the place was empty).
    An edit equal to the value already there (JSON equality) is no change."""
    edited = copy.deepcopy(frozen)
    changes = []
    for pointer, value in edits.items():
        before = resolve_pointer(edited, pointer)
        if not is_missing(before) and json_equal(before, value) and type(before) is type(value):
            continue
        tokens = parse_pointer(pointer)
        parent = edited
        try:
            for token in tokens[:-1]:
                parent = (
                    parent[int(token)] if isinstance(parent, list) else parent.setdefault(token, {})
                )
            if isinstance(parent, list):
                parent[int(tokens[-1])] = value
            else:
                parent[tokens[-1]] = value
        except (IndexError, ValueError, TypeError, AttributeError) as exc:
            raise InvalidArguments(
                f"{pointer} cannot be set in these arguments.",
                errors=[{"path": "/arguments" + pointer, "message": "no such place"}],
            ) from exc
        changes.append(
            {"path": pointer, "from": None if is_missing(before) else before, "to": value}
        )
    return edited, changes


def concurrency_value(contract: dict[str, Any], frozen: Any) -> str | None:
    """The sha256 hex of the canonical JSON of the value ``contract["concurrency_key"]``
    points at in ``frozen``, or None when the contract has no key or the arguments hold
    nothing there (then the operation blocks no resource)."""
    pointer = contract.get("concurrency_key")
    if not pointer:
        return None
    value = resolve_pointer(frozen, pointer)
    if is_missing(value):
        return None
    return hashlib.sha256(canonical_json(value)).hexdigest()
