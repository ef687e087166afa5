"""The log statement: a store's rows, seq, the changeset, its revisions and journal entry.

One statement of data-modifying CTEs, each part named below, run in this order
by PostgreSQL because each reads the one before it:

1. ``entities`` — the store's CTEs (``EntityStore.write_sql``), then ``w``:
   their row counts. The head's update reads ``w`` first, so its lock is
   taken only after the entity rows are written (a CTE's rows are complete
   once it has been read to the end).
2. ``head`` — the update of the one-row log head: takes its lock, draws
   ``seq`` and ``at``, and computes the chain hash in PostgreSQL
   (``chain.hash_sql``; stored as its 32 bytes, ``changesets.fields``). The
   transaction holds that lock to COMMIT, so seq order is commit order
   (invariant 6), and it never waits on a round trip to Python while held.
   It moves only when every create inserted its row (checked: every row
   was written, ``statement``).
3. ``changeset``, ``journal`` (baseline only), ``revisions`` — the log rows,
   from ``h``.
4. ``result`` — seq, at and the hash, plus ``w.created`` (so a head that
   did not move tells a lost create race from a missing head row), and the
   revisions' ``changed`` pointers in written order. A checked statement
   raises instead of returning a head that did not move.

Raw SQL buys the write's single round trip for rows and log (measured in
``bench/writes_vs_peers.py``; ``tests/changesets/test_write_path.py`` pins it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from changesets import chain, provenance
from changesets.models import Changeset, default_message
from changesets.services.netchange import NetChange
from entities.store import WriteSql, json_array

# ``at`` is ``now`` (the entity rows' time, in milliseconds) unless a changeset
# that committed first had a later clock reading, so ``at`` never runs backwards
# in seq order. Truncated again in SQL: a log head written before the millisecond
# rule may still hold microseconds.
_AT = (
    "date_trunc('milliseconds', GREATEST(%(now)s::timestamptz, COALESCE(at, %(now)s::timestamptz)))"
)
# The hash before this changeset's, as stored (32 bytes; the genesis before the
# first write, when the head's hash is NULL), and as the hex text the header hashes.
_PREV = f"COALESCE(hash, decode('{chain.GENESIS}', 'hex'))"
_PREV_HEX = f"COALESCE(encode(hash, 'hex'), '{chain.GENESIS}')"


def log_clock() -> datetime:
    """Now, truncated to the millisecond: the precision of a changeset's ``at``.

    Responses show times with milliseconds (API.md), so storing more would make
    a time copied from a response name a moment just *before* the changeset it
    came from (``as_of_time`` would miss it). Entity rows take the same value,
    so an entity's ``updated_at`` is its last changeset's ``at``. Rows written
    before this rule keep their microseconds; ``changesets.selectors.asof.as_of_time``
    compares at milliseconds for them.
    """
    now = timezone.now()
    return now.replace(microsecond=now.microsecond - now.microsecond % 1000)


# No message: it is always the rule's (``changesets.models.default_message``), so the
# row leaves it NULL and reads fill it in (migration 0033). No ``prev_hash`` either: it
# is the previous changeset's ``hash``, which every walk of the chain has in hand (the
# log head keeps it too; ``changesets.selectors.log.previous_hash`` finds one's).
_CHANGESET = (
    " c AS (INSERT INTO changesets_changeset (id, seq, author_id, author_name, at,"
    " comment, branch, rpc, op_count, namespaces, hash, metadata, context)"
    " SELECT %(id)s::uuid, h.seq, %(author)s::int, %(author_name)s::text, h.at,"
    " %(comment)s::text, %(branch)s::text, %(rpc)s::text,"
    " %(op_count)s::int, %(namespaces)s::varchar[], h.hash,"
    " %(metadata)s::jsonb, %(context)s::jsonb FROM h),"
)
_JOURNAL = (
    " j AS (INSERT INTO changesets_journalentry (changeset_id, seq, phase, created_at,"
    " published_at, attempts, last_error, failures)"
    " SELECT %(id)s::uuid, h.seq, 'committed', h.at, NULL, 0, '', 0 FROM h),"
)
# Rows in written order (ids follow it, and the chain digests revisions in id
# order), zipped from one JSON document of keys, ops and versions and one per
# image (see _rows). Computed here, per row, from the two whole images (``b``,
# ``a``), set-based for a batch of any size: ``changed`` by
# ``atlas_changed_keys`` (migration 0013), and the before image as it is stored
# (``undo``, ``undo_gone``) by ``atlas_undo`` (migration 0029, ``changesets.undo``;
# called in FROM, where PostgreSQL inlines it).
_REVISIONS = (
    " r AS (INSERT INTO changesets_revision (changeset_id, seq, branch, at, namespace,"
    " kind, slug, op, undo, undo_gone, after, before_version, after_version, changed, salt)"
    " SELECT %(id)s::uuid, h.seq, %(branch)s::text, h.at, r.k->>0, r.k->>1, r.k->>2,"
    " r.k->>3, u.undo, u.undo_gone, r.a, (r.k->>4)::int, (r.k->>5)::int,"
    " array_to_string(atlas_changed_keys(r.b, r.a), '~2'), decode(r.k->>6, 'hex')"
    " FROM h CROSS JOIN (SELECT k, NULLIF(before, 'null') AS b, NULLIF(after, 'null') AS a, n"
    " FROM ROWS FROM (jsonb_array_elements(%(rows)s::jsonb),"
    " jsonb_array_elements(%(befores)s::jsonb), jsonb_array_elements(%(afters)s::jsonb))"
    " WITH ORDINALITY AS i(k, before, after, n)) r CROSS JOIN LATERAL atlas_undo(r.b, r.a) u"
    " ORDER BY r.n RETURNING id, changed)"
)
# The changed keys go back in written order, one JSON text, so the write's answer
# shows what the rows hold without a second engine for the rule in Python. The
# hash goes back as its bytes (``apply._write_log`` makes it hex text).
_RESULT = (
    " SELECT h.seq, h.at, h.hash, w.created,"
    " (SELECT json_agg(string_to_array(r.changed, '~2') ORDER BY r.id)::text FROM r){check}"
    " FROM w LEFT JOIN h ON TRUE"
)
# A checked statement (the unlocked write's) raises instead of returning a head that
# did not move: it commits as it ends, so its entity rows must go with the error
# (``atlas_write_moved``, migration 0036).
_CHECK = ", atlas_write_moved(h.seq IS NULL)"


def _entities(entity_sql: WriteSql) -> str:
    ctes = f"{entity_sql.ctes}, " if entity_sql.ctes else ""
    return f"{ctes}w AS (SELECT {entity_sql.created} AS created, {entity_sql.written} AS written),"


def _head(checked: bool) -> str:
    # Built per statement, not once: the hash expression is chain's to define.
    new_hash = chain.hash_sql(prev=_PREV_HEX, at=_AT, seq="seq + 1", middle="%(middle)s")
    # Locked rows cannot move, so only a create can fall short; unlocked, any row can.
    written = "w.written = %(writes)s::bigint" if checked else "w.created = %(creates)s::bigint"
    return (
        f" h AS (UPDATE changesets_loghead SET seq = seq + 1, at = {_AT}, prev_hash = {_PREV},"
        f" hash = {new_hash} FROM w WHERE id = 1 AND {written}"
        " RETURNING seq, at, hash),"
    )


def statement(entity_sql: WriteSql, *, journal: bool, checked: bool = False) -> str:
    """The log statement's text, part by part (the module docstring's numbers).

    ``checked``: the store's CTEs are compare-and-set (the rows were read
    unlocked); the head moves only when every row was written, and otherwise the
    statement fails with ``serialization_failure`` (part 4).
    """
    parts = (_entities(entity_sql), _head(checked), _CHANGESET, _JOURNAL if journal else "")
    return "WITH " + "".join(parts) + _REVISIONS + _RESULT.format(check=_CHECK if checked else "")


def _rows(changes: Sequence[NetChange], salts: Sequence[bytes]) -> str:
    """Keys, ops, versions and chain salts as one JSON document, not nine arrays:
    psycopg adapts array parameters in Python (see ``entities.store.json_array``)."""
    return json.dumps(
        [
            [
                c.key.namespace,
                c.key.kind,
                c.key.slug,
                str(c.op),
                c.before_version,
                c.after_version,
                salt.hex(),
            ]
            for c, salt in zip(changes, salts, strict=True)
        ]
    )


def params(
    changeset: Changeset,
    changes: Sequence[NetChange],
    *,
    now: datetime,
    revisions_hex: str,
    salts: Sequence[bytes],
    entity_sql: WriteSql,
    writes: int | None = None,
) -> dict[str, Any]:
    """The statement's parameters: the store's, then the log's (the images go over
    as the canonical texts already made; an image is an object or absent, so a
    ``null`` element means absent)."""
    cs = changeset
    out: dict[str, Any] = dict(entity_sql.params)
    out.update(
        {
            "now": now,
            "creates": entity_sql.creates,
            "middle": chain.header_middle(cs, revisions_hex),
            "id": cs.id,
            "author": cs.author_id,
            "author_name": cs.author_name,
            "comment": cs.comment,
            "branch": cs.branch,
            "rpc": cs.rpc,
            "op_count": cs.op_count,
            "namespaces": cs.namespaces,
            # The texts the header hashed (chain.header_middle), so the row holds them.
            "metadata": provenance.as_text(cs.metadata),
            "context": provenance.as_text(cs.context),
            "rows": _rows(changes, salts),
            "befores": json_array(c.before_text for c in changes),
            "afters": json_array(c.after_text for c in changes),
        }
    )
    if writes is not None:  # a checked statement's: the rows the store must write
        out["writes"] = writes
    return out


def revisions_digest(changes: Sequence[NetChange], branch: str, salts: Sequence[bytes]) -> str:
    """The chain's digest of the revision rows (v2: salted member digests, ``chain``),
    computed before the statement so the head's lock never waits on it."""
    return chain.digest_lines(
        chain.revision_line(
            namespace=c.key.namespace,
            kind=c.key.kind,
            slug=c.key.slug,
            op=c.op,
            before=c.before,
            after=c.after,
            salt=salt,
            before_version=c.before_version,
            after_version=c.after_version,
            branch=branch,
        )
        for c, salt in zip(changes, salts, strict=True)
    )


def new_changeset(
    changeset_id: UUID,
    *,
    actor: User,
    rpc: str,
    comment: str,
    branch: str,
    changes: Sequence[NetChange],
    metadata: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
) -> Changeset:
    """The changeset row the log statement inserts, as a saved instance, unread.

    Built with ``Model.from_db``, Django's documented constructor for an
    instance of a stored row: the log statement inserts exactly this row in
    this transaction, before anyone else sees the instance, and fills in
    what PostgreSQL draws (seq, at, the hash). A failed statement rolls
    back and discards both.
    """
    author = actor if getattr(actor, "pk", None) else None
    values = {
        "id": changeset_id,
        "seq": None,
        "author_id": author.pk if author is not None else None,
        "author_name": actor.get_username(),
        "at": None,
        "message": default_message(rpc, len(changes)),
        "comment": comment or "",
        "branch": branch,
        "rpc": rpc,
        "op_count": len(changes),
        "namespaces": sorted({c.key.namespace for c in changes}),
        "prev_hash": None,
        "hash": None,
        "v1_hash": None,
        "metadata": provenance.stored_metadata(metadata),
        "context": provenance.stored_context(context),
    }
    names = [f.attname for f in Changeset._meta.concrete_fields]
    changeset = Changeset.from_db(connection.alias, names, [values[n] for n in names])
    if author is not None:
        changeset.author = author  # the actor itself: no query to read it back
    return changeset
