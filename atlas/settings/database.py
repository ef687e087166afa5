"""The database: the connection, pooling (a pooler in front, or Django's own pool),
the session options Atlas sends, and read replicas (docs/deploy.md).
"""

from __future__ import annotations

import os
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from atlas.settings.env import env_bool, env_float, env_int

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
        # A connection is replaced after this long (psycopg_pool adds up to 5% of
        # jitter). It also bounds how long its prepared statements keep a plan made
        # from statistics that have since gone stale (docs/deploy.md, "Table
        # statistics and prepared plans"); psycopg_pool's own default is an hour.
        "max_lifetime": env_float("ATLAS_DB_POOL_MAX_LIFETIME_SECONDS", 600),
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
# Parallel query, likewise: a Gather starts its worker processes for every
# execution (about 5 ms each here), which is more than a page's statement costs.
# The planner chose one for the key-filtered /revisions page at 60,000
# changesets (1 ms of work, 15 ms with the workers) because the key rule's
# function is declared expensive (COST 1000, migration 0013). Atlas's reads are
# pages off indexes; an operator's ad-hoc analytics can SET it back per session.
# (Behind a transaction-mode pooler: ALTER ROLE ... SET, docs/deploy.md.)
if not env_bool("ATLAS_DB_PARALLEL", default=False) and not _transaction_pooling:
    _options = DATABASES["default"]["OPTIONS"].get("options", "")
    DATABASES["default"]["OPTIONS"]["options"] = (
        f"{_options} -c max_parallel_workers_per_gather=0"
    ).strip()
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
# timestamptz read by psycopg's C loader where its values are Django's (atlas/timestamps.py).
ATLAS_FAST_TIMESTAMPS = env_bool("ATLAS_FAST_TIMESTAMPS", default=True)
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
