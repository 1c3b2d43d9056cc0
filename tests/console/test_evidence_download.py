"""The operation page's "Download evidence": the bundle of an operation the person may
see, verified by the client's verifier; another's is not found; before the sealer covered
every event, the page says so and offers no file."""

import base64
import json

from effectgate_client.evidence import verify_bundle
from operations.models import Checkpoint, Operation
from tests.support.audit_log import seal_all

from .conftest import client_for


def _download(user, op_id: str, **params):
    return client_for(user).get(f"/operations/{op_id}/evidence", params)


def test_the_button_downloads_a_bundle_that_verifies(world, viewer, audit_key):
    op_id = world.visible[0]["id"]
    page = client_for(viewer).get(f"/operations/{op_id}/")
    assert f'action="/operations/{op_id}/evidence"' in page.content.decode()
    assert "Download evidence" in page.content.decode()
    seal_all()
    response = _download(viewer, op_id)
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="{op_id}-evidence.json"'
    bundle = json.loads(response.content)
    assert bundle["operation"]["id"] == op_id
    assert bundle["checkpoint"]["size"] == Checkpoint.objects.order_by("size").last().size
    report = verify_bundle(bundle, key=audit_key.public_key())
    assert report.failures == []
    # With the size of a checkpoint the person kept: the proof from it is in the file.
    kept = Checkpoint.objects.order_by("size").first()
    response = _download(viewer, op_id, witness_size=kept.size)
    with_proof = json.loads(response.content)
    [proof] = with_proof["consistency"]
    assert (proof["first"], proof["first_checkpoint"]["root"]) == (
        kept.size,
        base64.b64encode(bytes(kept.root)).decode(),
    )
    assert verify_bundle(with_proof, key=audit_key.public_key()).failures == []


def test_an_operation_the_person_may_not_see_is_not_found(world, viewer, audit_key):
    seal_all()
    response = _download(viewer, world.hidden[0]["id"])
    assert response.status_code == 404


def test_before_the_log_covers_the_operation_the_page_says_why(world, viewer):
    op_id = world.visible[0]["id"]
    client = client_for(viewer)
    response = client.get(f"/operations/{op_id}/evidence")
    assert response.status_code == 302
    assert response["Location"] == f"/operations/{op_id}/"
    page = client.get(response["Location"])
    said = page.content.decode()
    assert "No evidence bundle yet." in said
    assert "effectgate audit seal" in said
    assert Operation.objects.filter(pk=op_id).exists()


def test_a_witness_size_beyond_the_log_is_refused_in_words(world, viewer, audit_key):
    op_id = world.visible[0]["id"]
    seal_all()
    size = Checkpoint.objects.order_by("size").last().size
    client = client_for(viewer)
    response = client.get(f"/operations/{op_id}/evidence", {"witness_size": size + 5})
    assert response.status_code == 302
    said = client.get(response["Location"]).content.decode()
    assert f"A witness&#x27;s checkpoint of size {size + 5} cannot be proved" in said
    assert _download(viewer, op_id, witness_size="lots").status_code == 400
