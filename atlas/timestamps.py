"""Timestamps read by psycopg's C loader, not Django's regular expression.

Django's psycopg 3 backend registers on every connection a ``timestamptz``
loader that subclasses psycopg's pure-Python one (so that it can set the
``tzinfo`` Django wants), and so parses each value with a regular expression:
about 3.3 µs a value on the benchmark machine, where psycopg's C loader takes
0.1 µs (Django ticket #36960; psycopg's C loaders cannot be subclassed,
psycopg #1273). Atlas reads timestamps by the thousand: two per locked row of
a batch, one or two per revision and changeset of a history or feed page.

When Django wants UTC (``USE_TZ``, no per-database ``TIME_ZONE``) and the
session's time zone is ``UTC``, the C loader returns exactly what Django's
does: aware datetimes whose ``tzinfo`` is ``datetime.timezone.utc``
(``tests/atlas/test_timestamps.py`` compares them value by value). Then each new
connection gets :class:`UtcTimestampLoader`, which hands every value to the C
loader. In any other set-up Django's loader stays, as does the pure-Python one
when psycopg has no C implementation, or when ``ATLAS_FAST_TIMESTAMPS`` is False.
"""

from __future__ import annotations

import datetime
from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg import abc
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.types.datetime import TimestamptzLoader as PythonTimestamptzLoader

from atlas import conf

TIMESTAMPTZ_OID = psycopg.postgres.types["timestamptz"].oid
# The global map holds the C class where psycopg has one (psycopg[binary] or psycopg[c]).
_FAST: type[abc.Loader] = (
    psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) or PythonTimestamptzLoader
)


class UtcTimestampLoader(Loader):
    """``timestamptz`` through psycopg's C loader, in a class Django accepts.

    Django reads ``timezone`` off the connection's loader before every cursor
    (``DatabaseWrapper.create_cursor``), and registers its own on the cursor when
    it differs; the C class has no such attribute and cannot be subclassed, so
    this one carries it and gives each instance the C loader's bound ``load``.
    """

    timezone = datetime.UTC

    def __init__(self, oid: int, context: abc.AdaptContext | None = None):
        super().__init__(oid, context)
        # The transformer looks ``load`` up on the instance: the C method, no frame of ours.
        self.load = _FAST(oid, context).load  # type: ignore[method-assign]

    def load(self, data: Any) -> datetime.datetime:  # pragma: no cover - shadowed per instance
        raise AssertionError("UtcTimestampLoader.load is replaced in __init__")


def fast_loader_applies(wrapper: BaseDatabaseWrapper) -> bool:
    """Whether the C loader gives exactly Django's values on this connection."""
    if wrapper.vendor != "postgresql" or _FAST is PythonTimestamptzLoader:
        return False
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):  # psycopg2, or not connected
        return False
    return (
        wrapper.timezone is datetime.UTC
        and raw.info.parameter_status("TimeZone") == "UTC"
        and (raw.info.parameter_status("DateStyle") or "").startswith("ISO")
    )


def use_fast_timestamps(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: register :class:`UtcTimestampLoader` where it applies.

    Idempotent: a pooled connection comes back through here on every checkout.
    ``ATLAS_FAST_TIMESTAMPS = False`` keeps Django's loader (a host project's
    connections pass here too).
    """
    if not conf.get("ATLAS_FAST_TIMESTAMPS") or not fast_loader_applies(connection):
        return
    adapters = connection.connection.adapters
    if adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not UtcTimestampLoader:
        adapters.register_loader(TIMESTAMPTZ_OID, UtcTimestampLoader)
