"""The Celery app: configuration comes from Django settings (``CELERY_*``)."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "atlas.settings")

app = Celery("atlas")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def apply_django_connection_rule(sender: Any = None, **kwargs: Any) -> None:
    """Around each task, what Django does around each request: close a connection
    that is broken or older than ``CONN_MAX_AGE``, keep the rest.

    Celery's own Django fixup would close every connection after every task
    (``CELERY_DB_REUSE_MAX`` in settings keeps it from doing so), and a new
    PostgreSQL session per task costs far more than a pump's query or two.
    Tasks run eagerly (tests) share the caller's connection: left alone.
    """
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()
