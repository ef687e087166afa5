"""How a committed changeset reaches the workers from the web process (changesets/publisher.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from changesets import publisher
from changesets.models import JournalEntry, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.worker_helpers import celery_configured


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, str]]:
    """What reached ``apply_async``, and on which thread."""
    calls: list[tuple[str, str]] = []

    def apply_async(args, retry):
        assert retry is False
        calls.append((args[0], threading.current_thread().name))

    monkeypatch.setattr("changesets.tasks.journal_publish.apply_async", apply_async)
    return calls


@pytest.mark.django_db(transaction=True)
def test_a_commit_hands_its_journal_task_to_the_background_thread(
    staff, namespace, sent, settings, not_eager
):
    settings.ATLAS_JOURNAL_PUBLISH = "thread"
    ids = []
    for n in range(5):
        result = changeset_apply(
            store=baseline,
            actor=staff,
            ops=[PutOp(EntityKey(namespace.name, "order", "a"), {"n": n})],
            rpc=Rpc.PUT_ENTITY,
        )
        ids.append(str(result.changeset.id))

    assert publisher.flush(10)
    assert [i for i, _ in sent] == ids, "each changeset once, in commit order"
    assert {thread for _, thread in sent} == {"atlas-publisher"}
    # The entries stay committed until the worker's task runs: nothing is lost if
    # the process dies with ids still queued (the sweep publishes them).
    assert JournalEntry.objects.filter(phase="committed").count() == 5


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("why", ["inline", "eager"])
def test_inline_publishing_when_turned_off_or_eager(staff, namespace, sent, settings, why):
    settings.ATLAS_JOURNAL_PUBLISH = "inline" if why == "inline" else "relay"
    with celery_configured(task_always_eager=why == "eager"):
        result = changeset_apply(
            store=baseline,
            actor=staff,
            ops=[PutOp(EntityKey(namespace.name, "order", "a"), {})],
            rpc=Rpc.PUT_ENTITY,
        )
    # Before changeset_apply returned, on the caller's thread.
    assert sent == [(str(result.changeset.id), threading.current_thread().name)]


def test_a_broker_failure_is_logged_and_the_thread_carries_on(
    monkeypatch, caplog, settings, not_eager
):
    settings.ATLAS_JOURNAL_PUBLISH = "thread"
    calls = []

    def apply_async(args, retry):
        calls.append(args[0])
        if args[0] == "down":
            raise ConnectionError("broker unreachable")

    monkeypatch.setattr("changesets.tasks.journal_publish.apply_async", apply_async)
    with caplog.at_level(logging.WARNING, logger="changesets.publisher"):
        publisher.publish_soon("down")
        publisher.publish_soon("up")
        assert publisher.flush(10)
    assert calls == ["down", "up"]
    assert "could not enqueue journal publish for down; the sweep will finish it" in caplog.text


def test_flush_times_out_while_a_publish_hangs(monkeypatch, settings, not_eager):
    settings.ATLAS_JOURNAL_PUBLISH = "thread"
    stuck = threading.Event()
    monkeypatch.setattr(
        "changesets.tasks.journal_publish.apply_async", lambda args, retry: stuck.wait(10)
    )
    publisher.publish_soon("slow")
    try:
        assert publisher.flush(0.2) is False
    finally:
        stuck.set()
    assert publisher.flush(10) is True


@pytest.mark.django_db(transaction=True)
def test_in_relay_mode_the_web_process_enqueues_nothing(
    staff, namespace, sent, settings, not_eager
):
    settings.ATLAS_JOURNAL_PUBLISH = "relay"
    changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(EntityKey(namespace.name, "order", "a"), {})],
        rpc=Rpc.PUT_ENTITY,
    )
    assert publisher.flush(10)
    assert sent == []  # the journal relay (changesets.relay) enqueues it
    assert JournalEntry.objects.filter(phase="committed").count() == 1
