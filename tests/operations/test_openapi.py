"""The OpenAPI document describes every endpoint of api.md, and the docs page loads."""

import pytest
import yaml  # drf-spectacular depends on PyYAML
from django.test import Client

EXPECTED = {
    "/api/v1/tools": {"get"},
    "/api/v1/tools/{name}": {"get", "put"},
    "/api/v1/runs": {"post"},
    "/api/v1/runs/{run_id}": {"get"},
    "/api/v1/runs/{run_id}/cancel": {"post"},
    "/api/v1/operations": {"get", "post"},
    "/api/v1/operations/{operation_id}": {"get"},
    "/api/v1/operations/{operation_id}/events": {"get"},
    "/api/v1/operations/{operation_id}/tool-result": {"get"},
    "/api/v1/operations/{operation_id}/attempts": {"post"},
    "/api/v1/operations/{operation_id}/attempts/{number}/heartbeat": {"post"},
    "/api/v1/operations/{operation_id}/attempts/{number}/outcome": {"post"},
    "/api/v1/operations/{operation_id}/reconciliations": {"post"},
    "/api/v1/operations/{operation_id}/compensations": {"post"},
    "/api/v1/approvals/{approval_id}": {"get"},
}


@pytest.mark.django_db
def test_schema_lists_every_endpoint_and_method():
    response = Client().get("/api/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    assert document["openapi"].startswith("3.")
    for path, methods in EXPECTED.items():
        assert path in document["paths"], path
        assert methods <= set(document["paths"][path]), path
    operation = document["components"]["schemas"]["OperationOut"]["properties"]
    for field in ("id", "intent_hash", "idempotency_key", "allowed_next_actions", "approval"):
        assert field in operation


@pytest.mark.django_db
def test_docs_page_uses_no_cdn():
    response = Client().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower()


@pytest.mark.django_db
@pytest.mark.parametrize("version", ["a\nb", "1\r\nX-Injected: yes", "evil", "2"])
def test_a_version_parameter_changes_nothing_in_the_document(version):
    """drf-spectacular writes ?version= into the document and its file name: a newline
    there answered 500 (a header cannot hold one), and any text was echoed back."""
    response = Client().get("/api/schema/", {"format": "json", "version": version})
    assert response.status_code == 200
    assert response.json()["info"]["version"] == "1"
    assert response["Content-Disposition"] == 'inline; filename="Effectgate runner API.json"'
