"""The event vocabulary is declared once, in ``operations.machine.EventKind``.

Every writer names a kind by its member and every reader compares with members, so a
new kind cannot be written in one place and misspelt in another. The members equal
their strings: the stored kinds and the hash chains are what they were.
"""

import ast
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from operations import audit, services
from operations.machine import EventKind
from operations.models import Event

ROOT = Path(__file__).resolve().parents[2]

# The other vocabularies the code calls "kind", each word of which may stay a literal:
# an outcome a runner posts, a chart's shape, the JSON type of an argument shown or
# edited in the console, and the prefix of an actor's label.
OTHER_KINDS = {
    "outcome": {"succeeded", "failed", "unknown"},
    "chart": {"bars", "line", "hbars"},
    "argument": {"string", "integer", "number", "boolean", "json", "money", "datetime"},
    # How a value reads (operations.contracts.display formats).
    "display": {"text", "money", "cents", "datetime", "email", "url"},
    "actor": {"", "user", "runner"},
    # What a policy version does (PolicyVersion.kind, policies.cedar.Kind).
    "policy": {"forbid", "require", "permit"},
    # What Slack sent to the interactivity URL (its payload's ``type``).
    "slack": {"block_actions", "view_submission"},
}
NOT_EVENT_KINDS = set().union(*OTHER_KINDS.values())

# The modules that write events: the services, and the console's people's events.
WRITERS = (
    "operations/services",
    "console/accounts.py",
    "console/signals.py",
    "console/security.py",
    "console/sso.py",
    "console/slack.py",
)

# A golden event: its hash, computed with the string "granted" by the code before the
# vocabulary became an enum.
GOLDEN = {
    "stream": "op_golden",
    "seq": 3,
    "prev_hash": "ab" * 32,
    "from_status": "awaiting_approval",
    "to_status": "ready",
    "data": {"approval": "apr_1", "grant": "gr_1"},
    "now": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
}
GOLDEN_HASH = "270248e742f4174627a0ba9bd7d02d1432576b21ee998e6cf9e2267de0115d4c"


def _sources(*places: str) -> list[Path]:
    found: list[Path] = []
    for place in places:
        path = ROOT / place
        found += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [path for path in found if "migrations" not in path.parts]


def _trees(*places: str) -> Iterator[tuple[Path, ast.AST]]:
    for path in _sources(*places):
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _container(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Name) and call.func.id in {"frozenset", "set", "list", "tuple"}


def _literals(node: ast.AST) -> Iterator[ast.Constant]:
    """The string literals an expression may evaluate to: itself, the branches of a
    conditional, the items of a set, list or tuple (also through ``frozenset(...)``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, ast.IfExp):
        yield from _literals(node.body)
        yield from _literals(node.orelse)
    elif isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _literals(value)
    elif isinstance(node, ast.Set | ast.List | ast.Tuple):
        for item in node.elts:
            yield from _literals(item)
    elif isinstance(node, ast.Call) and _container(node):
        for argument in node.args:
            yield from _literals(argument)


def _about_kinds(node: ast.AST) -> bool:
    return "kind" in ast.unparse(node).lower()


def _kind_literals(tree: ast.AST) -> Iterator[ast.Constant]:
    """The string literals that stand for a kind: a ``kind=`` (``event_kind=``,
    ``kind__in=``...) argument, a ``"kind"`` entry of a dict, a value given to a name
    about kinds (``kind = ...``, ``SESSION_EVENT_KINDS = ...``), and the other side of a
    comparison with a kind (``e.kind in {...}``, ``row["first_kind"] != ...``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg and "kind" in node.arg:
            yield from _literals(node.value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value in {"kind", "event_kind"}:
                    yield from _literals(value)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and _about_kinds(target) for target in targets):
                yield from _literals(node.value)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_about_kinds(operand) for operand in operands):
                for operand in operands:
                    if not _about_kinds(operand):
                        yield from _literals(operand)


def test_the_scan_finds_kind_literals_in_every_position_it_reads():
    """The scan is the guard: it must see the forms the code used before."""
    source = """
record(op, kind="note")
transition(op, kind="a" if allow else "b", event_kind="c")
common = {"kind": "reconciled"}
kind = "breaker_opened"
SESSION_EVENT_KINDS = frozenset({"signed_in"})
if row["first_kind"] != "registered" or e.kind in {"probe"}:
    pass
Event.objects.filter(kind__in=["outcome"])
Chart(shape="bars", label=row["kind"])
"""
    found = sorted(literal.value for literal in _kind_literals(ast.parse(source)))
    assert found == [
        "a",
        "b",
        "breaker_opened",
        "c",
        "note",
        "outcome",
        "probe",
        "reconciled",
        "registered",
        "signed_in",
    ]


def test_no_event_kind_is_written_or_compared_as_a_string_literal():
    found = [
        f"{path.relative_to(ROOT)}:{literal.lineno}: {literal.value!r}"
        for path, tree in _trees("operations", "console")
        for literal in _kind_literals(tree)
        if literal.value not in NOT_EVENT_KINDS
    ]
    assert len(_sources("operations", "console")) > 100
    assert not found, (
        "name event kinds by their operations.machine.EventKind member (add one for a new "
        "kind), or add another vocabulary's word to OTHER_KINDS:\n  " + "\n  ".join(found)
    )


def _written_members() -> set[str]:
    """The members the writers pass to a call (``kind=EventKind.X``, positionally, or
    through a conditional), put in a dict of arguments (``common = {"kind": ...}``) or
    give to a name about kinds (``kind = EventKind.X if ... else EventKind.Y``)."""
    written: set[str] = set()

    def members(node: ast.AST) -> Iterator[str]:
        if isinstance(node, ast.IfExp):
            yield from members(node.body)
            yield from members(node.orelse)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "EventKind"
        ):
            yield node.attr

    for _path, tree in _trees(*WRITERS):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
                    written.update(members(argument))
            elif isinstance(node, ast.Dict):
                for value in node.values:
                    written.update(members(value))
            elif isinstance(node, ast.Assign) and any(map(_about_kinds, node.targets)):
                written.update(members(node.value))
    return written


def test_every_event_kind_is_written_somewhere():
    written = _written_members()
    assert {"REGISTERED", "BREAKER_FORCED_CLOSED", "TOOL_INVOKER_REMOVED"} <= written
    unknown = written - set(EventKind.__members__)
    assert not unknown, f"the writers name members EventKind does not have: {sorted(unknown)}"
    dead = sorted(set(EventKind.__members__) - written)
    assert not dead, f"no code writes these EventKind members; remove them: {dead}"


def test_an_event_kind_hashes_as_the_string_it_replaces():
    system = services.Actor("user:ada")
    by_member = services.core.event_build(
        kind=EventKind.GRANTED, actor=system, operation=None, **GOLDEN
    )
    by_string = services.core.event_build(kind="granted", actor=system, operation=None, **GOLDEN)
    assert by_member.hash == by_string.hash == GOLDEN_HASH


def test_an_event_written_with_a_member_is_stored_and_verified_as_its_string(db):
    written = services.event_append(
        stream="tool:kinds",
        kind=EventKind.BREAKER_FORCED_OPEN,
        actor=services.Actor.system("test"),
        tool_name="kinds",
        data={"state": "open"},
    )
    stored = Event.objects.get(pk=written.pk)
    assert type(stored.kind) is str
    assert stored.kind == "breaker_forced_open"
    assert Event.objects.filter(kind="breaker_forced_open").count() == 1
    assert services.event_hash(stored) == stored.hash == written.hash
    assert audit.chains_verify().ok


def test_a_lifecycle_written_with_members_keeps_every_hash_of_its_strings(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    done = api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert done["status"] == "succeeded"
    events = list(Event.objects.filter(stream=op["id"]).order_by("seq"))
    assert [event.kind for event in events] == ["registered", "claimed", "outcome"]
    for event in events:
        # The row as read back holds plain strings; its hash is the one written.
        assert type(event.kind) is str
        assert services.event_hash(event) == event.hash
    assert audit.chains_verify().ok
