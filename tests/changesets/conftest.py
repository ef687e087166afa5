"""Fixtures shared by the delivery tests: local webhook receivers, recorded pump wake-ups."""

from __future__ import annotations

import pytest

from changesets.outbox import pumps
from tests.changesets.worker_helpers import receiver_factory


@pytest.fixture
def webhook_settings(settings):
    """Deliveries to loopback receivers, with short timeouts and backoff."""
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    settings.ATLAS_WEBHOOK_TIMEOUT_SECONDS = 2
    settings.ATLAS_WEBHOOK_PAGE_SIZE = 100
    settings.ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS = 1
    settings.ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS = 60
    return settings


@pytest.fixture
def receivers():
    """``receivers(...)`` starts an HTTP receiver on loopback; all stop after the test."""
    with receiver_factory() as make:
        yield make


@pytest.fixture
def no_wake(monkeypatch):
    """Record pump wake-ups instead of running them (eager Celery would run them inline)."""
    woken: list[tuple[str, float | None]] = []
    monkeypatch.setattr(
        pumps, "enqueue_pump", lambda sid, countdown=None: woken.append((sid, countdown))
    )
    return woken
