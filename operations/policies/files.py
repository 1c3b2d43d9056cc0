"""A Cedar file an operator keeps in a repository, split into one text per policy.

Each statement becomes one policy, keeping the comments above it and its annotations;
a comment on the line of a statement's closing ``;`` stays with that statement. The
split is done by a small scanner that knows Cedar's string literals and ``//`` comments
(a ``;`` inside either ends nothing), and checked twice: Cedar itself counts the file's
statements, and every piece must parse to exactly one policy (``cedar.parse``).

Pure: text in, texts out, bounded before Cedar sees them.
"""

import json
from dataclasses import dataclass

import cedarpy

from . import cedar
from .errors import PolicyInvalid

MAX_FILE = 500_000
MAX_STATEMENTS = 200


@dataclass(frozen=True)
class Statement:
    """One policy of a file: its ``@id``, its text, and the line it starts on."""

    policy_id: str
    text: str
    line: int
    policy: cedar.Policy


def _pieces(text: str) -> tuple[list[tuple[int, int]], int]:
    """The (start, end) offsets of each statement, the ``;`` included, and where the
    text after the last one begins.

    1. Scan once, outside strings and comments, for the ``;`` that end statements.
    2. A comment after that ``;`` on the same line belongs to the statement it ends.
    """
    bounds = []
    start = 0
    index = 0
    length = len(text)
    while index < length:
        char = text[index]
        if char == '"':
            index += 1
            while index < length and text[index] != '"':
                index += 2 if text[index] == "\\" else 1
            index += 1
        elif text.startswith("//", index):
            end = text.find("\n", index)
            index = length if end == -1 else end
        elif char == ";":
            end = index + 1
            line_end = text.find("\n", end)
            line_end = length if line_end == -1 else line_end
            rest = text[end:line_end].strip()
            if not rest or rest.startswith("//"):
                end = line_end
            bounds.append((start, end))
            start = index = end
        else:
            index += 1
    return bounds, start


def _first_code_line(text: str, start: int, end: int) -> int:
    """The line number (from 1) where the statement in ``text[start:end]`` begins: its
    first line that is neither blank nor a comment."""
    offset = start
    for line in text[start:end].splitlines(keepends=True):
        stripped = line.strip()
        if stripped and not stripped.startswith("//"):
            break
        offset += len(line)
    return text.count("\n", 0, min(offset, end)) + 1


def _only_comments(text: str) -> bool:
    return all(not line.strip() or line.strip().startswith("//") for line in text.splitlines())


def split(text: str) -> list[Statement]:
    """The policies of a Cedar file, in order, or ``PolicyInvalid`` saying which
    statement is wrong (Cedar's message), or that two statements share an ``@id``."""
    if not isinstance(text, str) or len(text) > MAX_FILE or "\x00" in text:
        raise PolicyInvalid(f"A policy file is at most {MAX_FILE} characters, without NUL.")
    bounds, tail = _pieces(text)
    if not _only_comments(text[tail:]):
        line = text.count("\n", 0, tail) + 1
        raise PolicyInvalid(f"The statement starting near line {line} does not end with ';'.")
    if not bounds:
        raise PolicyInvalid("The file holds no policy statement.")
    if len(bounds) > MAX_STATEMENTS:
        raise PolicyInvalid(f"A policy file holds at most {MAX_STATEMENTS} statements.")
    statements: list[Statement] = []
    seen: dict[str, int] = {}
    for start, end in bounds:
        piece = text[start:end].strip()
        line = _first_code_line(text, start, end)
        try:
            policy = cedar.parse(piece)
        except PolicyInvalid as exc:
            raise PolicyInvalid(f"The statement at line {line}: {exc.detail}") from exc
        if policy.policy_id in seen:
            raise PolicyInvalid(
                f'@id("{policy.policy_id}") names two statements, at lines '
                f"{seen[policy.policy_id]} and {line}; each policy is one statement."
            )
        seen[policy.policy_id] = line
        statements.append(Statement(policy.policy_id, piece, line, policy))
    # Each piece is one statement; Cedar must count as many in the whole file, or the
    # scanner cut somewhere Cedar does not.
    try:
        counted = json.loads(cedarpy.policies_to_json_str(text))
    except (ValueError, RuntimeError) as exc:
        raise PolicyInvalid(f"Cedar cannot parse the file: {exc}") from exc
    found = len(counted.get("staticPolicies") or {}) + len(counted.get("templates") or {})
    if found != len(statements):
        raise PolicyInvalid(
            f"Cedar counts {found} statements in the file, the split {len(statements)}."
        )
    return statements
