"""Rows written several at a time are held to the columns as one row is: an over-long
value is refused (an explicit cast to ``varchar(n)`` would cut it without a word), and
on SQLite timestamps are stored as the ORM stores them."""

import pytest
from django.conf import settings
from django.db import DataError, connection, transaction

from operations.models import Attempt, Event
from operations.services.core import Actor, event_build
from operations.services.rows import COLUMNAR_FROM, insert_all

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def _event(stream, tool_name):
    from django.utils import timezone

    return event_build(
        stream=stream,
        seq=1,
        prev_hash="0" * 64,
        kind="registered",
        actor=Actor.system("t"),
        operation=None,
        tool_name=tool_name,
        now=timezone.now(),
    )


@pytest.mark.skipif(not POSTGRES, reason="unnest arrays are PostgreSQL's")
def test_an_overlong_value_is_refused_alone_and_in_a_set(db):
    long = "x" * 150  # Event.tool_name is varchar(100)
    with pytest.raises(DataError), transaction.atomic():
        insert_all(_event("s:one", long))
    with pytest.raises(DataError), transaction.atomic():
        # From rows.COLUMNAR_FROM rows the INSERT sends one array per column.
        insert_all(*(_event(f"s:{n}", long) for n in range(COLUMNAR_FROM)))
    assert not Event.objects.filter(stream__startswith="s:").exists()


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's text timestamps")
def test_hot_path_timestamps_are_stored_as_the_orm_stores_them(api):
    api.tool("t")
    run = api.run()
    op = api.register(run, "t", claim={"lease_s": 30})
    attempt = Attempt.objects.get(operation_id=op["id"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_until FROM operations_attempt WHERE id = %s", [attempt.pk])
        raw = cursor.fetchone()[0]
    event = Event.objects.filter(stream=op["id"]).first()
    assert Event.objects.filter(pk=event.pk, at=event.at).exists(), "exact lookup misses"
    assert "+" not in str(raw), raw
