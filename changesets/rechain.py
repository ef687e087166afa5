"""Re-chain a log from v1 (full images) to v2 (salted member digests), and back.

Run once by migration 0018 (table owner, inside the migration's transaction,
with the append-only triggers switched off for it, as 0005 did). Why it is
shaped this way:

1. Bounded memory: changesets are read in seq order, a chunk at a time
   (at most ``CHUNK`` changesets and about ``REVISION_BUDGET`` revisions), with
   raw SQL, so a log of any size re-chains in the memory of one chunk.
2. The v1 chain is checked as it is walked (each changeset's v1 hash is
   recomputed from its rows and must be the stored one, and the log head must
   name the last): a log that does not verify as v1 is not re-chained, since
   re-chaining would launder the tampering into a valid v2 chain.
3. Every revision gets a salt; every changeset keeps its v1 hash in
   ``v1_hash``, which its v2 header commits to; ``hash``/``prev_hash`` become v2.
4. A :class:`~changesets.models.ChainUpgrade` row records the cut: the seq,
   the v1 head hash and the v2 hash there (docs/architecture.md explains how
   a v1 anchor is checked afterwards).

The reverse (migrating back past 0018) recomputes the v1 chain from the rows;
it refuses once anything was erased, since v1 cannot verify an erased image.

It runs only inside migration 0018 (either way), so it sees the schema of
then: the hash columns hold hex text (``varchar(64)``), which its raw SQL reads
and writes as such. Migration 0027 stores them as bytes later in the graph
(``changesets.fields.ChainHashField``); migrating back past 0018 first runs
0027's reverse, so this module never meets a ``bytea`` column.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from tqdm import tqdm

from changesets import chain, chainv1

CHUNK = 200
REVISION_BUDGET = 5000

_CHANGESETS = (
    "SELECT id, seq, author_name, at, message, comment, branch, rpc, op_count, namespaces,"
    " prev_hash, hash, metadata, context FROM changesets_changeset WHERE seq > %s"
    " ORDER BY seq LIMIT %s"
)
# The revision table as it is when 0018 runs, forward or back: ``before`` is a whole
# image until migration 0029 (a later schema never reaches this module).
_REVISIONS = (
    "SELECT id, changeset_id, namespace, kind, slug, op, before, after, before_version,"
    " after_version, branch FROM changesets_revision"
    " WHERE seq >= %s AND seq <= %s AND changeset_id = ANY(%s) ORDER BY changeset_id, id"
)
_TRIGGERS = (
    ("changesets_changeset", "changeset_append_only"),
    ("changesets_revision", "revision_append_only"),
)


class ChainBroken(Exception):
    """The log does not verify as it stands; it is not re-chained."""


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _chunks(cursor: Any) -> Iterator[list[tuple[Any, list[Any]]]]:
    """Step 1: (changeset, its revisions in id order) in seq order, a bounded chunk at a time."""
    after = 0
    while True:
        cursor.execute(_CHANGESETS, [after, CHUNK])
        names = [c.name for c in cursor.description]
        rows = [SimpleNamespace(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]
        if not rows:
            return
        taken: list[Any] = []
        budget = 0
        for row in rows:
            if taken and budget + row.op_count > REVISION_BUDGET:
                break
            taken.append(row)
            budget += row.op_count
        for row in taken:
            row.metadata, row.context = _json(row.metadata), _json(row.context)
        # By the chunk's seq range first: the revision table's seq-led index.
        cursor.execute(_REVISIONS, [taken[0].seq, taken[-1].seq, [row.id for row in taken]])
        names = [c.name for c in cursor.description]
        by_changeset: dict[Any, list[Any]] = {row.id: [] for row in taken}
        for values in cursor.fetchall():
            revision = SimpleNamespace(**dict(zip(names, values, strict=True)))
            revision.before, revision.after = _json(revision.before), _json(revision.after)
            by_changeset[revision.changeset_id].append(revision)
        yield [(row, by_changeset[row.id]) for row in taken]
        after = taken[-1].seq


def _set_triggers(cursor: Any, state: str) -> None:
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # ALTER TABLE needs no pending FK checks
    for table, trigger in _TRIGGERS:
        cursor.execute(f"ALTER TABLE {table} {state} TRIGGER {trigger}")


def _update_changesets(cursor: Any, rows: list[dict[str, Any]]) -> None:
    cursor.execute(
        "UPDATE changesets_changeset c SET prev_hash = v.prev_hash, hash = v.hash,"
        " v1_hash = v.v1_hash FROM jsonb_to_recordset(%s::jsonb)"
        " AS v(id uuid, prev_hash text, hash text, v1_hash text) WHERE c.id = v.id",
        [json.dumps(rows)],
    )


def _head(cursor: Any) -> tuple[int, str]:
    cursor.execute("SELECT seq, hash FROM changesets_loghead WHERE id = 1")
    row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, "")


@dataclass
class _Walk:
    """How far the re-chain has come: the last v1 and v2 hashes, the v2 hash before
    the last (the log head's ``prev_hash``), the last seq and the revisions salted."""

    prev_v1: str = chainv1.GENESIS
    prev_v2: str = chain.GENESIS
    last_prev_v2: str = chain.GENESIS
    seq: int = 0
    revisions_done: int = 0


def rechain_to_v2(cursor: Any, *, progress: bool = True) -> dict[str, Any] | None:
    """Steps 1-4 of the module docstring; returns the cut's record (None for an empty log)."""
    cursor.execute(
        "SELECT count(*), count(*) FILTER (WHERE v1_hash IS NOT NULL) FROM changesets_changeset"
    )
    total, already = cursor.fetchone()
    if total == 0 or already:
        return None
    _set_triggers(cursor, "DISABLE")
    walk = _Walk()
    with tqdm(total=total, unit="changeset", desc="re-chain v1 → v2", disable=not progress) as bar:
        for chunk in _chunks(cursor):
            _rechain_chunk(cursor, chunk, walk)
            bar.update(len(chunk))
    _move_head(cursor, walk)
    record = _record_cut(cursor, walk)
    _set_triggers(cursor, "ENABLE")
    return record


def _rechain_chunk(cursor: Any, chunk: list[tuple[Any, list[Any]]], walk: _Walk) -> None:
    """Steps 2-3 for one chunk: each v1 hash checked, salts drawn, v2 hashes computed;
    the chunk's salts and hashes written in one statement each."""
    changesets, salts = [], []
    for changeset, revisions in chunk:
        v1 = chainv1.changeset_hash(
            prev_hash=walk.prev_v1,
            changeset=changeset,
            revisions_hex=chainv1.revisions_digest(revisions),
        )
        if changeset.prev_hash != walk.prev_v1 or changeset.hash != v1:
            raise ChainBroken(
                f"the v1 chain breaks at seq {changeset.seq}: not re-chained (verify_log)"
            )
        for revision in revisions:
            revision.salt = chain.new_salt()
            salts.append({"id": revision.id, "s": revision.salt.hex()})
        changeset.v1_hash = v1
        v2 = chain.changeset_hash(
            prev_hash=walk.prev_v2,
            changeset=changeset,
            revisions_hex=chain.revisions_digest(revisions),
        )
        changesets.append(
            {"id": str(changeset.id), "prev_hash": walk.prev_v2, "hash": v2, "v1_hash": v1}
        )
        walk.prev_v1, walk.last_prev_v2, walk.prev_v2 = v1, walk.prev_v2, v2
        walk.seq = changeset.seq
        walk.revisions_done += len(revisions)
    cursor.execute(
        "UPDATE changesets_revision r SET salt = decode(v.s, 'hex')"
        " FROM jsonb_to_recordset(%s::jsonb) AS v(id bigint, s text) WHERE r.id = v.id",
        [json.dumps(salts)],
    )
    _update_changesets(cursor, changesets)


def _move_head(cursor: Any, walk: _Walk) -> None:
    """Step 2's last check (the log head must name the v1 chain's last changeset), then
    the head moved to the v2 chain's last hash."""
    head_seq, head_hash = _head(cursor)
    if (head_seq, head_hash) != (walk.seq, walk.prev_v1):
        raise ChainBroken(f"the log head (seq {head_seq}) does not name the v1 chain's last")
    cursor.execute(
        "UPDATE changesets_loghead SET hash = %s, prev_hash = %s WHERE id = 1",
        [walk.prev_v2, walk.last_prev_v2],
    )


def _record_cut(cursor: Any, walk: _Walk) -> dict[str, Any]:
    """Step 4: the :class:`~changesets.models.ChainUpgrade` row, and its values."""
    record = {
        "at": datetime.now(UTC),
        "from_version": chainv1.VERSION.decode(),
        "to_version": chain.VERSION.decode(),
        "seq": walk.seq,
        "v1_hash": walk.prev_v1,
        "v2_hash": walk.prev_v2,
        "revisions": walk.revisions_done,
    }
    cursor.execute(
        "INSERT INTO changesets_chainupgrade (at, from_version, to_version, seq, v1_hash,"
        " v2_hash, revisions) VALUES (%(at)s, %(from_version)s, %(to_version)s, %(seq)s,"
        " %(v1_hash)s, %(v2_hash)s, %(revisions)s)",
        record,
    )
    return record


def rechain_to_v1(cursor: Any, *, progress: bool = True) -> None:
    """The reverse: the v1 chain recomputed from the rows; refused after any erasure."""
    cursor.execute("SELECT count(*) FROM changesets_revision WHERE sealed IS NOT NULL")
    if cursor.fetchone()[0]:
        raise ChainBroken("values were erased: the v1 chain cannot cover erased images")
    cursor.execute("SELECT count(*) FROM changesets_changeset")
    total = cursor.fetchone()[0]
    if total == 0:
        return
    _set_triggers(cursor, "DISABLE")
    prev, last_prev = chainv1.GENESIS, chainv1.GENESIS
    with tqdm(total=total, unit="changeset", desc="re-chain v2 → v1", disable=not progress) as bar:
        for chunk in _chunks(cursor):
            rows = []
            for changeset, revisions in chunk:
                v1 = chainv1.changeset_hash(
                    prev_hash=prev,
                    changeset=changeset,
                    revisions_hex=chainv1.revisions_digest(revisions),
                )
                rows.append(
                    {"id": str(changeset.id), "prev_hash": prev, "hash": v1, "v1_hash": None}
                )
                last_prev, prev = prev, v1
            _update_changesets(cursor, rows)
            bar.update(len(chunk))
    cursor.execute("UPDATE changesets_revision SET salt = NULL")
    cursor.execute(
        "UPDATE changesets_loghead SET hash = %s, prev_hash = %s WHERE id = 1", [prev, last_prev]
    )
    cursor.execute("DELETE FROM changesets_chainupgrade")
    _set_triggers(cursor, "ENABLE")
