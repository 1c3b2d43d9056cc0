"""The configuration of the MCP gateway (``effectgate-mcp --config FILE``), read with
``tomllib`` and checked strictly: an unknown or misspelt key is an error, never ignored,
because a block that silently means "no protection" is worse than one that refuses to
start. ``mcp_gateway`` documents the keys; ``load`` raises ``ConfigError`` with one line
that says what is wrong and where.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

EFFECT_CLASSES = ("read_only", "idempotent", "deduplicated", "compensable", "irreversible")
# The contract fields of PUT /tools/{name} (api.md) a tool block may set; Effectgate
# checks their content and answers invalid_contract with the paths that are wrong.
CONTRACT_KEYS = frozenset(
    {
        "effect_class",
        "input_schema",
        "description",
        "retry",
        "approval",
        "reconcile",
        "concurrency_key",
        "inbound",
        "display",
        "breaker",
    }
)
EFFECTGATE_KEYS = frozenset(
    {
        "url",
        "token_env",
        "principal",
        "principal_from",
        "session",
        "approval_wait_s",
        "upstream_timeout_s",
        "console_url",
        "default_effect_class",
        "lease_s",
        "budgets",
        "batch_window_ms",
    }
)
UPSTREAM_KEYS = frozenset({"name", "command", "url", "env", "cwd", "default_effect_class", "tools"})
BUDGET_KEYS = frozenset({"max_tool_calls", "max_turns", "deadline_s", "max_spend"})
PRINCIPAL_SOURCES = ("client_info",)


class ConfigError(Exception):
    """The configuration cannot be used; the message is one line for the operator."""


@dataclass(frozen=True)
class UpstreamConfig:
    """One upstream MCP server: spawned over stdio (``command``) or reached at ``url``."""

    name: str
    command: tuple[str, ...] | None = None
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    default_effect_class: str | None = None
    # Exposed tool name -> the contract block of the configuration (without input_schema
    # unless the configuration overrides the upstream's).
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """Where it is, for messages: the URL or the command's program."""
        return self.url or (self.command[0] if self.command else "?")


@dataclass(frozen=True)
class GatewayConfig:
    url: str
    upstreams: tuple[UpstreamConfig, ...]
    token_env: str = "EFFECTGATE_TOKEN"  # noqa: S105 (the name of a variable, not a secret)
    principal: str | None = None
    principal_from: str | None = None
    session: str | None = None
    approval_wait_s: float = 0.0
    upstream_timeout_s: float = 30.0
    console_url: str | None = None
    default_effect_class: str | None = None
    lease_s: int = 30
    budgets: dict[str, Any] = field(default_factory=dict)
    # How long the first registration or outcome of a run waits for concurrent ones to
    # share its batch request (_mcp_batch); those arriving while it is in flight go next.
    batch_window_ms: float = 2.0

    @property
    def console(self) -> str:
        """The console's base URL (approval links), without a trailing slash."""
        return (self.console_url or self.url).rstrip("/")


def _unknown(table: dict[str, Any], known: frozenset[str], where: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise ConfigError(
            f"{where}: unknown key {extra[0]!r} (known keys: {', '.join(sorted(known))})"
        )


def _string(value: Any, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise ConfigError(f"{where} must be a non-empty string")
    return value


def _http_url(value: Any, where: str) -> str:
    text = _string(value, where)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where} must be an http(s) URL, not {text!r}")
    return text


def _number(value: Any, where: str, *, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ConfigError(f"{where} must be a number")
    if value < minimum or (strict and value == minimum):
        bound = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
        raise ConfigError(f"{where} must be {bound}")
    return float(value)


def _effect_class(value: Any, where: str) -> str:
    if value not in EFFECT_CLASSES:
        raise ConfigError(f"{where} must be one of {', '.join(EFFECT_CLASSES)}, not {value!r}")
    return str(value)


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table")
    return value


def _tool_block(block: Any, where: str, default_effect_class: str | None) -> dict[str, Any]:
    block = dict(_table(block, where))
    _unknown(block, CONTRACT_KEYS, where)
    if "effect_class" in block:
        block["effect_class"] = _effect_class(block["effect_class"], f"{where}.effect_class")
    elif default_effect_class is not None:
        block["effect_class"] = default_effect_class
    else:
        raise ConfigError(f"{where}: effect_class is required (or a default_effect_class)")
    if "input_schema" in block:
        _table(block["input_schema"], f"{where}.input_schema")
    return block


def _upstream(raw: Any, index: int, default_effect_class: str | None) -> UpstreamConfig:
    where = f"[[upstream]] #{index + 1}"
    table = _table(raw, where)
    _unknown(table, UPSTREAM_KEYS, where)
    if "name" not in table:
        raise ConfigError(f"{where}: name is required")
    name = _string(table["name"], f"{where}.name")
    where = f"upstream {name!r}"
    command = url = None
    if ("command" in table) == ("url" in table):
        raise ConfigError(f"{where}: give exactly one of command (stdio) or url (streamable HTTP)")
    if "command" in table:
        value = table["command"]
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(part, str) and part for part in value)
        ):
            raise ConfigError(f"{where}.command must be a non-empty list of strings")
        command = tuple(value)
    else:
        url = _http_url(table["url"], f"{where}.url")
        if "env" in table or "cwd" in table:
            raise ConfigError(f"{where}: env and cwd apply to a command, not to a url")
    env = _table(table.get("env", {}), f"{where}.env")
    for key, value in env.items():
        if not isinstance(value, str):
            raise ConfigError(f"{where}.env.{key} must be a string")
    cwd = _string(table["cwd"], f"{where}.cwd") if "cwd" in table else None
    own_default = default_effect_class
    if "default_effect_class" in table:
        own_default = _effect_class(table["default_effect_class"], f"{where}.default_effect_class")
    tools = {
        tool: _tool_block(block, f"{where} tool {tool!r}", own_default)
        for tool, block in _table(table.get("tools", {}), f"{where}.tools").items()
    }
    return UpstreamConfig(
        name=name,
        command=command,
        url=url,
        env=dict(env),
        cwd=cwd,
        default_effect_class=own_default,
        tools=tools,
    )


def parse(data: dict[str, Any]) -> GatewayConfig:
    """A checked configuration from parsed TOML."""
    _unknown(data, frozenset({"effectgate", "upstream"}), "the configuration")
    if "effectgate" not in data:
        raise ConfigError("the [effectgate] table is missing")
    eg = _table(data["effectgate"], "[effectgate]")
    _unknown(eg, EFFECTGATE_KEYS, "[effectgate]")
    if "url" not in eg:
        raise ConfigError("[effectgate].url is required")
    url = _http_url(eg["url"], "[effectgate].url")
    principal = principal_from = None
    if ("principal" in eg) == ("principal_from" in eg):
        raise ConfigError("[effectgate]: give exactly one of principal or principal_from")
    if "principal" in eg:
        principal = _string(eg["principal"], "[effectgate].principal")
    else:
        principal_from = eg["principal_from"]
        if principal_from not in PRINCIPAL_SOURCES:
            raise ConfigError(
                f"[effectgate].principal_from must be one of {', '.join(PRINCIPAL_SOURCES)}"
            )
    default_effect_class = None
    if "default_effect_class" in eg:
        default_effect_class = _effect_class(
            eg["default_effect_class"], "[effectgate].default_effect_class"
        )
    lease_s = eg.get("lease_s", 30)
    if isinstance(lease_s, bool) or not isinstance(lease_s, int) or not 2 <= lease_s <= 3600:
        raise ConfigError("[effectgate].lease_s must be an integer from 2 to 3600")
    batch_window_ms = _number(
        eg.get("batch_window_ms", 2), "[effectgate].batch_window_ms", minimum=0
    )
    if batch_window_ms > 1000:
        raise ConfigError("[effectgate].batch_window_ms must be at most 1000")
    budgets = _table(eg.get("budgets", {}), "[effectgate].budgets")
    _unknown(budgets, BUDGET_KEYS, "[effectgate].budgets")
    raw_upstreams = data.get("upstream", [])
    if not isinstance(raw_upstreams, list) or not raw_upstreams:
        raise ConfigError("no upstream: add at least one [[upstream]] table")
    upstreams = tuple(
        _upstream(raw, index, default_effect_class) for index, raw in enumerate(raw_upstreams)
    )
    names = [upstream.name for upstream in upstreams]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"two [[upstream]] tables are named {name!r}")
    return GatewayConfig(
        url=url.rstrip("/"),
        upstreams=upstreams,
        token_env=_string(eg.get("token_env", "EFFECTGATE_TOKEN"), "[effectgate].token_env"),
        principal=principal,
        principal_from=principal_from,
        session=_string(eg["session"], "[effectgate].session") if "session" in eg else None,
        approval_wait_s=_number(
            eg.get("approval_wait_s", 0), "[effectgate].approval_wait_s", minimum=0
        ),
        upstream_timeout_s=_number(
            eg.get("upstream_timeout_s", 30),
            "[effectgate].upstream_timeout_s",
            minimum=0,
            strict=True,
        ),
        console_url=(
            _http_url(eg["console_url"], "[effectgate].console_url")
            if "console_url" in eg
            else None
        ),
        default_effect_class=default_effect_class,
        lease_s=lease_s,
        budgets=dict(budgets),
        batch_window_ms=batch_window_ms,
    )


def load(path: str | Path) -> GatewayConfig:
    """Read and check the TOML file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    return parse(data)
