"""The transparency log's API: checkpoints, inclusion and consistency proofs that verify
against the signed roots, who may ask for which, the refusals, and the public key at
``/.well-known/effectgate-audit-key``."""

import base64

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from guardian.shortcuts import assign_perm

from operations import payloads, selectors, services
from operations.models import Checkpoint, Event, LogLeaf, OutboxMessage, Tool
from operations.tlog import keys, merkle, notes
from tests.approvals.conftest import person
from tests.conftest import Api, contract, make_runner
from tests.operations.test_bodies import Document
from tests.support.audit_log import (
    expected_root,
    leaf_of,
    naive_mth,
    seal_all,
    write_signing_key,
)

PROBLEM = "application/problem+json"


def _b64(values):
    return [base64.b64decode(value) for value in values]


def _operation(api, tool="t") -> dict:
    api.tool(tool, contract("idempotent"))
    op = api.register(api.run(), tool)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    return op


def _events(api, op) -> list[dict]:
    response = api.get(f"/api/v1/operations/{op['id']}/events")
    assert response.status_code == 200
    return response.json()


def _latest(api) -> dict:
    response = api.get("/api/v1/audit/checkpoints/latest")
    assert response.status_code == 200, response.json()
    return response.json()


def _problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["code"] == code
    return body


def test_no_checkpoint_until_one_is_signed(api):
    _problem(api.get("/api/v1/audit/checkpoints/latest"), 404, "not_found")
    _operation(api)
    seal_all()  # no key: leaves, no checkpoint
    assert LogLeaf.objects.exists()
    body = _problem(api.get("/api/v1/audit/checkpoints/latest"), 404, "not_found")
    assert "No checkpoint" in body["detail"]


def test_every_event_of_an_operation_proves_its_inclusion_in_the_signed_tree(api, audit_key):
    op = _operation(api)
    seal_all()
    checkpoint = _latest(api)
    assert checkpoint == payloads.checkpoint(Checkpoint.objects.get(size=checkpoint["size"]))
    text = notes.open_note(
        checkpoint["note"], name=checkpoint["origin"], keys=[audit_key.public_key()]
    )
    body = notes.CheckpointBody.parse(text)
    root = base64.b64decode(checkpoint["root"])
    assert (body.size, body.root) == (checkpoint["size"], root)
    events = _events(api, op)
    assert len(events) >= 3
    for shown in events:
        response = api.get(f"/api/v1/audit/events/{shown['id']}/inclusion")
        assert response.status_code == 200, response.json()
        proof = response.json()
        assert proof["event"] == shown["id"]
        assert proof["size"] == checkpoint["size"]
        # What the runner was shown is what the leaf holds: the event's hash and place.
        event = Event.objects.get(pk=shown["id"])
        assert (event.hash, event.seq) == (shown["hash"], shown["seq"])
        assert merkle.verify_inclusion(
            index=proof["leaf_index"],
            size=proof["size"],
            leaf=leaf_of(event),
            proof=_b64(proof["hashes"]),
            root=root,
        )


def test_a_proof_for_a_smaller_tree_and_the_refusals_of_sizes(api, audit_key):
    op = _operation(api)
    seal_all()
    size = _latest(api)["size"]
    event = _events(api, op)[-1]["id"]
    leaf = LogLeaf.objects.get(event_id=event).index
    inclusion = f"/api/v1/audit/events/{event}/inclusion"
    at = api.get(inclusion, {"size": leaf + 1}).json()
    assert at["size"] == leaf + 1
    stored = [bytes(h) for h in LogLeaf.objects.order_by("index").values_list("hash", flat=True)]
    assert merkle.verify_inclusion(
        index=leaf,
        size=leaf + 1,
        leaf=stored[leaf],
        proof=_b64(at["hashes"]),
        root=naive_mth(stored[: leaf + 1]),
    )
    body = _problem(api.get(inclusion, {"size": leaf}), 409, "not_sealed")
    assert f"it is leaf {leaf}" in body["detail"]
    for bad in ("0", "-1", "x", "1" * 30):
        body = _problem(api.get(inclusion, {"size": bad}), 400, "invalid_request")
        assert body["errors"][0]["path"] == "size"
    beyond = _problem(api.get(inclusion, {"size": size + 1}), 404, "not_found")
    assert f"The log holds {size} leaves: there is no tree of {size + 1}" in beyond["detail"]
    _problem(api.get(inclusion, {"sise": 1}), 400, "invalid_request")


def test_an_event_not_sealed_yet_is_409(api, audit_key):
    op = _operation(api)
    seal_all()
    api.post(f"/api/v1/runs/{api.run()}/cancel")
    newest = Event.objects.latest("pk")
    assert not LogLeaf.objects.filter(event_id=newest.pk).exists()
    body = _problem(api.get(f"/api/v1/audit/events/{newest.pk}/inclusion"), 409, "not_sealed")
    assert "not in the log yet" in body["detail"]
    assert (
        Event.objects.filter(stream=op["id"]).count()
        == LogLeaf.objects.filter(event__stream=op["id"]).count()
    )


def test_another_runners_event_is_not_found(api, other_api, audit_key):
    op = _operation(api)
    seal_all()
    event = _events(api, op)[0]["id"]
    assert api.get(f"/api/v1/audit/events/{event}/inclusion").status_code == 200
    mine = _problem(other_api.get(f"/api/v1/audit/events/{event}/inclusion"), 404, "not_found")
    absent = _problem(other_api.get("/api/v1/audit/events/99999999/inclusion"), 404, "not_found")
    # Another runner's event reads exactly as one that does not exist, but for its id.
    assert mine["title"] == absent["title"]
    # Streams the runner owns: its own runner stream and its tools' contract streams.
    own = Event.objects.filter(stream=f"runner:{api.runner.pk}").first()
    tool = Event.objects.filter(stream="tool:t").first()
    for event in (own, tool):
        assert api.get(f"/api/v1/audit/events/{event.pk}/inclusion").status_code == 200
        _problem(other_api.get(f"/api/v1/audit/events/{event.pk}/inclusion"), 404, "not_found")


def test_people_prove_the_events_of_operations_they_may_see(api, audit_key):
    op = _operation(api, tool="refund")
    seal_all()
    event = _events(api, op)[0]["id"]
    url = f"/api/v1/audit/events/{event}/inclusion"
    decider = person(decide_on="refund")
    stranger = person()
    browser = Client()
    browser.force_login(decider)
    response = browser.get(url)
    assert response.status_code == 200, response.content
    assert response.json()["event"] == event
    browser.force_login(stranger)
    _problem(browser.get(url), 404, "not_found")
    # Checkpoints and consistency proofs say nothing of any event: every person reads them.
    assert browser.get("/api/v1/audit/checkpoints/latest").status_code == 200
    assert Tool.objects.filter(pk="refund").exists()
    assign_perm("operations.reconcile_tool", stranger, Tool.objects.get(pk="refund"))
    assert browser.get(url).status_code == 200
    _problem(Client().get(url), 401, "not_authenticated")


def test_a_runner_service_user_cannot_use_a_session(api, audit_key):
    _operation(api)
    seal_all()
    browser = Client()
    browser.force_login(api.runner.service_user)
    _problem(browser.get("/api/v1/audit/checkpoints/latest"), 403, "forbidden")


def test_consistency_between_two_checkpoints_verifies(api, other_api, audit_key):
    _operation(api)
    seal_all()
    first = _latest(api)
    _operation(api, tool="u")
    seal_all()
    second = _latest(other_api)
    assert second["size"] > first["size"]
    response = other_api.get(
        "/api/v1/audit/consistency", {"first": first["size"], "second": second["size"]}
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["first"], body["second"]) == (first["size"], second["size"])
    assert merkle.verify_consistency(
        first=first["size"],
        second=second["size"],
        first_root=base64.b64decode(first["root"]),
        second_root=base64.b64decode(second["root"]),
        proof=_b64(body["hashes"]),
    )
    same = other_api.get("/api/v1/audit/consistency", {"first": 3, "second": 3}).json()
    assert same["hashes"] == []
    for query, path in (({"first": 0, "second": 2}, "first"), ({"second": 2}, "first")):
        body = _problem(other_api.get("/api/v1/audit/consistency", query), 400, "invalid_request")
        assert body["errors"][0]["path"] == path
    body = _problem(
        other_api.get("/api/v1/audit/consistency", {"first": 1}), 400, "invalid_request"
    )
    assert body["errors"][0]["path"] == "second"
    backwards = {"first": second["size"], "second": first["size"]}
    body = _problem(other_api.get("/api/v1/audit/consistency", backwards), 404, "not_found")
    assert "first at most second" in body["detail"]
    beyond = {"first": 1, "second": second["size"] + 1}
    body = _problem(other_api.get("/api/v1/audit/consistency", beyond), 404, "not_found")
    assert f"no tree of {second['size'] + 1} (second)" in body["detail"]
    _problem(
        Client().get("/api/v1/audit/consistency", {"first": 1, "second": 2}),
        401,
        "not_authenticated",
    )


def test_checkpoints_by_size(api, audit_key):
    _operation(api)
    seal_all()
    size = _latest(api)["size"]
    assert api.get(f"/api/v1/audit/checkpoints/{size}").json()["size"] == size
    _problem(api.get(f"/api/v1/audit/checkpoints/{size + 1}"), 404, "not_found")
    _problem(api.get("/api/v1/audit/checkpoints/0"), 404, "not_found")
    _problem(api.get("/api/v1/audit/checkpoints/99999999999999999999"), 404, "not_found")


def test_a_contracts_only_token_reads_checkpoints_not_proofs(api, audit_key):
    op = _operation(api)
    seal_all()
    token = services.token_create(
        runner=api.runner, scopes=["register_contracts"], actor=services.Actor.system("test")
    )
    deploy = Api(api.runner, token)
    assert deploy.get("/api/v1/audit/checkpoints/latest").status_code == 200
    event = _events(api, op)[0]["id"]
    _problem(deploy.get(f"/api/v1/audit/events/{event}/inclusion"), 403, "forbidden")


def test_the_public_key_is_published_as_pem(db, settings, tmp_path):
    body = _problem(Client().get("/.well-known/effectgate-audit-key"), 404, "not_found")
    assert "No audit signing key" in body["detail"]
    path, key = write_signing_key(tmp_path)
    settings.AUDIT_SIGNING_KEY_FILE = str(path)
    response = Client().get("/.well-known/effectgate-audit-key")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-pem-file"
    text = response.content.decode()
    assert text.startswith("-----BEGIN PUBLIC KEY-----")
    assert "PRIVATE" not in text
    published = keys.public_key_from_pem(response.content, source="the well-known URL")
    assert notes.raw_public_key(published) == notes.raw_public_key(key.public_key())
    assert Client().post("/.well-known/effectgate-audit-key").status_code == 405
    # A web server may publish it from the public key alone; a mismatch is refused.
    public = tmp_path / "audit.pub"
    public.write_text(keys.public_key_pem(key.public_key()))
    settings.AUDIT_SIGNING_KEY_FILE = ""
    settings.AUDIT_PUBLIC_KEY_FILE = str(public)
    assert Client().get("/.well-known/effectgate-audit-key").content == response.content
    other, _ = write_signing_key(tmp_path, "other.pem")
    settings.AUDIT_SIGNING_KEY_FILE = str(other)
    with pytest.raises(ImproperlyConfigured, match="not the public key of the signing key"):
        keys.public_key()
    misconfigured = Client().get("/.well-known/effectgate-audit-key")
    assert _problem(misconfigured, 500, "internal_error")["detail"] == (
        "The server's audit key is misconfigured."
    )


def test_the_webhook_body_is_the_documented_checkpoint(api, audit_key, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/h", "events": ["audit.*"]})
    _operation(api)
    seal_all()
    message = OutboxMessage.objects.filter(event_type="audit.checkpoint").latest("created_at")
    document = Document()
    document.check(
        message.payload["data"]["checkpoint"], document.component("CheckpointOut"), where="hook"
    )
    assert message.payload["data"]["checkpoint"] == _latest(api)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8, 9])
def test_roots_served_match_the_reference_at_every_size(api, audit_key, size):
    while Event.objects.count() < 10:
        make_runner()
    seal_all()
    assert selectors.log_root(size) == expected_root(size)
