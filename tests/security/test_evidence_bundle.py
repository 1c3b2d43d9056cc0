"""Evidence bundles, verified offline: ``audit export`` writes one operation's rows, its
events with their inclusion proofs and the signed checkpoint; the client's
``effectgate-verify``, run as a process with only the public key, checks it all and says
what it proves. A byte changed anywhere fails, named; a checkpoint a webhook subscriber
kept catches a rewrite that the database, re-sealed and re-signed, no longer shows.

The forger has the database owner's rights (the append-only triggers ignored, as in
test_audit_log.py) but not the signing key.
"""

import base64
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.core.management import CommandError, call_command
from django.utils import timezone
from guardian.shortcuts import assign_perm
from standardwebhooks import Webhook

from approvals.models import Decision
from effectgate_client.evidence import checks, load_bundle, verify_bundle
from effectgate_client.evidence.notes import load_public_key
from operations import services
from operations.dbroles import as_owner
from operations.dispatch import webhooks
from operations.models import Checkpoint, Event, LogLeaf, LogNode, Operation, Tool
from operations.payloads import iso
from operations.triggers import ignored, trigger_uris
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support.audit_log import unsealed
from tests.support.receiver import Receiver

from .conftest import audit_verify, postgresql_only

# The console script the client distribution installs beside this interpreter.
VERIFY = Path(sys.executable).with_name("effectgate-verify")
ARGUMENTS = {"payment_id": "pay_8412", "amount_cents": 48_000}


# --- The lifecycle, sealed and exported ---------------------------------------------------


def _lifecycle(api) -> dict[str, Any]:
    """A refund that needs a person's approval: approved, claimed, its outcome unknown
    (the provider's answer lost after sending), then reconciled by support with
    evidence: what a dispute asks about."""
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={"mode": "always"},
            retry={"max_attempts": 3, "retryable_codes": ["rate_limited"]},
        ),
    )
    approver = person(username="ann.approver", decide_on="refund")
    reconciler = person(username="sam.support")
    assign_perm("operations.reconcile_tool", reconciler, Tool.objects.get(pk="refund"))
    op = api.register(api.run(principal="user:dana"), "refund", arguments=ARGUMENTS)
    assert op["status"] == "awaiting_approval"
    services.approval_decide(
        request_id=op["approval"]["id"],
        user=approver,
        approve=True,
        comment="Duplicate charge confirmed with the customer",
    )
    api.claim(op["id"])
    api.outcome(
        op["id"],
        1,
        {"kind": "unknown", "code": "timeout_unknown", "detail": "read timeout after send"},
    )
    services.operation_resolve(
        operation=Operation.objects.get(pk=op["id"]),
        user=reconciler,
        result="committed",
        downstream_id="re_3Pq9",
        note="Refund re_3Pq9 listed in the provider's dashboard",
    )
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"
    return op


def _seal(timeout_s: float = 120) -> list[str]:
    """``audit seal`` until every event is in a signed checkpoint; what it printed. On
    PostgreSQL the sealer leaves events of transactions younger than any still open on
    the server for a later pass (services/seal.py), so it is run again until then."""
    said, deadline = [], time.monotonic() + timeout_s
    while True:
        out = StringIO()
        call_command("audit", "seal", stdout=out)
        said.append(out.getvalue())
        if not unsealed():
            return said
        assert time.monotonic() < deadline, f"still unsealed: {unsealed()}"
        time.sleep(0.05)


def _export(op_id: str, path: Path, *sizes: int) -> str:
    out = StringIO()
    args = [arg for size in sizes for arg in ("--witness-size", str(size))]
    call_command("audit", "export", op_id, "--to", str(path), *args, stdout=out)
    return out.getvalue()


def _public_key(tmp_path: Path, audit_key) -> Path:
    """The public key alone, as /.well-known/effectgate-audit-key serves it."""
    path = tmp_path / "effectgate-audit.pub.pem"
    path.write_bytes(
        audit_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return path


def _run_verifier(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """The real console script, in a folder of its own, with an environment that holds
    no Django setting, database or network address."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    return subprocess.run(
        [str(VERIFY), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def exported(api, audit_key, tmp_path) -> dict[str, Any]:
    op = _lifecycle(api)
    _seal()
    bundle_path = tmp_path / "evidence.json"
    said = _export(op["id"], bundle_path)
    return {
        "op": Operation.objects.get(pk=op["id"]),
        "path": bundle_path,
        "key": _public_key(tmp_path, audit_key),
        "said": said,
        "bundle": json.loads(bundle_path.read_text(encoding="utf-8")),
    }


def test_a_bundle_verifies_offline_with_the_public_key_alone_and_says_what_it_proves(
    exported, tmp_path
):
    op = exported["op"]
    size = exported["path"].stat().st_size
    assert f"Wrote {exported['path']}: " in exported["said"]
    assert f"({size} bytes)" in exported["said"]
    # The size of a typical bundle (docs/security.md quotes it).
    events = len(exported["bundle"]["events"])
    print(f"\nEvidence bundle of a typical operation ({events} events): {size} bytes")
    assert size < 64 * 1024

    done = _run_verifier(tmp_path, str(exported["path"]), "--key", str(exported["key"]))
    assert done.returncode == 0, done.stdout + done.stderr
    story = done.stdout
    print(story)
    checkpoint = Checkpoint.objects.order_by("size").last()
    assert f"Verified: the 7 events of operation {op.id}" in story
    assert f"checkpoint of {checkpoint.size} entries" in story
    # Who approved which exact arguments, when.
    decision = Event.objects.get(stream=op.id, kind="decision")
    assert '{"amount_cents": 48000, "payment_id": "pay_8412"}' in story
    assert op.intent_hash in story
    assert f"{iso(decision.at)}  user:ann.approver APPROVED" in story
    assert '"Duplicate charge confirmed with the customer"' in story
    assert "on behalf of user:dana" in story
    assert "bound to this operation's intent" in story
    # What was attempted with which idempotency key, and what the provider answered.
    assert (
        f"claimed attempt 1, to call the provider with idempotency key {op.idempotency_key}"
        in story
    )
    assert "reported attempt 1: unknown, code timeout_unknown" in story
    assert '"read timeout after send"' in story
    # Who reconciled it, on what evidence.
    assert "user:sam.support answered: committed, downstream reference re_3Pq9" in story
    assert "Refund re_3Pq9 listed in the provider's dashboard" in story
    assert "Where it stands: succeeded" in story
    assert "Not proven" not in story
    assert done.stderr == ""


def test_a_bundle_is_refused_until_every_event_is_in_a_signed_checkpoint(api, audit_key, tmp_path):
    op = _lifecycle(api)
    with pytest.raises(CommandError, match="not in a signed checkpoint yet") as refused:
        _export(op["id"], tmp_path / "early.json")
    assert "effectgate audit seal" in str(refused.value)
    assert not (tmp_path / "early.json").exists()
    _seal()
    services.operation_note_add(
        operation=Operation.objects.get(pk=op["id"]),
        user=person(is_superuser=True),
        note="One more event, not sealed yet",
    )
    with pytest.raises(CommandError, match=r"1 events of op_\w+ are not in a signed checkpoint"):
        _export(op["id"], tmp_path / "late.json")
    with pytest.raises(CommandError, match="No operation 'op_nope'"):
        _export("op_nope", tmp_path / "none.json")


# --- A byte changed anywhere ---------------------------------------------------------------


def _flip(value: Any) -> Any:
    """The value with one byte changed: a character of a string (a bit of a base64 hash's
    decoded bytes), an integer plus one, a boolean negated."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        try:
            raw = base64.b64decode(value, validate=True)
        except ValueError:
            raw = b""
        if len(raw) == 32:
            return base64.b64encode(bytes([raw[0] ^ 1]) + raw[1:]).decode()
        if not value:
            return "x"
        middle = len(value) // 2
        char = value[middle]
        swapped = {"0": "1", "1": "2", "9": "8", "Z": "Y", "-": "_", ":": ";", ".": ","}
        return value[:middle] + swapped.get(char, chr(ord(char) ^ 1)) + value[middle + 1 :]
    raise TypeError(value)


def _first_leaf(value: Any) -> list[Any]:
    """The path to the first string or number inside ``value``, depth first."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for step, inner in items:
        if isinstance(inner, (dict, list)):
            found = _first_leaf(inner)
            if found:
                return [step, *found]
        elif inner is not None:
            return [step]
    return []


def _changed(bundle: dict[str, Any], path: list[Any], change: Callable[[Any], Any] = _flip):
    changed = copy.deepcopy(bundle)
    holder = changed
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = change(holder[path[-1]])
    return changed


def _failures(bundle: dict[str, Any], key_path: Path, **kwargs: Any) -> list[str]:
    key = load_public_key(key_path.read_bytes())
    return [str(f) for f in verify_bundle(bundle, key=key, **kwargs).failures]


def _mutations(bundle: dict[str, Any]) -> list[tuple[str, list[Any], str]]:
    """(what, where in the bundle, what the failures must name) for a change of one byte
    in each field of each event, the proofs, the checkpoint and the rows."""
    cases: list[tuple[str, list[Any], str]] = []
    for position, event in enumerate(bundle["events"]):
        named = f"(id {event['id']}, leaf {event['leaf_index']})"
        for name in ("stream", "seq", "kind", "from", "to", "actor", "at", "prev", "hash"):
            if event[name] == "" and name == "from":
                continue
            cases.append((f"event {position + 1} {name}", ["events", position, name], named))
        data = _first_leaf(event["data"])
        cases.append((f"event {position + 1} data", ["events", position, "data", *data], named))
        cases.append(
            (
                f"event {position + 1} id",
                ["events", position, "id"],
                f"(id {event['id'] + 1}, leaf {event['leaf_index']}): its inclusion proof",
            )
        )
        cases.append(
            (
                f"event {position + 1} leaf index",
                ["events", position, "leaf_index"],
                f"(id {event['id']}, leaf {event['leaf_index'] + 1}): its inclusion proof",
            )
        )
        for step in range(len(event["inclusion"])):
            cases.append(
                (
                    f"event {position + 1} proof hash {step}",
                    ["events", position, "inclusion", step],
                    f"{named}: its inclusion proof does not lead",
                )
            )
    related = bundle["related_events"][0]
    cases.append(
        (
            "the contract event's data",
            ["related_events", 0, "data", "contract_hash"],
            f"(id {related['id']}, leaf {related['leaf_index']})",
        )
    )
    cases += [
        ("the checkpoint's root", ["checkpoint", "root"], "the checkpoint's field 'root'"),
        ("the checkpoint's size", ["checkpoint", "size"], "the checkpoint's field 'size'"),
        ("the checkpoint's time", ["checkpoint", "time"], "the checkpoint's field 'time'"),
        ("the origin", ["origin"], "the checkpoint's signed note"),
        ("the checkpoint's origin", ["checkpoint", "origin"], "the checkpoint's field 'origin'"),
    ]
    op_id = bundle["operation"]["id"]
    approval = bundle["approvals"][0]["id"]
    grant = bundle["grants"][0]["id"]
    rows = [
        (["operation", "arguments", "amount_cents"], f"the operation {op_id}, field 'arguments'"),
        (["operation", "arguments", "payment_id"], f"the operation {op_id}, field 'arguments'"),
        (["operation", "principal"], f"the operation {op_id}, field 'arguments' or 'principal'"),
        (["operation", "idempotency_key"], "field 'idempotency_key'"),
        (["operation", "intent_hash"], "field 'intent_hash'"),
        (["operation", "tool"], "field 'tool'"),
        (["operation", "tool_version"], "field 'tool_version'"),
        (["operation", "operation_key"], "field 'operation_key'"),
        (["operation", "effect_class"], "field 'effect_class'"),
        (["operation", "status"], "field 'status'"),
        (["operation", "attempts"], "field 'attempts'"),
        (["contract", "contract", "approval", "mode"], "the contract version, field 'contract'"),
        (["contract", "contract_hash"], "the contract version"),
        (["attempts", 0, "status"], "attempt 1, field 'status'"),
        (["attempts", 0, "claimed_at"], "attempt 1, field 'claimed_at'"),
        (["attempts", 0, "closed_at"], "attempt 1, field 'closed_at'"),
        (["attempts", 0, "outcome", "code"], "attempt 1, field 'outcome'"),
        (["attempts", 0, "outcome", "detail"], "attempt 1, field 'outcome'"),
        (["approvals", 0, "status"], f"approval request {approval}, field 'status'"),
        (["approvals", 0, "reason"], f"approval request {approval}, field 'reason'"),
        (["approvals", 0, "terms", "approvals_required"], "field 'terms'"),
        (["approvals", 0, "terms", "expires_at"], "field 'terms'"),
        (["approvals", 0, "decisions", 0, "user"], "decision 1, field 'user'"),
        (["approvals", 0, "decisions", 0, "decision"], "decision 1, field 'decision'"),
        (["approvals", 0, "decisions", 0, "comment"], "decision 1, field 'comment'"),
        (["approvals", 0, "decisions", 0, "at"], "decision 1, field 'at'"),
        (["grants", 0, "intent_hash"], f"grant {grant}, field 'intent_hash'"),
        (["grants", 0, "expires_at"], f"grant {grant}, field 'expires_at'"),
        (["grants", 0, "approval"], f"grant {grant}, field 'approval'"),
    ]
    cases += [(f"row {'.'.join(map(str, path))}", path, named) for path, named in rows]
    return cases


def test_a_byte_changed_in_any_field_fails_and_the_failure_names_it(exported):
    bundle, key = exported["bundle"], exported["key"]
    assert _failures(bundle, key) == []
    missed = []
    # Each character of the signed note's signature line, and of its text.
    note = bundle["checkpoint"]["note"]
    for at in range(len(note)):
        if note[at] == "\n":
            continue
        changed = copy.deepcopy(bundle)
        changed["checkpoint"]["note"] = note[:at] + _flip(note[at]) + note[at + 1 :]
        failures = _failures(changed, key)
        if not any("the checkpoint's signed note" in failure for failure in failures):
            missed.append((f"note character {at}", failures))
    for what, path, named in _mutations(bundle):
        failures = _failures(_changed(bundle, path), key)
        if not failures or not any(named in failure for failure in failures):
            missed.append((what, named, failures))
    assert missed == [], missed


def test_a_changed_note_removed_event_or_added_field_fails(exported):
    bundle, key = exported["bundle"], exported["key"]
    note = bundle["checkpoint"]["note"]
    text, _, signature = note.rpartition("\n\n")
    origin, size, root, rest = text.split("\n", 3)
    cases = {
        # The signed root, with the field beside it changed to match.
        "root in the note": (
            {
                **bundle["checkpoint"],
                "note": "\n".join([origin, size, _flip(root), rest]) + "\n\n" + signature,
            }
            | {"root": _flip(root)},
            "the checkpoint's signed note: the signature of",
        ),
        "no signature": (
            {**bundle["checkpoint"], "note": text + "\n\n"},
            "the checkpoint's signed note",
        ),
    }
    for what, (checkpoint, named) in cases.items():
        failures = _failures({**bundle, "checkpoint": checkpoint}, key)
        assert any(named in f for f in failures), (what, failures)
    # The last event left out: the operation's status is not where its events leave it.
    failures = _failures({**bundle, "events": bundle["events"][:-1]}, key)
    assert any("field 'status'" in f for f in failures), failures
    # The first left out: the chain does not start at seq 1.
    failures = _failures({**bundle, "events": bundle["events"][1:]}, key)
    assert any("its prev is not 64 zeros" in f for f in failures), failures
    # A request or a grant hidden: the events that opened or gave it name it.
    failures = _failures({**bundle, "approvals": []}, key)
    assert any("which the bundle lacks" in f for f in failures), failures
    failures = _failures({**bundle, "grants": []}, key)
    assert any("which the bundle lacks" in f for f in failures), failures
    # A field no bundle has, or a provable one moved to "unrecorded".
    failures = _failures({**bundle, "operation": {**bundle["operation"], "refunded": True}}, key)
    assert any("has a field 'refunded' that no bundle has" in f for f in failures), failures
    moved = copy.deepcopy(bundle)
    moved["unrecorded"]["operation.idempotency_key"] = moved["operation"].pop("idempotency_key")
    failures = _failures(moved, key)
    assert any("which its registered event records" in f for f in failures), failures
    # Another key, or another origin than the one the verifier is told.
    other = Path(exported["path"]).with_name("other.pem")
    other.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    assert any("no signature of" in f for f in _failures(bundle, other))
    assert any(
        "not the log's origin" in f for f in _failures(bundle, key, origin="example.org/log")
    )


def test_the_verifier_process_names_the_change_and_exits_non_zero(exported, tmp_path):
    bundle, key = exported["bundle"], exported["key"]
    cases = {
        "comment": (
            _changed(bundle, ["approvals", 0, "decisions", 0, "comment"]),
            "decision 1, field 'comment'",
        ),
        "event": (
            _changed(bundle, ["events", 2, "data", "comment"]),
            f"seq 3 (id {bundle['events'][2]['id']}, leaf {bundle['events'][2]['leaf_index']})",
        ),
        "signature": (
            {
                **bundle,
                "checkpoint": {
                    **bundle["checkpoint"],
                    "note": bundle["checkpoint"]["note"][:-10]
                    + _flip(bundle["checkpoint"]["note"][-10])
                    + bundle["checkpoint"]["note"][-9:],
                },
            },
            "the checkpoint's signed note",
        ),
    }
    for what, (changed, named) in cases.items():
        path = tmp_path / f"changed-{what}.json"
        path.write_text(json.dumps(changed), encoding="utf-8")
        done = _run_verifier(tmp_path, str(path), "--key", str(key))
        assert done.returncode == 1, (what, done.stdout, done.stderr)
        assert "NOT VERIFIED" in done.stdout
        assert any(
            named in line for line in done.stdout.splitlines() if line.startswith("FAILED")
        ), (
            what,
            done.stdout,
        )
    # A file that is no bundle, or a key file that holds no key: 2, and said why.
    (tmp_path / "junk.json").write_text("[1, 2", encoding="utf-8")
    done = _run_verifier(tmp_path, str(tmp_path / "junk.json"), "--key", str(key))
    assert (done.returncode, "is not JSON" in done.stderr) == (2, True)
    done = _run_verifier(tmp_path, str(exported["path"]), "--key", str(exported["path"]))
    assert (done.returncode, "holds no public key" in done.stderr) == (2, True)


@pytest.mark.slow
def test_every_byte_of_the_file_changed_fails(exported):
    """One bit flipped at each byte of the file, in turn: never a bundle that verifies
    (the JSON breaks, or a check fails). About ten seconds: in `make test` and CI."""
    data = exported["path"].read_bytes()
    key = load_public_key(exported["key"].read_bytes())
    verified = []
    for at in range(len(data)):
        changed = data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]
        try:
            bundle = load_bundle(changed)
        except checks.BundleError:
            continue
        if verify_bundle(bundle, key=key).ok:
            verified.append((at, data[max(0, at - 20) : at + 20]))
    assert verified == []


# --- Every kind of row ----------------------------------------------------------------------


def test_resolutions_and_standing_grants_are_held_to_their_events(api, audit_key, tmp_path):
    """Two more lifecycles: "did not happen" declared by one person and confirmed by a
    second, then a new approval and a retry; and an operation approved by a standing
    grant signed by two people."""
    api.tool("payout", contract("irreversible", approval={"mode": "always"}))
    declarer, confirmer = person(username="dee.declares"), person(username="cy.confirms")
    for someone in (declarer, confirmer):
        assign_perm("operations.reconcile_tool", someone, Tool.objects.get(pk="payout"))
    approver = person(username="al.approves", decide_on="payout")
    op = api.register(api.run(principal="user:erin"), "payout")
    services.approval_decide(
        request_id=op["approval"]["id"], user=approver, approve=True, comment=""
    )
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    services.operation_resolve(
        operation=Operation.objects.get(pk=op["id"]),
        user=declarer,
        result="not_found",
        note="No payout in the provider's list",
    )
    resolution = Operation.objects.get(pk=op["id"]).resolutions.get()
    services.operation_resolution_confirm(
        resolution_id=resolution.id, user=confirmer, confirm=True, note="Checked too"
    )
    second = Operation.objects.get(pk=op["id"]).approval_requests.order_by("created_at").last()
    services.approval_decide(request_id=second.id, user=approver, approve=True, comment="Retry")
    api.claim(op["id"])
    api.outcome(op["id"], 2, {"kind": "succeeded", "downstream_id": "po_77"})

    api.tool("credit", contract("irreversible", approval={"mode": "always"}))
    ann, bob = (
        person(username="ann.signs", decide_on="credit"),
        person(username="bob.signs", decide_on="credit"),
    )
    standing = services.standing_grant_issue(
        services.StandingTerms(
            tool="credit",
            max_uses=3,
            expires_at=timezone.now() + timedelta(hours=1),
            pins=[{"path": "/amount_cents", "op": "lte", "value": 1000}],
            sum_path="/amount_cents",
            max_sum=Decimal(2000),
            approvals_required=2,
        ),
        user=ann,
    )
    services.standing_grant_sign(grant_id=standing.id, user=bob)
    covered = api.register(api.run(), "credit")
    assert covered["status"] == "ready"
    api.claim(covered["id"])
    api.outcome(covered["id"], 1, {"kind": "succeeded", "downstream_id": "cr_1"})
    _seal()

    key = _public_key(tmp_path, audit_key)
    paths = {}
    for name, op_id in (("resolved", op["id"]), ("standing", covered["id"])):
        paths[name] = tmp_path / f"{name}.json"
        _export(op_id, paths[name])
        done = _run_verifier(tmp_path, str(paths[name]), "--key", str(key))
        assert done.returncode == 0, done.stdout + done.stderr
        paths[name + ".story"] = done.stdout
    said = paths["resolved.story"]
    assert "user:dee.declares declared it did not happen" in said
    assert "dee.declares declared it, cy.confirms confirmed" in said
    assert '"No payout in the provider\'s list"' in said
    assert "user:al.approves APPROVED" in said
    assert '"Retry"' in said
    assert "downstream reference po_77" in said
    said = paths["standing.story"]
    assert f"user:ann.signs issued standing grant {standing.id}" in said
    assert f"user:bob.signs signed standing grant {standing.id}" in said
    assert f"by standing grant {standing.id}" in said

    resolved = json.loads(paths["resolved"].read_text())
    for path, named in (
        (["resolutions", 0, "note"], "field 'note'"),
        (["resolutions", 0, "declared_by"], "field 'declared_by'"),
        (["resolutions", 0, "created_at"], "field 'created_at'"),
        (["resolutions", 0, "review", "user"], "its review, field 'user'"),
        (["resolutions", 0, "review", "note"], "its review, field 'note'"),
        (["resolutions", 0, "review", "decision"], "its review, field 'decision'"),
        (["approvals", 1, "decisions", 0, "comment"], "decision 1, field 'comment'"),
        (["attempts", 1, "outcome", "downstream_id"], "attempt 2, field 'outcome'"),
    ):
        failures = _failures(_changed(resolved, path), key)
        assert any(named in f for f in failures), (path, failures)
    failures = _failures({**resolved, "resolutions": []}, key)
    assert any("which the bundle lacks" in f for f in failures), failures

    covering = json.loads(paths["standing"].read_text())
    assert [g["standing_grant"] for g in covering["grants"]] == [standing.id]
    for path, named in (
        (["standing_grants", 0, "terms", "max_uses"], "field 'terms'"),
        (["standing_grants", 0, "terms", "pins", 0, "value"], "field 'terms'"),
        (["standing_grants", 0, "issued_by"], "field 'issued_by'"),
        (["standing_grants", 0, "signed_by", 0], "field 'signed_by'"),
        (["grants", 0, "standing_grant"], "field 'standing_grant'"),
    ):
        failures = _failures(_changed(covering, path), key)
        assert any(named in f for f in failures), (path, failures)
    failures = _failures({**covering, "related_events": covering["related_events"][:1]}, key)
    assert any("lacks its issued or its activated event" in f for f in failures), failures


# --- A witness's checkpoint -----------------------------------------------------------------


def _rewrite_from(stream: str, seq: int, **changes: Any) -> None:
    """Rewrite the event ``seq`` of ``stream`` with ``changes`` and every later one's
    link, with correct hashes: the chain verifies again."""
    with as_owner(), ignored(*trigger_uris()):
        prev = Event.objects.get(stream=stream, seq=seq - 1).hash if seq > 1 else "0" * 64
        for event in Event.objects.filter(stream=stream, seq__gte=seq).order_by("seq"):
            if event.seq == seq:
                for name, value in changes.items():
                    setattr(event, name, value)
            event.prev_hash = prev
            event.hash = services.event_hash(event)
            Event.objects.filter(pk=event.pk).update(
                **(changes if event.seq == seq else {}), prev_hash=prev, hash=event.hash
            )
            prev = event.hash


def _witness(api, receiver: Receiver, secret: str) -> str:
    """What the webhook subscriber keeps: the note of the latest audit.checkpoint it was
    delivered, its Standard Webhooks signature checked."""
    webhooks.deliver_due()
    kept = None
    for request in receiver.requests:
        payload = Webhook(secret).verify(request.body, request.headers)
        if payload["type"] == "audit.checkpoint":
            checkpoint = payload["data"]["checkpoint"]
            if kept is None or checkpoint["size"] > kept["size"]:
                kept = checkpoint
    assert kept is not None
    return kept["note"]


@postgresql_only
def test_a_checkpoint_a_witness_kept_catches_a_rewrite_the_database_no_longer_shows(
    api, audit_key, tmp_path, settings
):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver()
    try:
        created = api.post(
            "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["audit.checkpoint"]}
        )
        assert created.status_code == 201, created.json()
        op = _lifecycle(api)
        _seal()
        note = _witness(api, receiver, created.json()["secret"])
    finally:
        receiver.close()
    kept = tmp_path / "kept.note"
    kept.write_text(note, encoding="utf-8")
    kept_size = int(note.split("\n")[1])
    key = _public_key(tmp_path, audit_key)
    # The log grows past the witness's checkpoint: the bundle carries the proof from it.
    api.register(api.run(), "refund", arguments={"payment_id": "pay_1", "amount_cents": 1})
    _seal()
    assert Checkpoint.objects.order_by("size").last().size > kept_size
    honest = tmp_path / "honest.json"
    _export(op["id"], honest, kept_size)
    done = _run_verifier(tmp_path, str(honest), "--key", str(key), "--checkpoint", str(kept))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"The witness's checkpoint of {kept_size} entries is a prefix of it" in done.stdout
    # Without the proof, the kept checkpoint cannot be held to the bundle: said so.
    bare = tmp_path / "bare.json"
    _export(op["id"], bare)
    done = _run_verifier(tmp_path, str(bare), "--key", str(key), "--checkpoint", str(kept))
    assert done.returncode == 1
    assert f"--witness-size {kept_size}" in done.stdout

    # The forger rewrites who approved, with correct hashes; sealing again changes
    # nothing (the events are leaves already): the bundle fails at that event's proof.
    decision = Event.objects.get(stream=op["id"], kind="decision")
    mallory = person(username="mallory")
    _rewrite_from(op["id"], decision.seq, actor="user:mallory", actor_user_id=mallory.pk)
    with as_owner(), ignored(*trigger_uris()):
        Decision.objects.filter(request_id=decision.data["approval"]).update(user=mallory)
    _seal()
    rewritten = tmp_path / "rewritten.json"
    _export(op["id"], rewritten)
    done = _run_verifier(tmp_path, str(rewritten), "--key", str(key))
    assert done.returncode == 1
    leaf = LogLeaf.objects.get(event_id=decision.pk).index
    assert f"(id {decision.pk}, leaf {leaf}): its inclusion proof does not lead" in done.stdout

    # Then wipes the log and lets the application seal and sign the forged history
    # again: the bundle is consistent with itself and verifies with the key alone...
    with as_owner(), ignored(*trigger_uris()):
        Checkpoint.objects.all().delete()
        LogNode.objects.all().delete()
        LogLeaf.objects.all().delete()
    _seal()
    forged = tmp_path / "forged.json"
    _export(op["id"], forged, kept_size)
    done = _run_verifier(tmp_path, str(forged), "--key", str(key))
    assert done.returncode == 1  # its consistency proof has no signed first root here
    assert f"give the witness's checkpoint of size {kept_size} with --checkpoint" in done.stdout
    _export(op["id"], forged)
    done = _run_verifier(tmp_path, str(forged), "--key", str(key))
    assert done.returncode == 0, done.stdout
    assert "user:mallory APPROVED" in done.stdout
    # ...but not against the checkpoint the witness kept, and audit verify names it too.
    _export(op["id"], forged, kept_size)
    done = _run_verifier(tmp_path, str(forged), "--key", str(key), "--checkpoint", str(kept))
    assert done.returncode == 1, done.stdout
    assert (
        f"FAILED the consistency proof from size {kept_size} to "
        f"{Checkpoint.objects.order_by('size').last().size}: it does not prove that the "
        "bundle's checkpoint extends the witness's checkpoint"
    ) in done.stdout
    code, out = audit_verify("--checkpoint", str(kept))
    assert code == 1
    assert f"LOG FAULT kept checkpoint {kept_size}" in out
    assert "the history it covers was rewritten" in out


def test_hostile_files_are_refused_or_fail_without_a_crash(exported):
    """What someone handing over a bundle could craft: JSON that reads two ways, numbers
    no reader holds, nesting past any stack, and events whose data is shaped otherwise
    than the server writes, their hashes recomputed so that only later checks see it."""
    text = exported["path"].read_text(encoding="utf-8")
    key = load_public_key(exported["key"].read_bytes())
    for crafted in (
        text.replace('"format": ', '"format": "x", "format": ', 1),
        text.replace('"attempts": 1', '"attempts": NaN', 1),
        text.replace('"attempts": 1', '"attempts": 1' + "0" * 5000, 1),
        "[" * 100_000 + "]" * 100_000,
        '{"format": "effectgate-evidence/1"',
    ):
        with pytest.raises(checks.BundleError):
            load_bundle(crafted.encode())
    bundle = exported["bundle"]
    shapes = [[1, 2], "text", None, {"evidence": ["x"]}, {"attempt": [1]}, {"approval": {}}]
    for position in range(len(bundle["events"])):
        for shape in shapes:
            changed = copy.deepcopy(bundle)
            event = changed["events"][position]
            for name in list(event["data"]):
                event["data"][name] = shape
            event["hash"] = checks.event_hash(event)
            report = verify_bundle(changed, key=key)
            assert not report.ok
            # Each is a check's own failure: none came from a value no check expected.
            assert not any("cannot be read as a bundle" in str(f) for f in report.failures)
    # Rows of the wrong shape everywhere: failures, each named, never an exception.
    for name in ("attempts", "approvals", "grants", "standing_grants", "resolutions"):
        for shape in ([1], ["x"], [None], [{"id": []}], [[{}]]):
            report = verify_bundle({**bundle, name: shape}, key=key)
            assert not report.ok, (name, shape)
            assert not any("cannot be read as a bundle" in str(f) for f in report.failures), (
                name,
                shape,
                report.failures,
            )
    report = verify_bundle({**bundle, "attempts": [{}] * (checks.MAX_ROWS + 1)}, key=key)
    assert [str(f) for f in report.failures] == [
        f"the bundle: it holds more than {checks.MAX_ROWS} rows"
    ]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_export_reads_one_read_only_snapshot(
    audit_key, tmp_path, monkeypatch
):
    """As in production (no test transaction around it): the bundle is read in one
    REPEATABLE READ, READ ONLY transaction, so its rows and events are of one moment."""
    from django.db import connection

    from operations.audit import evidence

    op = _lifecycle(make_runner())
    _seal()
    seen = {}
    original = evidence._bundle

    def spying(operation_id, sizes):
        with connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            seen["isolation"] = cursor.fetchone()[0]
            cursor.execute("SHOW transaction_read_only")
            seen["read_only"] = cursor.fetchone()[0]
        return original(operation_id, sizes)

    monkeypatch.setattr(evidence, "_bundle", spying)
    assert not connection.in_atomic_block
    _export(op["id"], tmp_path / "evidence.json")
    assert seen == {"isolation": "repeatable read", "read_only": "on"}
    done = _run_verifier(
        tmp_path, str(tmp_path / "evidence.json"), "--key", str(_public_key(tmp_path, audit_key))
    )
    assert done.returncode == 0, done.stdout
