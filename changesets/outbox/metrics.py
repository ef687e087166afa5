"""Prometheus metrics for the log, the journal and the change feed.

Why most of them are read from PostgreSQL at scrape time: Atlas runs several
processes (two gunicorn workers, Celery workers), and an in-process counter
only counts what its own process did, while a scrape reaches one process at
random. The database is the one place that knows the totals, so:

- ``atlas_changesets_total{rpc,target}`` counts changeset rows. The first
  scrape of a process counts them all; later scrapes count only rows with a
  higher ``seq`` than the last one counted. That is exact because the log is
  append-only (invariant 7) and seq order is commit order (invariant 6).
- journal and subscription figures are read from their rows (outstanding
  entries use the ``journal_pending`` partial index), so they are equal
  whichever process answers. Failed journal attempts are read from the one
  ``JournalTally`` row: a published entry is deleted, and its own ``failures``
  with it, so their sum would go down, which a counter must never do.

The feed page latency histogram is genuinely per process. With several web
workers set ``PROMETHEUS_MULTIPROC_DIR`` (an empty, writable directory) for
all of them: ``/metrics`` then aggregates every process's histogram
(prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from django.db.models import Count, Max, Q
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, Histogram, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from changesets.models import Changeset, JournalEntry, JournalPhase, JournalTally, Subscription
from changesets.selectors import feed

logger = logging.getLogger(__name__)

FEED_PAGE_SECONDS = Histogram(
    "atlas_feed_page_seconds",
    "Time to build one change-feed page (pull: GET /changes; push: a subscription pump).",
    ["surface"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


@contextmanager
def feed_page_timer(surface: str) -> Iterator[None]:
    """Time one feed page into ``atlas_feed_page_seconds{surface}``.

    The caller times the page, not the feed selector: the caller knows the
    surface (``pull`` for ``GET /changes``, ``push`` for a pump), and the
    selector stays free of this module, which reads the feed for its gauges.
    """
    started = time.perf_counter()
    try:
        yield
    finally:
        FEED_PAGE_SECONDS.labels(surface=surface).observe(time.perf_counter() - started)


class _ChangesetCounts:
    """Changesets per (rpc, target), counted incrementally by seq."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_seq = 0
        self.counts: dict[tuple[str, str], int] = {}

    def read(self) -> dict[tuple[str, str], int]:
        with self.lock:
            head = Changeset.objects.aggregate(m=Max("seq"))["m"] or 0
            if head < self.last_seq:  # the log was truncated (tests): start over
                self.last_seq, self.counts = 0, {}
            if head > self.last_seq:
                rows = (
                    Changeset.objects.filter(seq__gt=self.last_seq, seq__lte=head)
                    .values("rpc", "branch")
                    .annotate(n=Count("seq"))
                    .order_by()
                )
                for row in rows:
                    target = "baseline" if row["branch"] == "" else "branch"
                    key = (row["rpc"], target)
                    self.counts[key] = self.counts.get(key, 0) + row["n"]
                self.last_seq = head
            return dict(self.counts)


_changeset_counts = _ChangesetCounts()


def journal_lag_seconds() -> float:
    """Age of the oldest outstanding journal entry in seconds (0 when none).

    One seek on ``journal_pending``: ``created_at`` never decreases in seq
    order, so the lowest outstanding seq is the oldest. ``/readyz`` asks this
    on every probe, so it must not cost what the backlog holds.
    """
    oldest = (
        JournalEntry.objects.filter(phase=JournalPhase.COMMITTED)
        .order_by("seq")
        .values_list("created_at", flat=True)
        .first()
    )
    return max((timezone.now() - oldest).total_seconds(), 0.0) if oldest else 0.0


class AtlasCollector(Collector):
    """Reads the figures that must agree across processes from the database."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "atlas_metrics_database_up", "1 when the database figures below could be read."
        )
        try:
            families = list(self._families())
        except Exception:  # noqa: BLE001 - a scrape must answer even when the DB is away
            logger.warning("could not read metrics from the database", exc_info=True)
            connection.close_if_unusable_or_obsolete()
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _families(self) -> Iterator[Metric]:
        yield from self._log_families()
        yield from self._journal_families()
        yield from self._subscription_families()

    def _log_families(self) -> Iterator[Metric]:
        written = CounterMetricFamily(
            "atlas_changesets",
            "Changesets written, by rpc and target (baseline or branch).",
            labels=["rpc", "target"],
        )
        for (rpc, target), n in sorted(_changeset_counts.read().items()):
            written.add_metric([rpc, target], n)
        yield written

        mark = feed.watermark()
        yield GaugeMetricFamily(
            "atlas_feed_watermark_seq",
            "seq of the newest committed baseline changeset.",
            value=mark["seq"],
        )

    def _journal_families(self) -> Iterator[Metric]:
        outstanding = JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).aggregate(
            n=Count("pk"), retried=Count("pk", filter=Q(attempts__gt=0))
        )
        yield GaugeMetricFamily(
            "atlas_journal_outstanding",
            "Journal entries still 'committed' (post-commit work not yet finished).",
            value=outstanding["n"],
        )
        yield GaugeMetricFamily(
            "atlas_journal_oldest_outstanding_age_seconds",
            "Age of the oldest outstanding journal entry (0 when none).",
            value=journal_lag_seconds(),
        )
        yield GaugeMetricFamily(
            "atlas_journal_outstanding_retried",
            "Outstanding journal entries that have already failed at least once.",
            value=outstanding["retried"],
        )
        failures = JournalTally.objects.filter(pk=1).values_list("failures", flat=True).first()
        yield CounterMetricFamily(
            "atlas_journal_failures",
            "Failed journal attempts: a changeset_committed hook raised, or the"
            " subscription pumps could not be woken (broker down).",
            value=failures or 0,
        )

    def _subscription_families(self) -> Iterator[Metric]:
        deliveries = CounterMetricFamily(
            "atlas_subscription_deliveries",
            "Webhook deliveries per subscription, by outcome (ok = 2xx).",
            labels=["subscription", "name", "outcome"],
        )
        lag = GaugeMetricFamily(
            "atlas_subscription_lag",
            "Baseline changesets in the subscription's namespaces not yet delivered.",
            labels=["subscription", "name"],
        )
        failing = GaugeMetricFamily(
            "atlas_subscription_consecutive_failures",
            "Failed deliveries since the subscription's last success.",
            labels=["subscription", "name"],
        )
        active = GaugeMetricFamily(
            "atlas_subscription_active",
            "1 when the subscription is active.",
            labels=["subscription", "name"],
        )
        parked = GaugeMetricFamily(
            "atlas_subscription_parked",
            "1 when the subscription's delivery is parked (dead letter) awaiting retry or skip.",
            labels=["subscription", "name"],
        )
        parked_total = 0
        for sub in Subscription.objects.order_by("created_at", "id"):
            labels = [str(sub.id), sub.name]
            deliveries.add_metric([*labels, "ok"], sub.deliveries_ok)
            deliveries.add_metric([*labels, "failed"], sub.deliveries_failed)
            lag.add_metric(
                labels,
                feed.changesets_after(after_seq=sub.cursor_seq, namespaces=sub.namespaces or None),
            )
            failing.add_metric(labels, sub.consecutive_failures)
            active.add_metric(labels, 1 if sub.active else 0)
            parked.add_metric(labels, 0 if sub.parked_seq is None else 1)
            parked_total += sub.parked_seq is not None
        yield deliveries
        yield lag
        yield failing
        yield active
        yield parked
        yield GaugeMetricFamily(
            "atlas_subscriptions_parked",
            "Subscriptions whose delivery is parked, waiting for an operator's retry or skip.",
            value=parked_total,
        )


_collector = AtlasCollector()
_registered = False
_register_lock = threading.Lock()


def _ensure_registered() -> None:
    global _registered
    with _register_lock:
        if not _registered:
            REGISTRY.register(_collector)
            _registered = True


def scrape_registry() -> Any:
    """The registry ``/metrics`` renders.

    Without ``PROMETHEUS_MULTIPROC_DIR``: the default registry (this process's
    metrics, process and platform collectors) plus the database collector.
    With it: every process's metrics merged from that directory, plus the
    database collector.
    """
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(_collector)
        return registry
    _ensure_registered()
    return REGISTRY
