"""An entity's history filtered by a key, and blame's statements, which walk alike.

A busy entity's revisions are many and a GIN index cannot return a key's
newest first: both walk the entity's newest revisions, then read the key's
posting lists below them (:func:`entity_key_history`,
:func:`entity_window`, :func:`entity_probe`). Callers pass what the reader may see
(invariant 8 is the view's to check).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atlas.replicas import read_connection
from changesets.models import BASELINE
from changesets.selectors.keys import KEY_TERMS, touching
from changesets.selectors.log import entity_columns_where, entity_where
from changesets.selectors.rows import REVISION as _T
from changesets.selectors.rows import (
    ROW_COLUMNS,
    HistoryRow,
    history_rows,
    with_briefs,
)
from entities.store import EntityKey

# How many of an entity's revisions below a key-filtered history page's start are
# walked, the key rule tested on each, before its matches further down are read
# off the key's posting list (entity_key_history).
ENTITY_KEY_WINDOW = 200


def entity_key_history(
    *,
    key: EntityKey,
    pointer: str,
    branch: str = BASELINE,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[HistoryRow]:
    """One entity's revisions that touched ``pointer`` (the key rule), newest first.

    Rows, not model instances, like :func:`~changesets.selectors.log.entity_history`.
    A key, in two arms of one statement (the second runs only if the first came
    up short):

    - a **walk** of the entity's ``ENTITY_KEY_WINDOW`` newest revisions below the
      page's start off ``revision_key``, the key rule tested on each row: a
      key the entity changes often fills the page here;
    - below that, the entity's revisions on the key's posting list
      (``revision_changed_keys``), the planner's choice of ANDing it with the
      entity's history or walking on.

    Written as one filtered statement, the planner chose by the posting list's
    share of the namespace: for a key in most of a namespace's revisions it
    walked the entity's history and stopped at the page, otherwise it ANDed the
    two bitmaps, then read, joined to its changeset and sorted every match: all
    2,803 revisions of a busy entity of a middling namespace at 1M changesets
    (25 ms in SQL where the walk takes 0.5; 249 ms at 10M, bench/scale.py).
    """
    if pointer == "":
        where, params = entity_where(key, branch)
        return history_rows(
            f"{where} AND {_T}.changed <> ''", params, before_seq=before_seq, limit=limit
        )
    return _walk_then_probe(key, pointer, branch, before_seq, limit)


def _walk_then_probe(
    key: EntityKey, pointer: str, branch: str, before_seq: int | None, limit: int
) -> list[HistoryRow]:
    """:func:`entity_key_history` for a pointer: the walk, then, only if the page
    came up short below a full window, the probe (:func:`_probe`) under the
    window's oldest seq, a literal.

    The walk's statement also returns the window's size and oldest seq (one row
    even when nothing in it matched). One statement of both, as blame sent
    until 2026-12-07, planned its probe over every partition for every page,
    most of which the walk fills."""
    entity, entity_args = entity_where(key, branch)
    if before_seq is not None:
        entity += f" AND {_T}.seq < %s"
        entity_args.append(before_seq)
    rule, rule_args = touching([pointer])
    walk = (
        f"WITH win AS MATERIALIZED (SELECT * FROM {_T} WHERE {entity}"
        f" ORDER BY {_T}.seq DESC LIMIT {ENTITY_KEY_WINDOW:d})"
        " SELECT w.n, w.low, p.* FROM (SELECT count(*) AS n, min(seq) AS low FROM win) w"
        # ``win`` holds its rows newest first, as the blame statement's walk reads them:
        # no sort of the window for the page.
        f" LEFT JOIN LATERAL (SELECT {ROW_COLUMNS} FROM win {_T} WHERE {rule} LIMIT %s) p"
        " ON true"
    )
    with read_connection().cursor() as cursor:
        cursor.execute(walk, [*entity_args, *rule_args, limit])
        fetched = cursor.fetchall()
    size, low = fetched[0][0], fetched[0][1]
    rows = [r[2:] for r in fetched if r[2 + 2] is not None]  # (ROW_COLUMNS: seq third)
    rows.sort(key=lambda r: r[2], reverse=True)
    if len(rows) < limit and size >= ENTITY_KEY_WINDOW:
        rows += _probe((entity, entity_args), key, pointer, branch, low, limit - len(rows))
    return with_briefs(rows)


def _probe(
    entity: tuple[str, list[Any]],
    key: EntityKey,
    pointer: str,
    branch: str,
    low: int,
    limit: int,
) -> list[Sequence[Any]]:
    """The entity's newest ``limit`` revisions below seq ``low`` that touched
    ``pointer``: its updates off the posting lists of an update's terms
    (``atlas_update_key_query``, migration 0039), its creates and deletes off its
    own rows (``revision_creates``, ``revision_deletes``), tested by the rule.

    A create's ``changed`` names every top-level member, so the posting lists of
    every revision held the namespace's creates: a member set at create and
    never since (history by ``/name`` of the scale bench's busy entity) cost a
    read of all of them, ANDed with the entity's whole history, 35 ms at 10M
    changesets. ``whole`` has no order and no limit, so it is planned to read
    all the entity's creates and deletes there (an entity has few); planned for
    the newest alone, the history index walked back with a filter on ``op`` was
    as likely."""
    where, where_args = entity
    rule, rule_args = touching([pointer])
    below = f"{where} AND {_T}.seq < %s"
    below_args = [*where_args, low]
    # ``whole`` names the key by its columns: the partial indexes are keyed by them.
    columns, columns_args = entity_columns_where(key, branch)
    whole = f"{columns} AND {_T}.seq < %s"
    whole_args = [*columns_args, low]
    sql = (
        f"WITH whole AS MATERIALIZED (SELECT * FROM {_T} WHERE {whole} AND {_T}.op = 'create'"
        f" UNION ALL SELECT * FROM {_T} WHERE {whole} AND {_T}.op = 'delete')"
        f" SELECT {ROW_COLUMNS} FROM ((SELECT * FROM {_T} WHERE {below}"
        f" AND {KEY_TERMS} && atlas_update_key_query(%s, %s, %s)"
        f" ORDER BY {_T}.seq DESC LIMIT %s)"
        f" UNION ALL (SELECT * FROM whole {_T} WHERE {rule})) {_T}"
        f" ORDER BY {_T}.seq DESC LIMIT %s"
    )
    args = [*whole_args, *whole_args, *below_args, branch, key.namespace, pointer, limit]
    with read_connection().cursor() as cursor:
        cursor.execute(sql, [*args, *rule_args, limit])
        return cursor.fetchall()


def entity_window(
    entity: tuple[str, list[Any]], pointers: Sequence[str], *, columns: str
) -> tuple[str, list[Any]]:
    """Blame's first statement, and its parameters: the newest ``ENTITY_KEY_WINDOW``
    revisions matching ``entity`` (SQL over the revision table: one entity's
    revisions, and bounds), and of them those that touched any of ``pointers``
    (the key rule, tested on each row: :func:`touching`), newest first, as
    ``columns`` (revision columns, the window aliased as the table).

    Every row carries the window's size and oldest seq first (one row with NULLs
    after them when nothing in it matched), so the caller knows whether the
    entity's history goes on below it. A leaf changed often is found here; its
    posting list holds the namespace's every change of it."""
    where, where_args = entity
    rule, rule_args = touching(pointers)
    sql = (
        f"WITH win AS MATERIALIZED (SELECT * FROM {_T} WHERE {where}"
        f" ORDER BY {_T}.seq DESC LIMIT {ENTITY_KEY_WINDOW:d})"
        " SELECT w.n, w.low, p.* FROM (SELECT count(*) AS n, min(seq) AS low FROM win) w"
        f" LEFT JOIN LATERAL (SELECT {columns} FROM win {_T} WHERE {rule}"
        f" ORDER BY {_T}.seq DESC) p ON true"
    )
    return sql, [*where_args, *rule_args]


def entity_probe(
    entity: tuple[str, list[Any]],
    key: EntityKey,
    pointers: Sequence[str],
    *,
    below: int,
    branch: str,
    limit: int,
    columns: str,
) -> tuple[str, list[Any]]:
    """Blame's statement below its window, and its parameters: the newest ``limit``
    revisions matching ``entity`` below seq ``below`` that touched any of
    ``pointers``, newest first, as ``columns``: back to the entity's newest create
    (``born``, off ``revision_creates``) the updates off their own posting lists
    (``atlas_update_key_query``, migration 0039), then that create, which touched
    every leaf the content has. The lists of every revision held the namespace's
    creates: a member set at create and never since cost a read of all of them,
    ANDed with the entity's history.

    ``born`` has no order and no limit, so it is planned to read every create
    below the window (an entity has few); planned for the newest alone, the
    history index walked back with a filter on ``op`` was as likely (it was, on
    a small table). The updates' bounds are a filter (``seq + 0``): as the
    entity's index range the planner guessed it at a few hundred rows and read
    the entity's whole history first (18,330 at 1M changesets, 7 ms), to AND with
    an update posting list that was empty."""
    where, where_args = entity
    # ``born`` names the key by its columns: ``revision_creates`` is keyed by them.
    born, born_args = entity_columns_where(key, branch)
    # One call a pointer, each folded to its terms when planned, so the planner
    # estimates the overlap from the index's statistics.
    calls = " || ".join(["atlas_update_key_query(%s, %s, %s)"] * len(pointers))
    posting_args = [arg for p in pointers for arg in (branch, key.namespace, p)]
    sql = (
        f"WITH born AS MATERIALIZED (SELECT * FROM {_T} WHERE {born}"
        f" AND {_T}.seq < %s AND {_T}.op = 'create'),"
        " page AS MATERIALIZED (SELECT * FROM ("
        f"(SELECT * FROM {_T} WHERE {where} AND {KEY_TERMS} && ({calls})"
        f" AND {_T}.seq + 0 < %s"
        f" AND {_T}.seq + 0 > coalesce((SELECT max(seq) FROM born), 0)"
        f" ORDER BY {_T}.seq DESC LIMIT %s)"
        " UNION ALL (SELECT * FROM born ORDER BY seq DESC LIMIT 1)"
        ") arms LIMIT %s)"
        f" SELECT {columns} FROM page {_T} ORDER BY {_T}.seq DESC"
    )
    args = [*born_args, below, *where_args, *posting_args, below, limit, limit]
    return sql, args
