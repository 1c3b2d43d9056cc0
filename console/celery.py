"""The Celery app: ``celery -A console worker`` and ``celery -A console beat``.

Beat only wakes the dispatchers; the due work itself lives in the database
(``lease_until``, ``expires_at``, ``next_probe_at``, ``next_attempt_at``) and every task
claims its rows with SKIP LOCKED or compare-and-set, so any number of workers can run
them, twice or at once. Without a broker (``CELERY_BROKER_URL`` unset, the local mode)
tasks run eagerly in the calling process and ``manage.py runlocal`` runs the same beat
schedule on a thread.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
