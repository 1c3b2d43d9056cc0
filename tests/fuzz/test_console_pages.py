"""Every console page, asked with GET by a signed-in superuser: no answer is a 5xx,
whatever its path segments and query parameters hold.

The pages are the URL patterns of the console (and the other patterns outside /api/ and
the admin), enumerated from the URLconf, so a new page is fuzzed without being named
here. A page's query parameters are the names its view reads: each page is first asked
with real ids while ``request.GET`` records every name looked up (the view's and its
template's). Then every path segment and every parameter in turn takes each hostile
value (tests/fuzz/hostile.py), the others staying real, and all parameters at once.

CI runs this on PostgreSQL, which refuses input SQLite stores (U+0000).
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.handlers import wsgi
from django.http import QueryDict
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone

from approvals.models import ApprovalRequest
from operations import services
from operations.models import (
    Operation,
    OutboxMessage,
    Resolution,
    Run,
    Runner,
    RunnerToken,
    Tool,
)

from .conftest import Known, build_world, count
from .hostile import HOSTILE

# About a minute of requests on PostgreSQL: in `make test` and CI, not in `make check`.
pytestmark = pytest.mark.slow

# Patterns not fuzzed here: the runner API (tests/fuzz/test_api_parameters.py, from its
# OpenAPI document) and Django's own admin.
SKIPPED_PREFIXES = ("api/v", "admin/")
PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")


@dataclass(frozen=True)
class Page:
    route: str  # e.g. "operations/<str:operation_id>/"
    name: str

    @property
    def parameters(self) -> list[str]:
        return [match["name"] for match in PARAMETER.finditer(self.route)]

    def url(self, values: dict[str, str]) -> str:
        """The path with each parameter replaced by its (already encoded) value."""
        return "/" + PARAMETER.sub(lambda match: values[match["name"]], self.route)


def _pages(patterns: list[Any], prefix: str = "") -> Iterator[Page]:
    for entry in patterns:
        route = prefix + str(entry.pattern)
        if route.startswith(SKIPPED_PREFIXES):
            continue
        if isinstance(entry, URLResolver):
            yield from _pages(entry.url_patterns, route)
        elif isinstance(entry, URLPattern) and not route.startswith("^"):
            yield Page(route=route, name=entry.name or route)


PAGES = sorted(set(_pages(get_resolver().url_patterns)), key=lambda page: page.route)


def test_the_console_pages_are_enumerated_from_the_urlconf():
    routes = {page.route for page in PAGES}
    assert {"", "operations/<str:operation_id>/", "reconciliation/", "search/"} <= routes
    assert not any(route.startswith(SKIPPED_PREFIXES) for route in routes)


def _real_values(known: Known, superuser) -> dict[str, list[str]]:
    """Ids of real objects of every kind a console path names, after ``build_world``."""
    # A transition now that the world's webhook endpoint exists: a message to redeliver.
    known.api.claim(known.api.register(known.run_id[0], "idem")["id"])
    unknown = Operation.objects.filter(status="outcome_unknown").first()
    assert unknown is not None
    services.operation_resolve(
        operation=unknown, user=superuser, result="not_found", note="looked: nothing"
    )
    view = services.saved_view_save(
        user=superuser, list_name="operations", name="ready", query="status=ready"
    )
    grant = services.standing_grant_issue(
        services.StandingTerms(
            tool="ask", max_uses=2, expires_at=timezone.now() + timedelta(hours=1)
        ),
        user=superuser,
    )
    policy = services.policies.policy_write(
        user=superuser,
        text='@id("fuzz-forbid")\nforbid(principal, action == Action::"register", resource);',
    )

    group = Group.objects.create(name="Finance")

    def ids(model, field: str = "pk") -> list[str]:
        return [str(value) for value in model.objects.values_list(field, flat=True)[:3]]

    return {
        "operation_id": ids(Operation),
        "approval_id": ids(ApprovalRequest),
        "run_id": ids(Run),
        "name": ids(Tool),
        "runner_id": ids(Runner),
        "token_id": ids(RunnerToken),
        "message_id": ids(OutboxMessage),
        "resolution_id": ids(Resolution),
        "view_id": [str(view.pk)],
        "grant_id": [grant.id],
        "policy_id": [policy.policy_id],
        "number": ["1", "2"],
        "fmt": ["csv", "jsonl"],
        "group_id": [str(group.pk)],
    }


class _Recording(QueryDict):
    """A QueryDict that remembers every name looked up in it."""

    seen: set[str] = set()

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def getlist(self, key, default=None):
        self.seen.add(key)
        return super().getlist(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def _answer(client: Client, url: str) -> int:
    """The status of GET ``url``, with a streamed body read to its end (an export fails,
    if it fails, while it streams)."""
    count("console requests")
    response = client.get(url)
    if response.streaming:
        b"".join(response.streaming_content)
    return response.status_code


@pytest.mark.parametrize("page", PAGES, ids=[page.route or "/" for page in PAGES])
def test_no_console_page_answers_5xx_to_hostile_paths_or_parameters(db, monkeypatch, page):
    known = build_world()
    superuser = get_user_model().objects.create_superuser("fuzz-root", password="pw-fuzz-1")
    real = _real_values(known, superuser)
    missing = [name for name in page.parameters if not real.get(name)]
    assert not missing, f"add real ids for {missing} to _real_values"
    client = Client(raise_request_exception=False)
    client.force_login(superuser)
    base = {name: quote(real[name][0], safe="") for name in page.parameters}
    failures: list[str] = []

    def check(url: str, case: str) -> None:
        try:
            status = _answer(client, url)
        except Exception as exc:  # a streamed body that raised mid-way
            failures.append(f"{case}: {type(exc).__name__}: {exc}"[:300])
            return
        if status >= 500:
            failures.append(f"{case}: {status}")

    monkeypatch.setattr(wsgi, "QueryDict", _Recording)
    _Recording.seen = set()
    check(page.url(base), "real ids")
    for name in page.parameters:
        for value in real[name][1:]:
            check(page.url({**base, name: quote(value, safe="")}), f"real {name}={value}")
    parameters = sorted(_Recording.seen)
    monkeypatch.undo()

    for name in page.parameters:
        for label, value in HOSTILE:
            check(page.url({**base, name: value}), f"path {name}: {label}")
    url = page.url(base)
    for parameter in parameters:
        for label, value in HOSTILE:
            check(f"{url}?{quote(parameter)}={value}", f"?{parameter}: {label}")
    for label, value in HOSTILE:
        query = "&".join(f"{quote(parameter)}={value}" for parameter in parameters)
        check(f"{url}?{query}", f"every parameter: {label}")
    assert not failures, f"{page.route}: " + "; ".join(failures)
