"""Cursors for the hot statements: every request's role lookup, every write's
lock and log statement.

Django's psycopg cursors bind parameters on the client: the values are
quoted into the SQL text, so PostgreSQL parses and plans every execution
afresh. The write path runs two big statements per changeset (the lock, and
the one that writes the rows and the log), and planning them, with the role
lookup's four-armed UNION, was a good part of a single write's server time.
:func:`prepared_cursor` binds server-side and prepares each statement once per
connection (one text per statement shape), and settings make PostgreSQL keep
one generic plan for prepared statements (``plan_cache_mode``), so later
executions skip parse and plan. Django's own cursors never prepare, so nothing
else is affected.

Prepared statements live in the server session: behind a pooler in
transaction mode they break, as the Idempotency-Key lock does (docs/api.md).
``ATLAS_DB_PREPARED_STATEMENTS=0`` turns preparing off (server-side binding stays).
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import CursorDebugWrapper, ServerBindingCursor
from django.db.backends.utils import CursorWrapper


class _PreparingCursor(ServerBindingCursor):
    """psycopg's server-binding cursor, preparing every statement it runs.

    psycopg prepares only on connections with a ``prepare_threshold`` (Django
    sets none, for poolers' sake); settings set one when
    ``ATLAS_DB_PREPARED_STATEMENTS`` is on. Django's own cursors bind client-side
    and never prepare, whatever the threshold.
    """

    def execute(self, query: Any, params: Any = None, *, prepare: bool = True, **kw: Any) -> Any:
        # django-stubs types ServerBindingCursor without its psycopg base (psycopg.Cursor).
        return super().execute(query, params, prepare=prepare, **kw)  # type: ignore[misc]


class _DebugWrapper(CursorDebugWrapper):
    """Logs the statement as written (placeholders) with its parameters: Django
    reads the logged SQL back from a client-binding cursor, which this is not."""

    def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


class _Kept:
    """Leaving ``with`` keeps the psycopg cursor for the connection's next statement
    (a new one costs an adapters-map copy; the write path runs three a request)."""

    def __exit__(self, *exc: object) -> None:
        return None


class _KeptCursor(_Kept, CursorWrapper):
    pass


class _KeptDebugCursor(_Kept, _DebugWrapper):
    pass


_CURSOR_ATTR = "_atlas_prepared_cursor"


def prepared_cursor(db: BaseDatabaseWrapper | None = None) -> CursorWrapper:
    """A Django cursor (query logging, execute wrappers, error translation as
    ``connection.cursor()``) that binds server-side and prepares its statements,
    on ``db`` (default: the default database; a read from a replica passes
    ``atlas.replicas.read_connection()``).

    One psycopg cursor per database connection (so per thread) serves every
    call: finish with one (fetch what you need) before asking for the next.
    Parameters need the types PostgreSQL can't infer spelled out (``%s::int``
    for a possibly-NULL value in a SELECT list, for instance): server-side, a
    NULL or an untyped value is not a literal the parser can coerce.

    Prepare only statements whose text repeats (values as parameters): each text
    is a prepared statement of the session, and its one generic plan is the point.
    A read over every partition of the log gains most: PostgreSQL plans each
    partition of each table it names, which grows with the log (about 2 ms for
    the trash's walk at 13 partitions); the generic plan prunes by the
    parameters when it starts, and is planned once per connection.
    """
    db = db if db is not None else connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    db.validate_thread_sharing()
    raw = db.connection
    cursor = db.__dict__.get(_CURSOR_ATTR)
    if cursor is None or cursor.closed or cursor.connection is not raw:
        # psycopg.Cursor(connection): the stubs know no base (see _PreparingCursor).
        cursor = db.__dict__[_CURSOR_ATTR] = _PreparingCursor(raw)  # type: ignore[call-arg]
    return (_KeptDebugCursor if db.queries_logged else _KeptCursor)(cursor, db)
