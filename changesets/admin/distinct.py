"""The distinct values of a log table's leading index columns, a partition at a time.

The admin's filter lists (authors, branches) and its search's prefixes are
loose index scans (``atlas.admin_mixins.loose_index_scan``): one seek per
distinct value. On a partitioned table each seek is a Merge Append over every
partition, so the list grew with the log (13 partitions at 10M changesets: 2.9
against 0.4 ms, and as much again to plan). Why it is shaped this way:

1. A partition whose seqs are all at or below the log head never gains a row
   (seqs are drawn in commit order, and the columns listed here are never
   updated), so its values are read once per process and kept, keyed by the
   partition's oid (a partition made again, as tests do, is a new table).
2. The partitions the head is in or has not reached are scanned each time,
   one partition's index at a time; partitions past the head are empty and
   skipped.
3. The merge is a sorted union, cut at ``limit`` (each partition's first
   ``limit`` values hold the union's first ``limit``): the values one scan of
   the whole table gives, in the C collation's order (the databases Atlas makes
   use it; under another collation the list's order may differ, not its values).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atlas.admin_mixins import loose_index_scan
from changesets import partitions

# (partition oid, columns, where, limit) -> its distinct values, for full partitions.
_closed: dict[tuple[int, tuple[str, ...], str, int | None], list[tuple[Any, ...]]] = {}


def distinct_values(
    table: str, columns: Sequence[str], *, where: str = "TRUE", limit: int | None = None
) -> list[tuple[Any, ...]]:
    """``loose_index_scan`` of ``table``'s ``columns``, a partition at a time."""
    parts = partitions.partitions(parent=table)
    if not parts:  # not partitioned
        return loose_index_scan(table=table, columns=columns, where=where, limit=limit)
    head = partitions.log_head()
    found: set[tuple[Any, ...]] = set()
    for part in parts:
        if part.lower > head:
            break  # empty: the head has not reached it
        # (each partition's first ``limit`` values: the union's first ``limit`` are among them)
        key = (part.oid, tuple(columns), where, limit)
        values = _closed.get(key)
        if values is None:
            values = loose_index_scan(table=part.name, columns=columns, where=where, limit=limit)
            if part.last_seq <= head:
                _closed[key] = values
        found.update(values)
    merged = sorted(found)
    return merged if limit is None else merged[:limit]
