"""Lay the (empty) log tables out on chosen partitions, and put the standard layout back."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection

from atlas import conf
from bench._sqltime import prepared
from changesets import partitions, repartition


def layout(
    bounds: Iterable[tuple[int, int]], parents: Iterable[str] = partitions.PARENTS
) -> list[partitions.Partition]:
    """Put the (empty) log tables of ``parents`` on ``bounds``; the revision table's
    partitions."""
    repartition.lay_out(list(bounds), tuple(parents))
    return partitions.partitions()


def parent_index(name: str) -> str:
    """The index of the revision table a partition's index belongs to (``name`` itself
    when it is not a partition's): plans name the partitions' own indexes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_partition_root(to_regclass(%s))::regclass::text", [name])
        root = cursor.fetchone()[0]
    return root or name


def singles(count: int, *, then: int = 1_000_000) -> list[tuple[int, int]]:
    """A partition per seq for ``0..count-1`` (every seq ends one), then one to ``then``."""
    return [(n, n + 1) for n in range(count)] + [(count, then)]


def standard() -> None:
    """After a transactional test: empty the log tables and lay out what migrate makes."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {partitions.PARENT}, {partitions.CHANGESETS} CASCADE")
    width, ahead = (
        conf.DEFAULTS["ATLAS_LOG_PARTITION_SEQS"],
        conf.DEFAULTS["ATLAS_LOG_PARTITIONS_AHEAD"],
    )
    layout(partitions.missing(0, 1 + ahead * width, [], step=width))


def analyze_generic(sql: str, params: Sequence[Any]) -> dict[str, Any]:
    """``EXPLAIN ANALYZE`` of a prepared statement's generic plan, the one
    ``atlas.db.prepared_cursor`` runs (``plan_cache_mode = force_generic_plan``),
    with ``params``: its root plan node."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        with prepared(cursor, "atlas_test_generic", sql, params) as (statement, values):
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", values)
            raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
