"""The fenced code blocks of README.md and docs/, and how the doc tests read them.

A ``python``, ``sh`` or ``ts`` block runs in CI (tests/docs/test_examples.py) unless its
first line is ``# fragment: <why it cannot run alone>`` (``// fragment: ...`` in
TypeScript); a fragment is still checked for syntax. A block whose first line is
``# continues the block above`` (``// continues ...``) runs after the previous runnable
block of its language in the same file (and that one's predecessors; fragments between
them are skipped). A ``text output`` block right after a runnable one holds lines its
output must show, in order (``...`` stands for anything). A block with ``file=NAME`` in
its info string is a file the runnable examples of the same document find in their
working folder under that name (checked for syntax, not run).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
FRAGMENT = re.compile(r"^(?:#|//) fragment: (?P<why>\S.*)$")
CONTINUES = ("# continues the block above", "// continues the block above")
# The languages that run, and the interpreter family of each (TypeScript runs with tsx).
RUNNABLE = {
    "python": "python",
    "py": "python",
    "sh": "sh",
    "bash": "sh",
    "shell": "sh",
    "ts": "ts",
    "typescript": "ts",
}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str  # the info string's first word, lower-cased ("" for none)
    info: tuple[str, ...]  # the info string's other words
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        """``python``, ``sh`` or ``ts`` for blocks that run (or are fragments of code that
        would)."""
        return RUNNABLE.get(self.lang)

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0].strip()

    @property
    def fragment(self) -> str | None:
        """Why this block cannot run alone, if it says it cannot."""
        match = FRAGMENT.match(self.first_line)
        return match["why"] if match else None

    @property
    def continues(self) -> bool:
        return self.first_line in CONTINUES

    @property
    def file_name(self) -> str | None:
        """The name a ``file=NAME`` block is written under."""
        for word in self.info:
            if word.startswith("file="):
                return word.removeprefix("file=")
        return None

    @property
    def is_output(self) -> bool:
        return self.lang == "text" and "output" in self.info


def fenced_blocks(text: str, path: Path = ROOT / "-") -> list[Block]:
    """Every fenced code block; the content loses the opening fence's indentation
    (blocks inside list items)."""
    blocks = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, fence = match["indent"], match["fence"]
        info = match["info"].strip().lower().split()
        start, body = index + 1, []
        index += 1
        while index < len(lines):
            closing = lines[index].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        blocks.append(Block(path, start, info[0] if info else "", tuple(info[1:]), "\n".join(body)))
        index += 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in fenced_blocks(path.read_text("utf-8"), path)]
