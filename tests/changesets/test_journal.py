"""The journal: publish (hooks, pump wake-ups), the sweep, recover_batches, metrics, readiness."""

from __future__ import annotations

import io
import re
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerError

from branches.services import branch_create
from branches.store import BranchStore
from changesets import tasks
from changesets.models import JournalEntry, JournalPhase, JournalTally, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import journal
from changesets.outbox.subscriptions import subscription_create
from changesets.services.apply import changeset_apply
from changesets.signals import changeset_committed
from entities.models import Namespace
from entities.store import EntityKey
from tests.entities.factories import NamespaceFactory

pytestmark = pytest.mark.django_db

NS = "acme.orders"


@pytest.fixture
def hook():
    """A ``changeset_committed`` receiver recording calls; ``hook.fail = True`` makes it raise."""

    class Hook:  # a callable object: no __qualname__, unlike a function
        def __init__(self) -> None:
            self.calls: list[Any] = []
            self.fail = False
            self.sleep = 0.0
            self.lock = threading.Lock()

        def __call__(self, sender, changeset, **kwargs) -> None:
            with self.lock:
                self.calls.append(changeset.id)
            if self.sleep:
                time.sleep(self.sleep)
            if self.fail:
                raise RuntimeError("search index is down")

    h = Hook()
    changeset_committed.connect(h, dispatch_uid="test-journal-hook", weak=False)
    yield h
    changeset_committed.disconnect(dispatch_uid="test-journal-hook")


@pytest.fixture
def woken(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(
        "changesets.outbox.pumps.enqueue_pump", lambda sid, countdown=None: calls.append(sid)
    )
    return calls


def entry(changeset) -> JournalEntry:
    return JournalEntry.objects.get(pk=changeset.pk)


def gone(changeset) -> bool:
    """Published: publishing deletes the entry."""
    return not JournalEntry.objects.filter(pk=changeset.pk).exists()


def failures_total() -> int:
    return JournalTally.objects.filter(pk=1).values_list("failures", flat=True).first() or 0


def age(changeset, seconds: float) -> None:
    JournalEntry.objects.filter(pk=changeset.pk).update(
        created_at=timezone.now() - timedelta(seconds=seconds)
    )


# --- publish ---------------------------------------------------------------------------------


def test_publish_runs_hooks_once_and_deletes_the_entry(staff, namespace, write, hook, woken):
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    assert entry(changeset).phase == JournalPhase.COMMITTED  # on_commit never fires here

    assert journal.journal_publish(changeset_id=changeset.id) == journal.PUBLISHED
    assert gone(changeset)
    assert journal.journal_publish(changeset_id=changeset.id) == journal.ALREADY_PUBLISHED

    assert hook.calls == [changeset.id]
    assert not JournalEntry.objects.exists()


@pytest.mark.parametrize("hooks", [False, True], ids=["no hooks", "hooks"])
def test_a_second_publish_of_the_same_ids_changes_nothing(
    staff, namespace, write, woken, settings, hooks
):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    subscription_create(actor=None, name="o", url="http://127.0.0.1:9/", namespaces=[NS])
    ids = [write(staff, f"{NS}/order/k{i}", {"n": i}).changeset.id for i in range(3)]
    calls: list[Any] = []
    if hooks:
        changeset_committed.connect(
            lambda sender, changeset, **kw: calls.append(changeset.id),
            dispatch_uid="test-again",
            weak=False,
        )
    try:
        woken.clear()
        first = journal.publish(ids)
        woken_first = list(woken)
        again = journal.publish(ids)
    finally:
        changeset_committed.disconnect(dispatch_uid="test-again")

    assert set(first.values()) == {journal.PUBLISHED}
    assert set(again.values()) == {journal.ALREADY_PUBLISHED}
    assert woken == woken_first and len(woken_first) == 1, "the second run woke nothing"
    assert calls == (ids if hooks else [])
    assert not JournalEntry.objects.exists()
    assert failures_total() == 0


def test_a_branch_changeset_or_an_unknown_id_is_missing(staff, namespace, write, woken):
    branch = branch_create(name="feature", actor=staff)
    on_branch = changeset_apply(
        store=BranchStore(branch),
        actor=staff,
        ops=[PutOp(EntityKey(NS, "order", "a"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    ).changeset

    outcomes = journal.publish([on_branch.id, "0" * 32])

    assert list(outcomes.values()) == [journal.MISSING, journal.MISSING]


def test_a_failing_hook_leaves_the_entry_outstanding_and_other_hooks_still_run(
    staff, namespace, write, hook, woken
):
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    others: list[Any] = []

    def second(sender, changeset, **kw):
        others.append(changeset.id)

    changeset_committed.connect(second, dispatch_uid="test-second", weak=False)
    hook.fail = True
    try:
        assert journal.journal_publish(changeset_id=changeset.id) == journal.COMMITTED
    finally:
        changeset_committed.disconnect(dispatch_uid="test-second")

    failed = entry(changeset)
    assert failed.phase == JournalPhase.COMMITTED
    assert (failed.attempts, failed.failures) == (1, 1)
    assert "search index is down" in failed.last_error
    assert others == [changeset.id]
    assert woken == []  # pumps are woken only when the hooks succeeded
    assert failures_total() == 1

    hook.fail = False
    assert journal.journal_publish(changeset_id=changeset.id) == journal.PUBLISHED
    assert gone(changeset)
    assert failures_total() == 1, "the counted failure outlives the entry"


def test_in_a_batch_the_failures_stay_with_their_errors_and_the_rest_is_deleted(
    staff, namespace, write, woken
):
    ids = [write(staff, f"{NS}/order/k{i}", {"n": i}).changeset.id for i in range(4)]

    def picky(sender, changeset, **kw):
        if changeset.id in ids[1:3]:
            raise RuntimeError(f"cannot index {changeset.id}")

    changeset_committed.connect(picky, dispatch_uid="test-picky", weak=False)
    try:
        outcomes = journal.publish(ids)
    finally:
        changeset_committed.disconnect(dispatch_uid="test-picky")

    assert [outcomes[i] for i in ids] == [
        journal.PUBLISHED,
        journal.COMMITTED,
        journal.COMMITTED,
        journal.PUBLISHED,
    ]
    left = {e.pk: e for e in JournalEntry.objects.all()}
    assert set(left) == set(ids[1:3])
    for changeset_id, failed in left.items():
        assert (failed.phase, failed.attempts, failed.failures) == (JournalPhase.COMMITTED, 1, 1)
        assert f"cannot index {changeset_id}" in failed.last_error  # each its own error
    assert failures_total() == 2


def test_a_failed_attempt_keeps_none_of_the_hooks_database_writes(
    staff, namespace, write, hook, woken
):
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset

    def writes(sender, changeset, **kw):
        Namespace.objects.create(name="hook.side-effect")

    changeset_committed.connect(writes, dispatch_uid="test-writes", weak=False)
    hook.fail = True
    try:
        journal.journal_publish(changeset_id=changeset.id)
    finally:
        changeset_committed.disconnect(dispatch_uid="test-writes")

    assert not Namespace.objects.filter(name="hook.side-effect").exists()


def test_publish_wakes_the_pumps_of_subscriptions_the_changeset_concerns(
    staff, namespace, write, woken, settings
):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    NamespaceFactory(name="acme.billing")
    orders = subscription_create(actor=None, name="o", url="http://127.0.0.1:9/", namespaces=[NS])
    subscription_create(
        actor=None, name="b", url="http://127.0.0.1:9/", namespaces=["acme.billing"]
    )
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset

    journal.journal_publish(changeset_id=changeset.id)

    assert woken == [str(orders.id)]


def test_an_unreachable_broker_leaves_the_entry_for_the_sweep(
    staff, namespace, write, monkeypatch, settings
):
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    subscription_create(actor=None, name="o", url="http://127.0.0.1:9/")
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset

    def down(*args, **kwargs):
        raise BrokerError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    monkeypatch.setattr("changesets.outbox.pumps.enqueue_pump", down)

    assert journal.journal_publish(changeset_id=changeset.id) == journal.COMMITTED
    left = entry(changeset)
    assert left.phase == JournalPhase.COMMITTED and left.failures == 1
    assert "wake pumps" in left.last_error and "Connection refused" in left.last_error
    assert failures_total() == 1

    monkeypatch.setattr("changesets.outbox.pumps.enqueue_pump", lambda sid, countdown=None: None)
    assert journal.journal_publish(changeset_id=changeset.id) == journal.PUBLISHED
    assert gone(changeset) and failures_total() == 1


def test_unknown_entry_is_missing(db):
    assert journal.journal_publish(changeset_id="0" * 32) == journal.MISSING


@pytest.mark.django_db(transaction=True)
def test_a_claimed_entry_is_busy_for_other_runners(staff, namespace, write, woken):
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    JournalEntry.objects.filter(pk=changeset.pk).update(phase=JournalPhase.COMMITTED)
    claimed, release = threading.Event(), threading.Event()

    def holder() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                JournalEntry.objects.select_for_update().get(pk=changeset.pk)
                claimed.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    claimed.wait(10)
    try:
        assert journal.journal_publish(changeset_id=changeset.id) == journal.BUSY
    finally:
        release.set()
        thread.join(10)
    assert journal.journal_publish(changeset_id=changeset.id) == journal.PUBLISHED


# --- the sweep -------------------------------------------------------------------------------


def test_sweep_publishes_only_entries_older_than_the_age(staff, namespace, write, hook, woken):
    old = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    fresh = write(staff, f"{NS}/order/b", {"n": 1}).changeset
    age(old, 120)

    result = journal.journal_sweep(older_than_seconds=60)

    assert result.as_dict() == {"published": 1, "failed": 0, "busy": 0}
    assert gone(old)
    assert entry(fresh).phase == JournalPhase.COMMITTED
    assert hook.calls == [old.id]


def test_sweep_task_uses_the_configured_age(staff, namespace, write, hook, woken, settings):
    settings.ATLAS_JOURNAL_SWEEP_AGE_SECONDS = 0
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    age(changeset, 1)

    assert tasks.journal_sweep.delay().get() == {"published": 1, "failed": 0, "busy": 0}
    assert gone(changeset)


def test_sweep_reports_failures_and_leaves_them_outstanding(staff, namespace, write, hook, woken):
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    age(changeset, 120)
    hook.fail = True

    result = journal.journal_sweep(older_than_seconds=60)

    assert result.as_dict() == {"published": 0, "failed": 1, "busy": 0}
    assert result.left == [str(changeset.id)]
    assert entry(changeset).failures == 1  # kept, with its error, for the next sweep


def test_beat_schedules_both_sweeps_the_archive_retention_and_partition_upkeep():
    schedule = django_settings.CELERY_BEAT_SCHEDULE
    tasks_scheduled = {entry["task"] for entry in schedule.values()}
    assert tasks_scheduled == {
        "changesets.journal_sweep",
        "changesets.subscriptions_wake",
        "changesets.archive_retention",
        "changesets.partition_upkeep",
    }
    from atlas.celery import app

    for name in tasks_scheduled:
        assert name in app.tasks


# --- recover_batches -------------------------------------------------------------------------


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("recover_batches", *args, "--no-progress", stdout=out)
    return out.getvalue()


def test_report_only_lists_outstanding_entries_and_changes_nothing(
    staff, namespace, write, hook, woken
):
    first = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    second = write(staff, f"{NS}/order/b", {"n": 1}).changeset
    JournalEntry.objects.filter(pk=second.pk).update(attempts=3, last_error="boom: it broke")
    age(first, 7300)
    published = write(staff, f"{NS}/order/c", {"n": 1}).changeset
    journal.journal_publish(changeset_id=published.id)
    hook.calls.clear()

    out = run("--report-only")

    assert "2 outstanding journal entries" in out
    lines = {
        line.split()[0]: line for line in out.splitlines() if re.match(r"^[0-9a-f-]{36} ", line)
    }
    assert set(lines) == {str(first.id), str(second.id)}
    assert re.search(r"\b2h0[12]m\b", lines[str(first.id)])  # age
    assert lines[str(second.id)].split()[1] == str(second.seq)
    assert lines[str(second.id)].split()[3] == "3"  # attempts
    assert lines[str(second.id)].endswith("boom: it broke")
    assert hook.calls == []
    assert JournalEntry.objects.count() == 2 and gone(published)
    assert entry(second).attempts == 3


def test_recover_batches_publishes_everything_outstanding(staff, namespace, write, hook, woken):
    made = [write(staff, f"{NS}/order/o{i}", {"n": i}).changeset for i in range(5)]

    out = run()

    assert "Published 5" in out
    assert sorted(hook.calls) == sorted(c.id for c in made)
    assert not JournalEntry.objects.exists()
    assert run() == "Nothing outstanding.\n"
    assert "0 outstanding journal entries" in run("--report-only")


def test_recover_batches_exits_non_zero_when_something_could_not_be_finished(
    staff, namespace, write, hook, woken
):
    write(staff, f"{NS}/order/a", {"n": 1})
    hook.fail = True

    with pytest.raises(CommandError, match="1 journal entry could not be finished"):
        run()

    failed = JournalEntry.objects.get()
    assert failed.phase == JournalPhase.COMMITTED and failed.failures == 1


def test_recover_batches_exit_status_from_the_shell(staff, namespace, write, hook, woken):
    """``call_command`` raises; ``manage.py`` turns that into exit status 1."""
    from django.core.management import ManagementUtility

    write(staff, f"{NS}/order/a", {"n": 1})
    hook.fail = True
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(["manage.py", "recover_batches", "--no-progress"]).execute()
    assert exited.value.code == 1


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_recover_batches_runs_publish_each_entry_once(
    staff, namespace, write, hook, woken, monkeypatch
):
    made = [write(staff, f"{NS}/order/o{i}", {"n": i}).changeset for i in range(12)]
    hook.sleep = 0.02  # long enough for the runs to meet on the same entries
    errors: list[BaseException] = []
    outputs: list[str] = []

    def runner() -> None:
        try:
            outputs.append(run())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=runner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert not errors, errors
    assert sorted(hook.calls) == sorted(c.id for c in made)  # each hook ran once
    assert not JournalEntry.objects.exists()
    published = [int(re.search(r"Published (\d+)", o).group(1)) for o in outputs]
    assert sum(published) == 12


# --- metrics and readiness -------------------------------------------------------------------


def metric(text: str, name: str, /, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric_name, _, label_text = series.partition("{")
        if metric_name != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', label_text))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None


def test_metrics_export_log_journal_and_subscription_figures(
    client, staff, namespace, write, hook, woken, settings
):
    from changesets.outbox import delivery

    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    sub = subscription_create(actor=None, name="idx", url="http://127.0.0.1:9/")
    for i in range(3):
        write(staff, f"{NS}/order/o{i}", {"n": i})
    write(staff, f"{NS}/order/o0", None)
    oldest = JournalEntry.objects.order_by("created_at").first()
    JournalEntry.objects.filter(pk=oldest.pk).update(
        created_at=timezone.now() - timedelta(seconds=90)
    )
    hook.fail = True
    journal.journal_publish(changeset_id=oldest.pk)
    Subscription.objects.filter(pk=sub.pk).update(deliveries_ok=4, deliveries_failed=2)
    client.force_login(staff)
    client.get("/api/v1/changes")
    del delivery

    settings.ATLAS_METRICS_TOKEN = "scrape-secret"
    scrape = {"HTTP_AUTHORIZATION": "Bearer scrape-secret"}
    text = client.get("/metrics", **scrape).content.decode()

    assert metric(text, "atlas_metrics_database_up") == 1
    assert metric(text, "atlas_changesets_total", rpc="PutEntity", target="baseline") == 3
    assert metric(text, "atlas_changesets_total", rpc="DeleteEntity", target="baseline") == 1
    assert metric(text, "atlas_journal_outstanding") == 4
    assert 89 <= metric(text, "atlas_journal_oldest_outstanding_age_seconds") <= 200
    assert metric(text, "atlas_journal_outstanding_retried") == 1
    assert metric(text, "atlas_journal_failures_total") == 1
    labels = {"subscription": str(sub.id), "name": "idx"}
    assert metric(text, "atlas_subscription_deliveries_total", outcome="ok", **labels) == 4
    assert metric(text, "atlas_subscription_deliveries_total", outcome="failed", **labels) == 2
    assert metric(text, "atlas_subscription_lag", **labels) == 4
    assert metric(text, "atlas_subscription_active", **labels) == 1
    assert metric(text, "atlas_feed_watermark_seq") >= 4
    assert metric(text, "atlas_feed_page_seconds_count", surface="pull") >= 1

    # Counted incrementally: a new changeset shows on the next scrape.
    write(staff, f"{NS}/order/o9", {"n": 9})
    again = client.get("/metrics", **scrape).content.decode()
    assert metric(again, "atlas_changesets_total", rpc="PutEntity", target="baseline") == 4

    # The failed entry is published at last, and deleted: its failure still counts.
    hook.fail = False
    assert journal.journal_publish(changeset_id=oldest.pk) == journal.PUBLISHED
    later = client.get("/metrics", **scrape).content.decode()
    assert metric(later, "atlas_journal_failures_total") == 1
    assert metric(later, "atlas_journal_outstanding") == 4
    assert metric(later, "atlas_journal_outstanding_retried") == 0


def test_metrics_still_answer_when_the_database_figures_fail(client, db, monkeypatch, settings):
    from changesets.outbox import metrics

    def broken(self):
        raise RuntimeError("no database")
        yield  # pragma: no cover

    monkeypatch.setattr(metrics.AtlasCollector, "_families", broken)
    settings.ATLAS_METRICS_TOKEN = "scrape-secret"
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret")
    assert response.status_code == 200
    assert metric(response.content.decode(), "atlas_metrics_database_up") == 0


def test_readyz_reports_the_broker(client, db, settings):
    settings.CELERY_BROKER_URL = "memory://"
    ready = client.get("/readyz").json()
    assert ready["checks"]["broker"] == "ok"
    assert ready["status"] == "ok"

    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    started = time.monotonic()
    response = client.get("/readyz")
    assert time.monotonic() - started < 3
    assert response.status_code == 200  # writes still work without the broker
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("error")


def test_readyz_reports_a_lagging_journal_as_degraded(client, staff, namespace, write, settings):
    settings.CELERY_BROKER_URL = "memory://"
    settings.ATLAS_JOURNAL_MAX_LAG_SECONDS = 60
    changeset = write(staff, f"{NS}/order/a", {"n": 1}).changeset
    assert client.get("/readyz").json()["checks"]["journal"] == "ok"  # outstanding, but young

    age(changeset, 90)
    response = client.get("/readyz")

    assert response.status_code == 200  # writes still work; this is a delay, not an outage
    body = response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["journal"].startswith("lagging: oldest unpublished changeset is 9")
    journal.journal_publish(changeset_id=changeset.id)
    assert client.get("/readyz").json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "journal": "ok"},
    }
