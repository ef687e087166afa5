"""Timestamps come back through psycopg's C loader, with exactly Django's values.

``atlas.timestamps``: Django's own ``timestamptz`` loader parses with a regular
expression; where the C loader's values are the same (Django wants UTC, the
session is in UTC) each connection uses it instead. Where they would differ,
Django's stays.
"""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg.pq import Format

from atlas.timestamps import TIMESTAMPTZ_OID, UtcTimestampLoader, fast_loader_applies
from changesets.models import Changeset

pytestmark = pytest.mark.django_db

# Written in several offsets and precisions, far apart in time; each comes back in UTC.
VALUES = [
    "2026-12-07 12:00:00+00",
    "2026-12-07 12:00:00.5+05:30",
    "1999-12-31 23:59:59.999999-08",
    "2000-02-29 00:00:00.000001+14",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    "1970-01-01 00:00:00.123+00",
    "2024-03-31 02:30:00 Europe/Paris",
]
SQL = "SELECT v::timestamptz FROM unnest(%s::text[]) v"


def loader_of(cursor) -> type:
    return cursor.cursor.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)


def test_a_connections_cursors_read_timestamps_with_the_c_loader():
    with connection.cursor() as cursor:
        assert fast_loader_applies(connection)
        assert loader_of(cursor) is UtcTimestampLoader
        cursor.execute("SELECT now()")
        assert cursor.fetchone()[0].tzinfo is datetime.UTC


def test_the_values_are_djangos_to_the_microsecond_and_the_tzinfo():
    with connection.cursor() as cursor:
        cursor.execute(SQL, [VALUES])
        fast = [row[0] for row in cursor.fetchall()]
    with connection.cursor() as cursor:
        register_tzloader(datetime.UTC, cursor.cursor)  # Django's own, on this cursor
        assert loader_of(cursor) is not UtcTimestampLoader
        cursor.execute(SQL, [VALUES])
        django = [row[0] for row in cursor.fetchall()]
    assert len(fast) == len(VALUES)
    for mine, theirs in zip(fast, django, strict=True):
        assert (mine, mine.isoformat()) == (theirs, theirs.isoformat())
        assert mine.tzinfo is theirs.tzinfo is datetime.UTC
    assert fast[1] == datetime.datetime(2026, 12, 7, 6, 30, 0, 500000, tzinfo=datetime.UTC)


def test_the_orm_reads_what_it_wrote(write, writer, namespace):
    result = write(writer, f"{namespace.name}/item/a", {"n": 1})
    at = Changeset.objects.values_list("at", flat=True).get(id=result.changeset.id)
    assert at == result.changeset.at and at.tzinfo is datetime.UTC


def test_a_connection_django_reads_in_another_time_zone_keeps_djangos_loader():
    other = connection.copy()
    other.settings_dict["TIME_ZONE"] = "Europe/Paris"
    try:
        with other.cursor() as cursor:
            assert not fast_loader_applies(other)
            assert loader_of(cursor) is not UtcTimestampLoader
            cursor.execute("SELECT '2026-07-01 12:00:00+00'::timestamptz")
            value = cursor.fetchone()[0]
        assert value.utcoffset() == datetime.timedelta(hours=2)
        assert value == datetime.datetime(2026, 7, 1, 12, tzinfo=datetime.UTC)
    finally:
        other.close()


def test_a_reused_connection_registers_the_loader_once():
    from atlas.timestamps import use_fast_timestamps

    adapters = connection.connection.adapters
    before = adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
    use_fast_timestamps(sender=None, connection=connection)
    assert adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is before is UtcTimestampLoader


def test_a_host_can_keep_djangos_loader(settings):
    settings.ATLAS_FAST_TIMESTAMPS = False
    other = connection.copy()
    try:
        with other.cursor() as cursor:
            assert fast_loader_applies(other)  # it could, but the setting says no
            assert loader_of(cursor) is not UtcTimestampLoader
    finally:
        other.close()
