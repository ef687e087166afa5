"""Fixtures shared by the delivery tests: local webhook receivers, recorded pump wake-ups."""

from __future__ import annotations

import pytest

from changesets.outbox import pumps
from tests.changesets.worker_helpers import receiver_factory


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
