"""Celery, and the post-commit work it runs: the journal relay and sweep, and the
change feed's webhooks (docs/feed.md, docs/reliability.md).
"""

from __future__ import annotations

import os

from atlas.settings.env import BASE_DIR, env_bool, env_float, env_int

_broker_dir = BASE_DIR / ".atlas" / "broker"
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "") or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    # The embedded default: a folder queue that needs no server (kombu's
    # filesystem transport). Fine for one machine; use Redis/RabbitMQ beyond.
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        "polling_interval": 0.2,
    }
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", default=False)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(BASE_DIR / ".atlas" / "celerybeat-schedule")
# Celery's Django fixup closes every database connection after every task unless this
# is set (it then closes them every 2 × this many tasks): a new PostgreSQL session per
# pump or sweep task. Connections follow Django's CONN_MAX_AGE instead, applied around
# each task by atlas.celery.apply_django_connection_rule.
CELERY_DB_REUSE_MAX = 2**31


# The web tier enqueues only a subscription's pump after a change to it: when the broker
# is unreachable, fail fast (the beat's wake-up finds it) rather than hold the response.
CELERY_BROKER_CONNECTION_TIMEOUT = env_float("ATLAS_BROKER_CONNECT_TIMEOUT_SECONDS", 2)
# One queue name per deployment (tests use their own so parallel runs never share messages).
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "") or "celery"

# The journal (post-commit work) and the change feed's push side (docs/feed.md).
# A committed changeset's journal entry is published one way: by the journal relay
# (changesets/outbox/relay.py), woken by NOTIFY, in sets (enqueued for a worker only
# when changeset_committed hooks are registered); the web tier does no broker work.
# The beat sweep and `manage.py recover_batches` finish what is left.
# Every Celery worker runs the relay (a session advisory lock keeps one active);
# off, run `manage.py journal_relay` somewhere instead.
ATLAS_JOURNAL_RELAY_IN_WORKER = env_bool("ATLAS_JOURNAL_RELAY_IN_WORKER", default=True)
# The relay checks for outstanding entries at least this often (a standby
# relay retries the lock as often), besides waking on each NOTIFY.
ATLAS_JOURNAL_RELAY_POLL_SECONDS = env_float("ATLAS_JOURNAL_RELAY_POLL_SECONDS", 5)
# After a NOTIFY the relay waits this long for more commits to share one batch
# (latency to subscribers vs statements and pump messages under load).
ATLAS_JOURNAL_RELAY_LINGER_MS = env_float("ATLAS_JOURNAL_RELAY_LINGER_MS", 10)
# While commits stream in, the relay passes at most this often (each pass takes all
# that committed meanwhile); after a quiet spell a commit waits only the linger above.
ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS = env_float("ATLAS_JOURNAL_RELAY_STREAM_LINGER_MS", 50)
ATLAS_JOURNAL_SWEEP_AGE_SECONDS = env_float("ATLAS_JOURNAL_SWEEP_AGE_SECONDS", 60)
# /readyz reports "degraded" (still 200) when the oldest unpublished journal entry is
# older than this: the relay or the workers are down or cannot keep up.
ATLAS_JOURNAL_MAX_LAG_SECONDS = env_float("ATLAS_JOURNAL_MAX_LAG_SECONDS", 60)
ATLAS_JOURNAL_SWEEP_INTERVAL_SECONDS = env_float("ATLAS_JOURNAL_SWEEP_INTERVAL_SECONDS", 30)
ATLAS_SUBSCRIPTION_SWEEP_INTERVAL_SECONDS = env_float(
    "ATLAS_SUBSCRIPTION_SWEEP_INTERVAL_SECONDS", 30
)
ATLAS_WEBHOOK_TIMEOUT_SECONDS = env_float("ATLAS_WEBHOOK_TIMEOUT_SECONDS", 10)
ATLAS_WEBHOOK_PAGE_SIZE = env_int("ATLAS_WEBHOOK_PAGE_SIZE", 100)
ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS = env_float("ATLAS_WEBHOOK_BACKOFF_BASE_SECONDS", 2)
ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS = env_float("ATLAS_WEBHOOK_BACKOFF_MAX_SECONDS", 600)
ATLAS_WEBHOOK_MAX_PAGES_PER_RUN = env_int("ATLAS_WEBHOOK_MAX_PAGES_PER_RUN", 50)
# Under load, a subscription's deliveries (and the relay's wakes of its pump) are at
# least this far apart unless a page is full, so records gather into fewer, larger
# deliveries; a quiet subscription is not delayed. 0: each as soon as possible.
ATLAS_WEBHOOK_COALESCE_MS = env_float("ATLAS_WEBHOOK_COALESCE_MS", 100)
ATLAS_WEBHOOK_MAX_SECONDS_PER_RUN = env_float("ATLAS_WEBHOOK_MAX_SECONDS_PER_RUN", 60)
# A delivery body never exceeds this; a bigger changeset goes in parts (docs/feed.md).
ATLAS_WEBHOOK_MAX_BODY_BYTES = env_int("ATLAS_WEBHOOK_MAX_BODY_BYTES", 1024 * 1024)
# A delivery failing this many times in a row parks until an operator retries or skips it.
ATLAS_WEBHOOK_MAX_ATTEMPTS = env_int("ATLAS_WEBHOOK_MAX_ATTEMPTS", 20)
# After rotate-secret, deliveries are signed with the old secret too for this long.
ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS = env_float("ATLAS_WEBHOOK_SECRET_OVERLAP_SECONDS", 86400)

# How often beat runs the archive's retention task (docs/retention.md).
ATLAS_PARTITION_UPKEEP_INTERVAL_SECONDS = env_float("ATLAS_PARTITION_UPKEEP_INTERVAL_SECONDS", 600)
ATLAS_RETENTION_INTERVAL_SECONDS = env_float("ATLAS_RETENTION_INTERVAL_SECONDS", 86400)
CELERY_BEAT_SCHEDULE: dict = {
    "journal-sweep": {
        "task": "changesets.journal_sweep",
        "schedule": ATLAS_JOURNAL_SWEEP_INTERVAL_SECONDS,
        # A sweep queued while no worker ran is stale by the next one.
        "options": {"expires": ATLAS_JOURNAL_SWEEP_INTERVAL_SECONDS},
    },
    "subscriptions-wake": {
        "task": "changesets.subscriptions_wake",
        "schedule": ATLAS_SUBSCRIPTION_SWEEP_INTERVAL_SECONDS,
        "options": {"expires": ATLAS_SUBSCRIPTION_SWEEP_INTERVAL_SECONDS},
    },
    # Applies ATLAS_RETENTION_DAYS and the namespaces' retention (a no-op when none is
    # set) and finishes any interrupted cut or erasure rewrite of the archive.
    # Revision partitions ahead of the log head (changesets.partitions; also run by
    # migrate, the archiver and a check after each journal publish).
    "partition-upkeep": {
        "task": "changesets.partition_upkeep",
        "schedule": ATLAS_PARTITION_UPKEEP_INTERVAL_SECONDS,
        "options": {"expires": ATLAS_PARTITION_UPKEEP_INTERVAL_SECONDS},
    },
    "archive-retention": {
        "task": "changesets.archive_retention",
        "schedule": ATLAS_RETENTION_INTERVAL_SECONDS,
        "options": {"expires": ATLAS_RETENTION_INTERVAL_SECONDS},
    },
}
