"""The code blocks of README.md and docs/ are tests: a doc that stops working fails CI.

Each runnable ``python``, ``sh`` and ``ts`` block (tests/docs/blocks.py says how blocks are
marked) runs as its own process against a live Effectgate on the test database
(PostgreSQL in CI) with one runner token for them all, as a newcomer pasting them one
after the other would, and a fake payment provider; it must exit 0 and show the lines of
the ``text output`` block that follows it. What a reader replaces is replaced here, and
nothing else (``PLACEHOLDERS``). The first blocks a newcomer pastes (the README's and the
clients' quick starts) also run twice against a server set up as `make run` sets it up:
its demo data, its demo token, no lookup host allowed, no provider but their own.
TypeScript runs with tsx in a folder where ``@effectgate/client`` resolves to
clients/typescript (tests/client_ts/support.py). Fragments are checked for syntax, TOML
and YAML blocks parse (JSON blocks: test_api_reference.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections import defaultdict
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import call_command

from bench.fake_provider import FakeProvider
from operations.models import Tool
from tests.client_ts.support import BIN, installed, source_workspace
from tests.conftest import make_runner
from tests.docs.blocks import ROOT, Block, all_blocks

BLOCKS = all_blocks()
FILES = [block for block in BLOCKS if block.file_name]
RUNNABLE = [
    block for block in BLOCKS if block.kind and block.fragment is None and not block.file_name
]
# Checked for syntax: fragments, and the python and sh files examples use.
FRAGMENTS = [
    block for block in BLOCKS if block.kind and (block.fragment is not None or block.file_name)
]

# Where a doc names a server, a token or a provider the reader has, the test has its own.
PLACEHOLDERS = {
    "http://127.0.0.1:8000": "effectgate",
    "https://effectgate.internal": "effectgate",
    "egr_...": "token",
    "http://payments.internal": "provider",
}
# Names a runnable example gives the tools it registers and the operations it asks for.
TOOL_NAMES = [
    re.compile(r"""put_tool\(\s*["']([\w.-]+)["']"""),
    re.compile(r"/tools/([\w.-]+)"),
    re.compile(r"""\btool=["']([\w.-]+)["']"""),
    re.compile(r""""tool":\s*"([\w.-]+)\""""),
    re.compile(r"""call_tool\(\s*["']([\w.-]+)["']"""),
    re.compile(r"""function_call\(\s*["']([\w.-]+)["']"""),
    re.compile(r"""putTool\(\s*["']([\w.-]+)["']"""),
    re.compile(r"""\btool:\s*["']([\w.-]+)["']"""),
]
OPERATION_KEYS = [
    re.compile(r"""operation_key=f?["']([^"'{]+)["']"""),
    re.compile(r""""operation_key":\s*"([^"]+)\""""),
    re.compile(r"""operationKey:\s*["']([^"'`]+)["']"""),
]


def _chain(block: Block) -> list[Block]:
    """The block with the blocks it continues (the runnable ones above it, fragments
    skipped), first to last."""
    chain = [block]
    while chain[0].continues:
        earlier = [
            other
            for other in RUNNABLE
            if other.path == block.path and other.kind == block.kind and other.line < chain[0].line
        ]
        assert earlier, f"{chain[0].where} continues a block, but none of its kind is above it"
        chain.insert(0, earlier[-1])
    return chain


def _expected_output(block: Block) -> list[str]:
    following = [other for other in BLOCKS if other.path == block.path and other.line > block.line]
    if following and following[0].is_output:
        return [line for line in following[0].text.splitlines() if line.strip()]
    return []


def _shows(output: str, expected: list[str]) -> str | None:
    """None when the output's lines hold the expected ones in order (``...`` matches any
    text, runs of spaces are one space); else the first expected line not found."""
    lines = iter(" ".join(line.split()) for line in output.splitlines())
    for wanted in expected:
        pattern = re.compile(
            ".*".join(re.escape(part) for part in " ".join(wanted.split()).split("...")) + "$"
        )
        if not any(pattern.match(line) for line in lines):
            return wanted
    return None


def _filled(text: str, values: dict[str, str]) -> str:
    for placeholder, what in PLACEHOLDERS.items():
        text = text.replace(placeholder, values[what])
    return text


def _own_names(patterns: list[re.Pattern[str]], block: Block) -> set[str]:
    text = block.text
    return {name for pattern in patterns for name in pattern.findall(text)}


def test_every_code_block_runs_or_says_why_not():
    """Counts what the doc tests cover; each runnable example names its own tools and
    operation keys (operation keys are per runner, tool names global: examples pasted
    one after another must not answer each other's operations)."""
    assert RUNNABLE, "no runnable example found: the block parser is broken"
    print(
        f"\n[doc examples] {len(RUNNABLE)} run against a live server, {len(FRAGMENTS)} "
        f"fragments and files checked for syntax, "
        f"{sum(block.lang == 'json' for block in BLOCKS)} JSON, "
        f"{sum(block.lang in ('toml', 'yaml') for block in BLOCKS)} TOML/YAML blocks parsed"
    )
    for block in FRAGMENTS:
        if block.fragment is not None:
            assert len(block.fragment) >= 10, f"{block.where}: say why it is a fragment"
    for kind, patterns in [("tool", TOOL_NAMES), ("operation key", OPERATION_KEYS)]:
        owners: dict[str, list[str]] = defaultdict(list)
        for block in RUNNABLE:
            # A block that continues another is the same example: its names are its
            # first block's.
            example = _chain(block)[0].where
            for name in _own_names(patterns, block):
                if example not in owners[name]:
                    owners[name].append(example)
        shared = {name: where for name, where in owners.items() if len(where) > 1}
        assert not shared, f"runnable examples share a {kind}: {shared}"


@pytest.mark.parametrize("block", FRAGMENTS, ids=lambda block: block.where)
def test_fragments_are_valid_syntax(block):
    if block.kind == "python":
        import ast

        ast.parse(block.text, filename=block.where)  # top-level await is allowed here
        return
    if block.kind == "ts":
        # esbuild (tsx's compiler) parses it as TypeScript and checks nothing else.
        command = [str(BIN / "esbuild"), "--loader=ts", "--log-level=error"]
        installed()
    else:
        command = ["bash", "-n"]
    done = subprocess.run(command, input=block.text, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{block.where}: {done.stderr}"


@pytest.mark.parametrize(
    "block", [b for b in BLOCKS if b.lang in ("toml", "yaml")], ids=lambda block: block.where
)
def test_configuration_blocks_parse(block):
    if block.lang == "toml":
        assert tomllib.loads(block.text), block.where
    else:
        assert yaml.safe_load(block.text), block.where


@pytest.fixture
def provider():
    with FakeProvider() as fake:
        yield fake


def _run_example(block: Block, values: dict[str, str], tmp_path: Path) -> str:
    """Run a runnable block (with the blocks it continues) as a reader pasting it would,
    its placeholders filled from ``values``; assert that it succeeds and shows its output
    block's lines, and return its standard output."""
    chain = _chain(block)
    source = "\n\n".join(link.text for link in chain)
    for file in [other for other in FILES if other.path == block.path]:
        (tmp_path / file.file_name).write_text(_filled(file.text, values))
    source = _filled(source, values)
    script = tmp_path / {"python": "example.py", "sh": "example.sh", "ts": "example.ts"}[block.kind]
    script.write_text(source)
    if block.kind == "python":
        command = [sys.executable, str(script)]
    elif block.kind == "ts":
        source_workspace(tmp_path)
        command = [str(BIN / "tsx"), str(script)]
    else:
        command = ["bash", "-euo", "pipefail", str(script)]  # a failing step fails the example
    env = {
        **{key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # The OpenAI Agents SDK would export traces to OpenAI: no network but PyPI here.
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = done.stdout + done.stderr
    print(f"\n[{block.where}] exit {done.returncode}\n{output[-3000:]}")
    assert done.returncode == 0, f"{block.where} failed:\n{output[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    missing = _shows(done.stdout, _expected_output(block))
    assert missing is None, (
        f"{block.where}: its output does not show {missing!r}:\n{done.stdout[-3000:]}"
    )
    return done.stdout


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.where)
def test_runnable_example(block, live_server, provider, settings, tmp_path):
    # The docs tell the reader to list the provider's host in RECONCILE_ALLOWED_HOSTS;
    # here the provider is on loopback.
    settings.RECONCILE_ALLOWED_HOSTS = ["127.0.0.1"]
    values = {"effectgate": live_server.url, "token": make_runner().token, "provider": provider.url}
    _run_example(block, values, tmp_path)


# What a newcomer pastes first, right after `make run`: the README's tour of the API and
# the clients' quick starts (Python, TypeScript), each its document's first runnable block.
FIRST_PASTED = [
    next(block for block in RUNNABLE if block.path == path)
    for path in (
        ROOT / "README.md",
        ROOT / "docs" / "client.md",
        ROOT / "docs" / "client-typescript.md",
    )
]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("block", FIRST_PASTED, ids=lambda block: block.where)
def test_the_first_examples_run_against_what_make_run_sets_up(
    block, live_server, settings, tmp_path
):
    """Pasted after `make run`, as it stands: the server has the demo data (whose runner
    owns send_refund and the other demo tools), the token is the demo runner's, no
    lookup host is allowed, and no provider is there but what the example starts. Pasted
    a second time, it answers the same (operation keys replay, nothing runs twice)."""
    settings.RECONCILE_ALLOWED_HOSTS = []  # make run sets none
    printed = StringIO()
    call_command("bootstrap_local", stdout=printed)
    token = re.search(r"^Demo runner token \(shown once\): (\S+)$", printed.getvalue(), re.M)
    assert token, printed.getvalue()
    call_command("seed_demo", stdout=StringIO())
    assert Tool.objects.filter(pk="send_refund").exclude(owner__name="demo").exists()
    # Nothing stands in for a provider the reader has: the example must bring its own.
    values = {
        "effectgate": live_server.url,
        "token": token[1],
        "provider": "http://payments.internal",
    }

    first = _run_example(block, values, tmp_path)
    again = _run_example(block, values, tmp_path)

    assert again == first


def test_output_matching():
    output = "a\n{'status': 'succeeded', 'id': 'op_12'}\nb  c\n"
    assert _shows(output, ["{'status': 'succeeded', 'id': 'op_...'}", "b c"]) is None
    assert _shows(output, ["b c", "{'status': ...}"]) == "{'status': ...}"  # order counts
    assert _shows(output, ["failed"]) == "failed"
    assert ROOT.is_dir()
