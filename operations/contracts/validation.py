"""Tool contracts: validation, defaults and sensitive fields (docs/api.md, Tools).

Pure functions over plain dicts; the services store what ``normalize_contract`` returns.
A normalized contract has every field filled in, so two contracts are the same version
exactly when their normalized forms are equal. One default is left out instead: an
approval rule's ``"when_missing": "match"``, so that the contracts stored before rules had
the key keep their hash, and a rule without it means "match" wherever it is read.
"""

import copy
import re
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from approvals.policy import OPERATORS, WHEN_MISSING, parse_pointer

from ..errors import InvalidContract
from ..machine import OUTCOME_CODE_PATTERN, EffectClass
from .paths import Unproven, format_pointer, locate
from .safety import schema_problems

APPROVAL_MODE_RANK = {"never": 0, "rules": 1, "always": 2}
DISPLAY_FORMATS = ("text", "money", "datetime", "email", "url")
# A placeholder of a display summary: a JSON pointer into the arguments, in braces.
DISPLAY_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
URL_PLACEHOLDERS = {"idempotency_key", "operation_id"}
# The host of a provider console link: a DNS name whose last label starts with a letter
# (so no address written as a number, 127.0.0.1 or 0x7f000001), and an optional port.
CONSOLE_URL_HOST = re.compile(r"(?:[a-z0-9-]{1,63}\.){0,30}[a-z][a-z0-9-]{0,62}\.?(?::[0-9]{1,5})?")
# A provider console link (reconcile.console_url): what support reads the effect by.
CONSOLE_URL_PLACEHOLDERS = {"downstream_id", "idempotency_key"}
CONSOLE_URL_MAX_LENGTH = 1000

_pointer = {"type": "string", "pattern": "^(/([^~/]|~[01])*)+$"}
_positive = {"type": "integer", "minimum": 1, "maximum": 10**9}
# Retryable and breaker codes are compared with outcome codes: only those can match.
_code = {"type": "string", "pattern": OUTCOME_CODE_PATTERN}

CONTRACT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["effect_class", "input_schema"],
    "additionalProperties": False,
    "properties": {
        "effect_class": {"enum": [cls.value for cls in EffectClass]},
        "input_schema": {"type": "object"},
        "description": {"type": "string", "maxLength": 2000},
        "retry": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": 100},
                "retryable_codes": {
                    "type": "array",
                    "items": _code,
                    "uniqueItems": True,
                    "maxItems": 50,
                },
                "base_delay_ms": {"type": "integer", "minimum": 0, "maximum": 86_400_000},
                "max_delay_ms": {"type": "integer", "minimum": 0, "maximum": 86_400_000},
                "deadline_s": {"anyOf": [_positive, {"type": "null"}]},
            },
        },
        "approval": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mode"],
            "properties": {
                "mode": {"enum": list(APPROVAL_MODE_RANK)},
                "rules": {
                    "type": "array",
                    "maxItems": 100,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["path", "op", "value"],
                        "properties": {
                            "path": _pointer,
                            "op": {"enum": sorted(OPERATORS)},
                            "value": {},
                            "when_missing": {"enum": list(WHEN_MISSING)},
                        },
                    },
                },
                "approvals_required": {"type": "integer", "minimum": 1, "maximum": 10},
                "request_ttl_s": _positive,
                "grant_ttl_s": _positive,
                # Fields a person may change when approving (a successor is registered).
                "editable": {
                    "type": "array",
                    "items": _pointer,
                    "uniqueItems": True,
                    "maxItems": 50,
                },
                # Offer a request still pending after this long to a group of people too.
                "escalate_after_s": _positive,
                "escalate_to": {"type": "string", "minLength": 1, "maxLength": 150},
            },
        },
        "reconcile": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mode"],
            "properties": {
                "mode": {"enum": ["manual", "lookup"]},
                "url": {"type": "string", "maxLength": 2000},
                "max_probes": {"type": "integer", "minimum": 1, "maximum": 1000},
                "console_url": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": CONSOLE_URL_MAX_LENGTH,
                },
            },
        },
        "concurrency_key": {"anyOf": [_pointer, {"type": "null"}]},
        "inbound": {
            "type": "object",
            "additionalProperties": False,
            "required": ["type"],
            "properties": {
                "idempotency_key": _pointer,
                "downstream_id": _pointer,
                "type": _pointer,
                "succeeded": {"type": "array", "items": {"type": "string"}, "maxItems": 50},
                "failed": {"type": "array", "items": {"type": "string"}, "maxItems": 50},
            },
        },
        "display": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "summary": {"type": "string", "minLength": 1, "maxLength": 500},
                "fields": {
                    "type": "object",
                    "maxProperties": 50,
                    "propertyNames": _pointer,
                    "additionalProperties": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "label": {"type": "string", "minLength": 1, "maxLength": 100},
                            "format": {"enum": list(DISPLAY_FORMATS)},
                            "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                            "minor_units": {"type": "boolean"},
                        },
                    },
                },
            },
        },
        "breaker": {
            "type": "object",
            "additionalProperties": False,
            "required": ["failure_codes"],
            "properties": {
                "failure_codes": {
                    "type": "array",
                    "items": _code,
                    "minItems": 1,
                    "uniqueItems": True,
                },
                "threshold": {"type": "integer", "minimum": 1, "maximum": 1000},
                "cooldown_s": {"type": "integer", "minimum": 1, "maximum": 86_400},
            },
        },
    },
}
_CONTRACT_VALIDATOR = Draft202012Validator(CONTRACT_SCHEMA)


def _error_path(parts) -> str:
    return "".join(f"/{part}" for part in parts)


def sensitive_paths(schema: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Pointer token tuples of every property marked ``"x-sensitive": true``.

    Array items are written as ``"*"``. Only ``properties`` and ``items`` are followed:
    a sensitive mark elsewhere (inside ``oneOf``, say) is refused by
    ``normalize_contract`` because its location in the arguments would be ambiguous.
    """
    found: list[tuple[str, ...]] = []
    if not isinstance(schema, dict):
        return found
    if schema.get("x-sensitive") is True:
        found.append(prefix)
        return found
    for name, child in (schema.get("properties") or {}).items():
        found.extend(sensitive_paths(child, (*prefix, name)))
    items = schema.get("items")
    if isinstance(items, dict):
        found.extend(sensitive_paths(items, (*prefix, "*")))
    return found


def _count_marks(value: Any) -> int:
    if isinstance(value, dict):
        own = 1 if value.get("x-sensitive") is True else 0
        return own + sum(_count_marks(child) for child in value.values())
    if isinstance(value, list):
        return sum(_count_marks(child) for child in value)
    return 0


def _overlaps(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether one path lies inside the other (``*`` matches any array index)."""
    return all(x == y or "*" in (x, y) for x, y in zip(a, b, strict=False))


def _placeholder_pattern(names: set[str]) -> re.Pattern[str]:
    return re.compile(r"\{(" + "|".join(sorted(names)) + r")\}")


URL_PLACEHOLDER = _placeholder_pattern(URL_PLACEHOLDERS)
CONSOLE_URL_PLACEHOLDER = _placeholder_pattern(CONSOLE_URL_PLACEHOLDERS)
# The schemes a template may have, as its refusal names them.
_SCHEMES = {"http(s)": ("http", "https"), "https": ("https",)}


def _template_problems(
    url: str, *, placeholder: re.Pattern[str], names: set[str], where: str, schemes: str
) -> list[dict[str, str]]:
    """Refuse a URL template that could expand into anything but a plain URL.

    Templates used to be filled with ``str.format``, which also reads format specs
    (``{idempotency_key:>100000}`` is a 100 kB URL), conversions and attribute or index
    access. Only the plain placeholders of ``names`` (which ``placeholder`` matches) are
    allowed, only in the path, query and fragment, and no other brace at all: a literal
    brace has no place in a URL. ``schemes`` is a key of ``_SCHEMES``.
    """

    def refuse(message: str) -> list[dict[str, str]]:
        return [{"path": where, "message": message}]

    bare = placeholder.sub("", url)
    if "{" in bare or "}" in bare:
        return refuse(
            "Only the placeholders "
            + ", ".join(f"{{{name}}}" for name in sorted(names))
            + " may be used, without format specs, conversions or other braces."
        )
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return refuse("A URL has no spaces or control characters.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - reading the port validates it
        httpx.URL(placeholder.sub("x", url))
    except (ValueError, httpx.InvalidURL) as exc:
        return refuse(f"Not a URL a browser or the lookup can open: {exc}.")
    if parts.scheme not in _SCHEMES[schemes] or not parts.hostname:
        return refuse(f"Must be an {schemes} URL with a host.")
    if "{" in parts.netloc:
        return refuse("Placeholders may be used in the path and query only.")
    return []


def url_template_problems(url: str) -> list[dict[str, str]]:
    """Refuse a lookup URL template (``reconcile.url``) that could expand into anything
    but a plain http(s) URL (``_template_problems``). ``probes.lookup_url`` checks again
    before filling, for versions stored before this check existed."""
    return _template_problems(
        url,
        placeholder=URL_PLACEHOLDER,
        names=URL_PLACEHOLDERS,
        where="/reconcile/url",
        schemes="http(s)",
    )


def console_url_problems(url: str) -> list[dict[str, str]]:
    """Refuse a provider console link template (``reconcile.console_url``) that is not a
    plain https link.

    Effectgate never fetches it: the console shows it to the people who reconcile, who
    open it in their own browser. So it must be https (no ``javascript:``, no plain
    http a network can rewrite) and written in ASCII, so that the host the console names
    is the host the browser opens (an international name in its ``xn--`` form, never a
    look-alike letter), with no user name or password in it (``https://pay.example.com@
    elsewhere.test/`` opens ``elsewhere.test``).
    """
    where = "/reconcile/console_url"
    if not url.isascii():
        return [
            {
                "path": where,
                "message": "Write the link in ASCII: percent-encode other characters and "
                "give an international host name in its xn-- form.",
            }
        ]
    problems = _template_problems(
        url,
        placeholder=CONSOLE_URL_PLACEHOLDER,
        names=CONSOLE_URL_PLACEHOLDERS,
        where=where,
        schemes="https",
    )
    if problems:
        return problems
    netloc = urlsplit(url).netloc
    if "@" in netloc:
        return [{"path": where, "message": "A link holds no user name or password."}]
    # The host as browsers read it is the host the console names: letters, digits,
    # hyphens and dots only (no %2e a browser decodes, no backslash it reads as a
    # slash), and a name, not a number (0x7f000001 opens 127.0.0.1).
    if "\\" in url or not CONSOLE_URL_HOST.fullmatch(netloc.lower()):
        return [
            {
                "path": where,
                "message": "Give the host as a plain name (letters, digits, hyphens and "
                "dots, an optional :port), with no backslash in the link.",
            }
        ]
    return []


def fill_url_template(template: str, placeholder: re.Pattern[str], values: dict[str, str]) -> str:
    """``template`` with each placeholder replaced by its value, percent-encoded (every
    character but letters, digits and ``_.-~``), never through ``str.format``. Check the
    template first (``url_template_problems``, ``console_url_problems``)."""
    return placeholder.sub(lambda match: quote(values[match[1]], safe=""), template)


def _unproven_places(
    schema: dict[str, Any], rules: list[dict[str, Any]], concurrency_key: str | None
) -> list[dict[str, str]]:
    """Rules, the concurrency key and sensitive marks on places the schema cannot prove.

    A rule on a place the schema does not declare would ask a person for every operation
    (an absent argument matches, ``approvals.policy.rule_matches``) or, with
    ``"when_missing": "skip"``, for none: a misspelt path, either way, and one the
    strength proof could not compare with a later version. So it is refused here rather
    than stored.
    """
    named = [(f"/approval/rules/{i}/path", rule["path"], False) for i, rule in enumerate(rules)]
    if concurrency_key:
        named.append(("/concurrency_key", concurrency_key, False))
    named.extend(("/input_schema", format_pointer(p), True) for p in sensitive_paths(schema))
    problems = []
    for error_path, pointer, wildcard in named:
        try:
            locate(schema, parse_pointer(pointer), wildcard=wildcard)
        except Unproven as exc:
            what = "the x-sensitive mark at " if wildcard else ""
            problems.append(
                {
                    "path": error_path,
                    "message": f"{what}{pointer} is not a place that input_schema provably "
                    f"declares: {exc}.",
                }
            )
    return problems


def _code_problems(body: dict[str, Any]) -> list[dict[str, str]]:
    """Codes the schema's pattern lets through although no outcome carries them: Python's
    ``$`` also matches before a final newline (``"rate_limited\\n"``)."""
    problems = []
    for block, field in (("retry", "retryable_codes"), ("breaker", "failure_codes")):
        for index, code in enumerate((body.get(block) or {}).get(field, [])):
            if not re.fullmatch(OUTCOME_CODE_PATTERN, code):
                problems.append(
                    {
                        "path": f"/{block}/{field}/{index}",
                        "message": f"{code!r} does not match {OUTCOME_CODE_PATTERN!r}",
                    }
                )
    return problems


def normalize_contract(body: Any) -> dict[str, Any]:
    """Validate a contract body and fill in its defaults, or raise InvalidContract."""
    errors = [
        {"path": _error_path(error.absolute_path), "message": error.message}
        for error in sorted(_CONTRACT_VALIDATOR.iter_errors(body), key=lambda e: e.path)
    ]
    errors = errors or _code_problems(body)
    if errors:
        raise InvalidContract("The contract does not match its schema.", errors=errors)

    schema = body["input_schema"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidContract(
            "input_schema is not a valid JSON Schema (draft 2020-12).",
            errors=[
                {"path": "/input_schema" + _error_path(exc.absolute_path), "message": exc.message}
            ],
        ) from exc
    unsafe = schema_problems(schema)
    if unsafe:
        raise InvalidContract("input_schema cannot be applied safely.", errors=unsafe[:50])
    if schema.get("type") != "object":
        raise InvalidContract(
            "input_schema must describe an object.",
            errors=[{"path": "/input_schema/type", "message": 'must be "object"'}],
        )
    secret_paths = sensitive_paths(schema)
    if len(secret_paths) != _count_marks(schema):
        raise InvalidContract(
            '"x-sensitive" may only mark schemas reached through properties and items.',
            errors=[{"path": "/input_schema", "message": "x-sensitive in an unsupported place"}],
        )

    effect_class = body["effect_class"]
    retry = {
        "max_attempts": 3,
        "retryable_codes": [],
        "base_delay_ms": 200,
        "max_delay_ms": 30_000,
        "deadline_s": None,
        **body.get("retry", {}),
    }
    retry["retryable_codes"] = sorted(retry["retryable_codes"])
    default_mode = "always" if effect_class == EffectClass.IRREVERSIBLE else "never"
    approval = {
        "mode": default_mode,
        "rules": [],
        "approvals_required": 1,
        "request_ttl_s": 86_400,
        "grant_ttl_s": 900,
        **body.get("approval", {}),
    }
    approval["rules"] = [_normalized_rule(rule) for rule in approval["rules"]]
    reconcile = {"mode": "manual", "url": None, "max_probes": 10, **body.get("reconcile", {})}

    problems: list[dict[str, str]] = []
    if retry["max_delay_ms"] < retry["base_delay_ms"]:
        problems.append({"path": "/retry/max_delay_ms", "message": "must be >= base_delay_ms"})
    if approval["mode"] == "rules" and not approval["rules"]:
        problems.append({"path": "/approval/rules", "message": 'mode "rules" needs rules'})
    if approval["mode"] != "rules" and approval["rules"]:
        problems.append({"path": "/approval/rules", "message": 'rules need mode "rules"'})
    problems.extend(_unproven_places(schema, approval["rules"], body.get("concurrency_key")))
    problems.extend(_approval_extra_problems(schema, approval, secret_paths))
    for index, rule in enumerate(approval["rules"]):
        tokens = parse_pointer(rule["path"])
        if any(_overlaps(tokens, secret) for secret in secret_paths):
            problems.append(
                {
                    "path": f"/approval/rules/{index}/path",
                    "message": "approval rules may not read a sensitive field",
                }
            )
        if rule["op"] == "in" and not isinstance(rule["value"], list):
            problems.append(
                {"path": f"/approval/rules/{index}/value", "message": '"in" needs an array'}
            )
    if reconcile["mode"] == "lookup":
        if not reconcile["url"]:
            problems.append({"path": "/reconcile/url", "message": "lookup needs a url"})
        else:
            problems.extend(url_template_problems(reconcile["url"]))
    elif reconcile["url"]:
        problems.append({"path": "/reconcile/url", "message": 'a url needs mode "lookup"'})
    if "console_url" in reconcile:
        problems.extend(console_url_problems(reconcile["console_url"]))
    inbound = body.get("inbound")
    if inbound is not None:
        if not (inbound.get("idempotency_key") or inbound.get("downstream_id")):
            problems.append(
                {
                    "path": "/inbound",
                    "message": "name idempotency_key or downstream_id to match events",
                }
            )
        inbound = {"succeeded": [], "failed": [], **inbound}
        if set(inbound["succeeded"]) & set(inbound["failed"]):
            problems.append({"path": "/inbound", "message": "a type cannot mean both outcomes"})
    problems.extend(_display_problems(body.get("display")))
    problems.extend(_hint_problems(schema))
    breaker = body.get("breaker")
    if breaker is not None:
        breaker = {"threshold": 5, "cooldown_s": 60, **breaker}
        breaker["failure_codes"] = sorted(breaker["failure_codes"])
    if problems:
        raise InvalidContract("The contract is not consistent.", errors=problems)

    normalized = {
        "effect_class": effect_class,
        "input_schema": copy.deepcopy(schema),
        "retry": retry,
        "approval": approval,
        "reconcile": reconcile,
        "concurrency_key": body.get("concurrency_key"),
        "inbound": inbound,
        "breaker": breaker,
    }
    if "description" in body:
        normalized["description"] = body["description"]
    if "display" in body:
        normalized["display"] = copy.deepcopy(body["display"])
    return normalized


def _normalized_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """The rule without its default ``"when_missing": "match"`` (module docstring)."""
    if rule.get("when_missing") == "match":
        return {key: value for key, value in rule.items() if key != "when_missing"}
    return dict(rule)


def _approval_extra_problems(
    schema: dict[str, Any], approval: dict[str, Any], secret_paths: list[tuple[str, ...]]
) -> list[dict[str, str]]:
    """Editable fields must be declared places that are not sensitive (a person edits
    what they can read); escalation needs both its time and its group."""
    problems = []
    for index, pointer in enumerate(approval.get("editable", [])):
        where = f"/approval/editable/{index}"
        tokens = parse_pointer(pointer)
        if any(_overlaps(tokens, secret) for secret in secret_paths):
            problems.append({"path": where, "message": "a sensitive field cannot be editable"})
            continue
        try:
            locate(schema, tokens)
        except Unproven as exc:
            problems.append({"path": where, "message": f"{pointer} is not declared: {exc}"})
    if ("escalate_after_s" in approval) != ("escalate_to" in approval):
        problems.append(
            {"path": "/approval", "message": "escalate_after_s and escalate_to go together"}
        )
    elif approval.get("escalate_after_s", 0) >= approval["request_ttl_s"]:
        problems.append(
            {
                "path": "/approval/escalate_after_s",
                "message": "must be shorter than request_ttl_s, or the request expires first",
            }
        )
    return problems


def _hint_problems(schema: Any, where: str = "/input_schema") -> list[dict[str, str]]:
    """The schema's display hints (``x-currency``, ``x-minor-units``; docs/api.md,
    Display) must say something the console can use: a hint it ignored would show an
    amount without its currency."""
    problems: list[dict[str, str]] = []
    if isinstance(schema, list):
        for index, child in enumerate(schema):
            problems.extend(_hint_problems(child, f"{where}/{index}"))
        return problems
    if not isinstance(schema, dict):
        return problems
    currency = schema.get("x-currency")
    if "x-currency" in schema and not (
        isinstance(currency, str) and re.fullmatch("[A-Z]{3}", currency)
    ):
        problems.append(
            {"path": where + "/x-currency", "message": "a currency is three capital letters"}
        )
    if "x-minor-units" in schema and not isinstance(schema["x-minor-units"], bool):
        problems.append({"path": where + "/x-minor-units", "message": "must be true or false"})
    for key, child in schema.items():
        token = str(key).replace("~", "~0").replace("/", "~1")
        if key == "properties" and isinstance(child, dict):
            # Every value is a schema, whatever its name ("enum" is a fine argument).
            for name, sub in child.items():
                name_token = str(name).replace("~", "~0").replace("/", "~1")
                problems.extend(_hint_problems(sub, f"{where}/properties/{name_token}"))
        elif isinstance(child, dict | list) and key not in ("enum", "const", "default", "examples"):
            problems.extend(_hint_problems(child, f"{where}/{token}"))
    return problems[:50]


def _display_problems(display: dict[str, Any] | None) -> list[dict[str, str]]:
    """Placeholders must be JSON pointers; money needs its currency."""
    if display is None:
        return []
    problems = []
    for placeholder in DISPLAY_PLACEHOLDER.findall(display.get("summary", "")):
        if not re.fullmatch(_pointer["pattern"], placeholder):
            problems.append(
                {
                    "path": "/display/summary",
                    "message": f"{{{placeholder}}} is not a JSON pointer such as {{/amount}}",
                }
            )
    for pointer, field in display.get("fields", {}).items():
        where = "/display/fields/" + pointer.replace("~", "~0").replace("/", "~1")
        if field.get("format") == "money" and "currency" not in field:
            problems.append(
                {"path": where, "message": 'format "money" needs a currency (ISO 4217, e.g. "EUR")'}
            )
        # The schema's pattern is checked with re.search, whose "$" admits a final newline.
        if "currency" in field and not re.fullmatch("[A-Z]{3}", field["currency"]):
            problems.append(
                {"path": where + "/currency", "message": "a currency is three capital letters"}
            )
    return problems
