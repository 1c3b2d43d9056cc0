"""The docs, comments and docstrings refer to nothing outside the repository: a reader
finds each rule they cite in the code itself or in docs/."""

import re
from pathlib import Path

from tests.docs.blocks import ROOT, doc_files

# The places that hold code, and the kinds of file that carry comments.
SOURCE_DIRS = ("operations", "approvals", "console", "client", "bench", "tests", "deploy")
SUFFIXES = {".py", ".html", ".js", ".css", ".toml", ".cfg", ".ini", ".yml", ".yaml", ".sh"}
SKIPPED = {"__pycache__", "build", "node_modules", "staticfiles"}
OUTSIDE_REFERENCE = re.compile(r"\bof the design\b", re.IGNORECASE)
# A document named by its file name: it must be one of the repository's.
MARKDOWN_NAME = re.compile(r"(?<![\w/.-])(?:[\w.-]+/)*([\w-]+\.md)\b")


def _skipped(path: Path) -> bool:
    parts = set(path.relative_to(ROOT).parts)
    return bool(parts & (SKIPPED | {".venv", ".git"})) or any(
        part.endswith(".egg-info") for part in parts
    )


def test_markdown_names_are_read_whole():
    assert [m.group(1) for m in MARKDOWN_NAME.finditer("see docs/api.md and style.md.")] == [
        "api.md",
        "style.md",
    ]
    assert not list(MARKDOWN_NAME.finditer("https://x.example/a.mdx"))


def _source_files() -> list[Path]:
    found = [ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "manage.py"]
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = set(path.relative_to(ROOT).parts)
            if parts & SKIPPED or any(part.endswith(".egg-info") for part in parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES and path != Path(__file__):
                found.append(path)
    return found


def test_the_scan_reads_the_source():
    names = {path.relative_to(ROOT).as_posix() for path in _source_files()}
    assert {"operations/machine.py", "approvals/policy.py", "bench/harness.py"} <= names
    assert "client/effectgate_client/runner.py" in names
    assert not any("/build/" in name or "__pycache__" in name for name in names)


def _outside(line: str, documents: set[str]) -> bool:
    named = {match.group(1) for match in MARKDOWN_NAME.finditer(line)}
    return bool(OUTSIDE_REFERENCE.search(line) or named - documents)


def test_nothing_refers_to_a_document_outside_the_repository():
    documents = {path.name for path in ROOT.rglob("*.md") if not _skipped(path)}
    assert {"api.md", "README.md", "client.md"} <= documents
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*doc_files(), *_source_files()]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if _outside(line, documents)
    ]
    assert not found, (
        "these lines cite a document that is not in the repository (state the rule in a "
        "few words, or link to the section of docs/ that holds it):\n  " + "\n  ".join(found)
    )
