"""Atlas settings, all from the environment (the table under "Configuration" in README.md).

This is Atlas's own project's settings module. The apps never assume it: a
host project has its own, and the apps read every ``ATLAS_*`` setting through
``atlas.conf``, which supplies the defaults (docs/embedding.md).

Development defaults apply only while ``DEBUG`` is on; with ``DEBUG`` off a
missing ``SECRET_KEY`` is an error rather than a silently insecure default.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from atlas import conf as atlas_conf

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


DEBUG = env_bool("DEBUG", default=True)

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "atlas-development-only-secret-key-do-not-use-in-production"

ALLOWED_HOSTS = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
if not ALLOWED_HOSTS and DEBUG:
    ALLOWED_HOSTS = ["localhost", "127.0.0.1", "[::1]", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "guardian",
    "drf_spectacular",
    # Swagger UI's files, served by WhiteNoise from our own origin (no CDN, no @latest).
    "drf_spectacular_sidecar",
    "atlas",
    "entities",
    "changesets",
    "branches",
]

MIDDLEWARE = [
    # First: every response, redirects and refusals included, echoes X-Request-ID.
    "atlas.middleware.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # gzip for clients that accept it (feed pages, lists, history compress ~5-10x),
    # keeping entity ETags strong, which Django's own GZipMiddleware would weaken.
    "atlas.middleware.GZipMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "atlas.middleware.ContentSecurityPolicyMiddleware",
]

# --- HTTPS (docs/deploy.md) ----------------------------------------------------------
# ATLAS_HTTPS=1 is the production stance `manage.py check --deploy` asks for: plain
# HTTP redirects to HTTPS, HSTS, cookies only over HTTPS. The probes and the scrape
# stay reachable over plain HTTP from inside the network (compose's healthcheck hits
# http://127.0.0.1:8000/healthz): these paths are never redirected.
ATLAS_HTTPS = env_bool("ATLAS_HTTPS", default=False)
ATLAS_HTTPS_EXEMPT_PATHS = [r"^healthz$", r"^readyz$", r"^metrics$"]
if ATLAS_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = ATLAS_HTTPS_EXEMPT_PATHS
    SECURE_HSTS_SECONDS = env_int("ATLAS_HSTS_SECONDS", 365 * 24 * 3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("ATLAS_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env_bool("ATLAS_HSTS_PRELOAD", default=True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True


def proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """``"X-Forwarded-Proto: https"`` → Django's ``("HTTP_X_FORWARDED_PROTO", "https")``."""
    if not value.strip():
        return None
    name, sep, expected = value.partition(":")
    name, expected = name.strip(), expected.strip()
    if not sep or not name or not expected or " " in name:
        raise ImproperlyConfigured(
            "ATLAS_PROXY_SSL_HEADER must look like 'X-Forwarded-Proto: https'"
        )
    return "HTTP_" + name.upper().replace("-", "_"), expected


# Behind a proxy that terminates TLS: the header (and value) by which it says the
# client's request was HTTPS. Only set it when that proxy overwrites the header on
# every request; otherwise a client could claim HTTPS.
_proxy_ssl_header = proxy_ssl_header(os.environ.get("ATLAS_PROXY_SSL_HEADER", ""))
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = _proxy_ssl_header

ROOT_URLCONF = "atlas.urls"
WSGI_APPLICATION = "atlas.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database -----------------------------------------------------------------
# docs/deploy.md, "Pooled (PgBouncer / RDS Proxy)". ATLAS_DB_POOLING says what sits
# between Atlas and PostgreSQL: "" (nothing, or a session-mode pooler: a connection
# is one server session for as long as it lives) or "transaction" (PgBouncer's
# pool_mode = transaction, RDS Proxy: each transaction may run on another server
# session, so nothing may live in the session: no session advisory locks, no
# prepared statements, no LISTEN, no server-side cursors, no startup "options").
ATLAS_DB_POOLING = os.environ.get("ATLAS_DB_POOLING", "").strip().lower()
if ATLAS_DB_POOLING in ("none", "session"):
    ATLAS_DB_POOLING = ""
if ATLAS_DB_POOLING not in ("", "transaction"):
    raise ImproperlyConfigured("ATLAS_DB_POOLING must be empty, 'session' or 'transaction'")
_transaction_pooling = ATLAS_DB_POOLING == "transaction"
# A URL that reaches PostgreSQL itself (not the transaction pooler), for the one
# thing that needs a session of its own: the journal relay's LISTEN and leader lock.
# Unset under transaction pooling, the relay polls (ATLAS_JOURNAL_RELAY_POLL_SECONDS).
ATLAS_DIRECT_DATABASE_URL = os.environ.get("ATLAS_DIRECT_DATABASE_URL", "")
# Django's own connection pool (psycopg_pool) in each process: an alternative to a
# pooler in front, for a deployment without one. Connections go back to the pool at
# the end of each request (so persistent connections are off) and are reset there.
ATLAS_DB_POOL = env_bool("ATLAS_DB_POOL", default=False)

_database_url = os.environ.get("DATABASE_URL", "")
if not _database_url:
    from atlas.embedded import database_url as _embedded_database_url

    _database_url = _embedded_database_url()
DATABASES = {
    "default": dj_database_url.parse(
        _database_url,
        conn_max_age=0 if ATLAS_DB_POOL else env_int("ATLAS_DB_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
DATABASES["default"].setdefault("OPTIONS", {})
# Fail fast instead of hanging when PostgreSQL is away (clients get 503).
DATABASES["default"]["OPTIONS"].setdefault(
    "connect_timeout", env_int("ATLAS_DB_CONNECT_TIMEOUT", 5)
)
if _transaction_pooling:
    # A named cursor (QuerySet.iterator()) is a portal in one server session.
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True


def reset_pooled_session(conn: Any) -> None:
    """psycopg_pool's ``reset``: no session state outlives a connection's borrower.

    A connection goes back to the pool at the end of each request or task; a
    session advisory lock it still holds (an Idempotency-Key whose unlock could
    not be confirmed, the journal relay's leader lock) or a LISTEN would
    otherwise pass to the next borrower. Raising discards the connection.
    """
    conn.execute("UNLISTEN *")
    conn.execute("SELECT pg_advisory_unlock_all()")


if ATLAS_DB_POOL:
    DATABASES["default"]["OPTIONS"]["pool"] = {
        "min_size": env_int("ATLAS_DB_POOL_MIN_SIZE", 2),
        "max_size": env_int("ATLAS_DB_POOL_MAX_SIZE", 10),
        # A request waits at most this long for a free connection, then fails (503).
        "timeout": env_float("ATLAS_DB_POOL_TIMEOUT_SECONDS", 10),
        "reset": reset_pooled_session,
    }
# A transaction that stalls while holding the log head's lock (a paused or
# partitioned process) stops every writer; PostgreSQL ends it after this long
# idle inside a transaction (docs/reliability.md, item 2). Legitimate idles
# are short: web writes hold a transaction for milliseconds, journal publishing
# for its hooks plus a broker enqueue, a webhook delivery for one POST
# (ATLAS_WEBHOOK_TIMEOUT_SECONDS); the operator commands do not idle inside
# transactions. 0 turns it off. Under transaction pooling it is not sent (a
# pooler refuses or drops startup "options"): set the pooler's own
# (PgBouncer's idle_transaction_timeout) or the role's (ALTER ROLE ... SET).
ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = env_int(
    "ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", 60
)
if ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS > 0 and not _transaction_pooling:
    _options = DATABASES["default"]["OPTIONS"].get("options", "")
    DATABASES["default"]["OPTIONS"]["options"] = (
        f"{_options} -c idle_in_transaction_session_timeout="
        f"{ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS}s"
    ).strip()
# PostgreSQL's JIT compiles a statement whose estimated cost passes
# jit_above_cost: at ten million changesets the planner's estimate for the
# never-run fallback arm of a scoped as_of_time resolution passed it, and every
# such request paid 11 ms of compilation for a 0.2 ms execution (issue 18).
# Atlas's statements are index seeks that return a page; JIT never pays off.
# (Not as a startup option behind a transaction-mode pooler, which refuses them:
# set jit = off on the database or role there, docs/deploy.md.)
if not env_bool("ATLAS_DB_JIT", default=False) and not _transaction_pooling:
    _options = DATABASES["default"]["OPTIONS"].get("options", "")
    DATABASES["default"]["OPTIONS"]["options"] = f"{_options} -c jit=off".strip()
# The hot statements (role lookup, a write's lock and log statement) are prepared
# once per connection (atlas/db.py). Prepared statements live in the server
# session, so they are off under transaction pooling (PgBouncer 1.18, Debian 12's,
# has no protocol-level prepared statements; docs/deploy.md).
ATLAS_DB_PREPARED_STATEMENTS = env_bool(
    "ATLAS_DB_PREPARED_STATEMENTS", default=not _transaction_pooling
)
if ATLAS_DB_PREPARED_STATEMENTS:
    # Django passes None (never prepare); only atlas.db's cursors ask to. Their
    # statements look rows up by key arrays through unique indexes, a plan that
    # fits every size: the generic plan skips planning on each execution
    # (PostgreSQL kept re-planning the lock statement for each write).
    DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", 5)
    if not _transaction_pooling:
        _options = DATABASES["default"]["OPTIONS"].get("options", "")
        DATABASES["default"]["OPTIONS"]["options"] = (
            f"{_options} -c plan_cache_mode=force_generic_plan"
        ).strip()
else:
    # psycopg never prepares (Django's default, said out loud): atlas.db's cursors
    # still bind server-side, in unnamed statements, which any pooler passes.
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = None
# libpq TCP keepalives: a connection to a PostgreSQL that vanished (host down,
# network cut) fails after idle + interval x count seconds instead of the OS's
# two hours, so a worker waiting on it answers 503 rather than hanging. 0 keeps
# the OS defaults.
ATLAS_DB_KEEPALIVES_IDLE_SECONDS = env_int("ATLAS_DB_KEEPALIVES_IDLE_SECONDS", 30)
if ATLAS_DB_KEEPALIVES_IDLE_SECONDS > 0:
    for _name, _value in (
        ("keepalives", 1),
        ("keepalives_idle", ATLAS_DB_KEEPALIVES_IDLE_SECONDS),
        ("keepalives_interval", env_int("ATLAS_DB_KEEPALIVES_INTERVAL_SECONDS", 10)),
        ("keepalives_count", env_int("ATLAS_DB_KEEPALIVES_COUNT", 3)),
    ):
        DATABASES["default"]["OPTIONS"].setdefault(_name, _value)

# --- read replicas (docs/deploy.md, "Read replicas") ------------------------------
# ATLAS_READ_DATABASE_URLS: comma-separated URLs of streaming replicas of DATABASE_URL.
# Each becomes an alias replica1, replica2, ... with the primary's OPTIONS (timeouts,
# keepalives, prepared statements). atlas.replicas routes the log's read endpoints
# there; writes, preconditions and authorization always use "default". Migrations
# never run on them (the router), and in test runs they mirror "default", so the
# suite behaves the same whether or not the variable is set.


def read_databases(urls: str, primary: Any) -> dict[str, Any]:
    """``{"replica1": {...}, ...}`` for a comma-separated list of replica URLs."""
    aliases: dict[str, Any] = {}
    for number, url in enumerate((u.strip() for u in urls.split(",") if u.strip()), 1):
        config: Any = dj_database_url.parse(
            url, conn_max_age=primary["CONN_MAX_AGE"], conn_health_checks=True
        )
        config["OPTIONS"] = {**primary["OPTIONS"], **config.get("OPTIONS", {})}
        config["TEST"] = {"MIRROR": "default"}
        aliases[f"replica{number}"] = config
    return aliases


_read_databases = read_databases(
    os.environ.get("ATLAS_READ_DATABASE_URLS", ""), DATABASES["default"]
)
DATABASES.update(_read_databases)
# The aliases atlas.replicas may route reads to (tests point it at a real replica).
ATLAS_READ_DATABASE_ALIASES = list(_read_databases)
DATABASE_ROUTERS = ["atlas.replicas.ReplicaRouter"]
# Picks a replica for the read endpoints; after authentication, so users and sessions are
# read from the primary. It does nothing while no replica is configured.
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "atlas.replicas.ReplicaReadMiddleware",
)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "guardian.backends.ObjectPermissionBackend",
]
ANONYMOUS_USER_NAME = None  # guardian: no anonymous user object; anonymous gets 401

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("ATLAS_STATIC_ROOT", BASE_DIR / ".atlas" / "static"))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # whitenoise warns on a missing folder
# Not the Manifest variant: tests run with DEBUG off and no collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
    # Archive segments and checkpoints (docs/retention.md): a local folder by default;
    # S3-compatible storage through django-storages is a STORAGES entry like any other.
    "atlas_archive": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {
            "location": os.environ.get("ATLAS_ARCHIVE_DIR", str(BASE_DIR / ".atlas" / "archive"))
        },
    },
}

# --- Atlas ----------------------------------------------------------------------
ATLAS_MAX_CONTENT_BYTES = env_int("ATLAS_MAX_CONTENT_BYTES", 1024 * 1024)
ATLAS_MAX_BATCH_OPS = env_int("ATLAS_MAX_BATCH_OPS", 10_000)
# A whole request body may carry many contents (a batch), so its cap is separate.
ATLAS_MAX_BODY_BYTES = env_int("ATLAS_MAX_BODY_BYTES", 64 * 1024 * 1024)
ATLAS_DEV_AUTHOR_HEADER = env_bool("ATLAS_DEV_AUTHOR_HEADER", default=False)
ATLAS_IDEMPOTENCY_TTL_HOURS = env_int("ATLAS_IDEMPOTENCY_TTL_HOURS", 24)
# Under transaction pooling an Idempotency-Key's attempt holds a lease, not a session
# lock (atlas.api.idempotency): a retry within this long of a killed attempt is "in
# progress" (409). Longer than a request can run (gunicorn's default timeout is 30 s);
# a slower attempt is not unsafe, only superseded: its write rolls back.
ATLAS_IDEMPOTENCY_LEASE_SECONDS = env_float("ATLAS_IDEMPOTENCY_LEASE_SECONDS", 60)
ATLAS_ALLOW_PRIVATE_WEBHOOKS = env_bool("ATLAS_ALLOW_PRIVATE_WEBHOOKS", default=DEBUG)
# /metrics answers superusers and a scraper sending "Authorization: Bearer <this>";
# empty = no bearer token accepted (docs/feed.md, "Metrics").
ATLAS_METRICS_TOKEN = os.environ.get("ATLAS_METRICS_TOKEN", "")

# Proxies (IPs or CIDRs) whose X-Forwarded-For is believed: a changeset's context.ip is
# then its right-most address that is not one of them (atlas.api.provenance). Empty:
# the peer is the client. Checked here so a typo fails at start-up, not on a write.
ATLAS_TRUSTED_PROXIES = [
    p.strip() for p in os.environ.get("ATLAS_TRUSTED_PROXIES", "").split(",") if p.strip()
]
for _proxy in ATLAS_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"ATLAS_TRUSTED_PROXIES: {_proxy!r} is no IP or CIDR") from _exc

# Sent on every HTML response: the admin and /api/docs/ (atlas.middleware). Scripts,
# styles, images and fonts from our own origin only; no plugins, no framing. Inline
# styles stay allowed: the admin's change list and Swagger UI's page carry a <style>
# block and Swagger UI sets style attributes; inline scripts do not run.
ATLAS_CONTENT_SECURITY_POLICY = os.environ.get(
    "ATLAS_CONTENT_SECURITY_POLICY", atlas_conf.CONTENT_SECURITY_POLICY
)

# Django's own body cap answers 400; Atlas enforces ATLAS_MAX_BODY_BYTES itself to answer 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = None

# --- REST framework -------------------------------------------------------------
# Atlas's views need these DRF and drf-spectacular settings; atlas.conf holds them so
# that a host project merges the same dicts (docs/embedding.md).
REST_FRAMEWORK: dict[str, Any] = dict(atlas_conf.REST_FRAMEWORK)
SPECTACULAR_SETTINGS: dict[str, Any] = dict(atlas_conf.SPECTACULAR_SETTINGS)

# --- Celery -----------------------------------------------------------------------
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

# Archive and retention (docs/retention.md).
ATLAS_ARCHIVE_SIGNING_KEY = os.environ.get("ATLAS_ARCHIVE_SIGNING_KEY", "")
ATLAS_ARCHIVE_LOCATION = os.environ.get("ATLAS_ARCHIVE_LOCATION", "")
ATLAS_ARCHIVE_SEGMENT_REVISIONS = env_int("ATLAS_ARCHIVE_SEGMENT_REVISIONS", 100_000)
ATLAS_ARCHIVE_DELETE_BATCH = env_int("ATLAS_ARCHIVE_DELETE_BATCH", 2_000)
ATLAS_ARCHIVE_GRACE_SECONDS = env_float("ATLAS_ARCHIVE_GRACE_SECONDS", 10)
ATLAS_ARCHIVE_CUT_CACHE_SECONDS = env_float("ATLAS_ARCHIVE_CUT_CACHE_SECONDS", 2)
ATLAS_RETENTION_DAYS = env_int("ATLAS_RETENTION_DAYS", 0)
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
    "archive-retention": {
        "task": "changesets.archive_retention",
        "schedule": ATLAS_RETENTION_INTERVAL_SECONDS,
        "options": {"expires": ATLAS_RETENTION_INTERVAL_SECONDS},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
    "loggers": {
        "pgserver": {"level": "WARNING"},
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
