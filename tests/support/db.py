"""Which database the suite runs on, for tests that only mean something on PostgreSQL."""

import pytest
from django.conf import settings

ON_POSTGRESQL = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def skip_unless_postgresql(why: str) -> pytest.MarkDecorator:
    """Skip unless the suite runs on PostgreSQL (CI does), saying why not elsewhere."""
    return pytest.mark.skipif(not ON_POSTGRESQL, reason=why)
