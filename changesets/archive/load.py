"""Archived history back in PostgreSQL for an investigation, in a schema of its own.

Why a separate schema and not the live tables: the live log is append-only,
seq-ordered and hash-chained, and every read path (history, feed, as-of)
ends at the cut; putting rows from before the cut back would make those reads
answer differently from the archive's checkpoint and let the investigation
touch what the API serves. In ``<schema>.changeset`` and ``<schema>.revision``
the rows can be queried, joined with the live tables, and dropped afterwards
(``DROP SCHEMA <schema> CASCADE``). Their columns are the log's, written out
here (not copied from the live tables), so a segment loads the same however
the live tables change.

Verified on the way in: the segment's checkpoint must verify under a trusted
key, the segment's SHA-256 must be the one it signs, and the chain must
recompute across the segment (ending at the checkpoint's hash when it is the
cut's last). Loading is one transaction per segment and idempotent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from changesets import chain
from changesets.archive import offline, segments, signing

SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
RESERVED = {"public", "pg_catalog", "information_schema", "pg_toast"}
DEFAULT_SCHEMA = "atlas_archive"


class LoadFailed(Exception):
    """The segment did not verify, or the schema name is not usable."""


_TABLES = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.changeset (
    id uuid PRIMARY KEY, seq bigint UNIQUE NOT NULL, author_name text NOT NULL,
    at timestamptz NOT NULL, message text NOT NULL, comment text NOT NULL,
    branch text NOT NULL, rpc text NOT NULL, op_count integer NOT NULL,
    namespaces text[] NOT NULL, prev_hash text NOT NULL, hash text NOT NULL,
    metadata jsonb, context jsonb, v1_hash text, segment text NOT NULL, checkpoint text NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.revision (
    changeset_id uuid NOT NULL REFERENCES {s}.changeset (id), position integer NOT NULL,
    seq bigint NOT NULL, branch text NOT NULL, at timestamptz NOT NULL,
    namespace text NOT NULL, kind text NOT NULL, slug text NOT NULL, op text NOT NULL,
    before jsonb, after jsonb, before_version integer, after_version integer,
    changed text[] NOT NULL, salt bytea, sealed jsonb,
    PRIMARY KEY (changeset_id, position)
);
CREATE INDEX IF NOT EXISTS revision_entity ON {s}.revision (namespace, kind, slug, seq);
"""


@dataclass
class Loaded:
    changesets: int
    revisions: int
    checkpoint: dict[str, Any]


def schema_name(name: str) -> str:
    if not SCHEMA_NAME.match(name) or name in RESERVED or name.startswith("pg_"):
        raise LoadFailed(f"{name!r} is not a schema name to load into ([a-z_][a-z0-9_]*)")
    return name


def find_checkpoint(source: offline.Source, segment: str) -> dict[str, Any]:
    for checkpoint in offline.load_checkpoints(source):
        if any(s.get("name") == segment for s in checkpoint.get("segments", [])):
            return checkpoint
    raise LoadFailed(f"no checkpoint lists {segment}: it is not (or no longer) in this archive")


def _verified_pairs(
    source: offline.Source, name: str, checkpoint: dict[str, Any], keys: list[Any]
) -> list[tuple[Any, list[Any]]]:
    if not any(signing.verify(checkpoint, key) for key in keys):
        raise LoadFailed(f"the checkpoint of seq {checkpoint.get('seq')} does not verify")
    entry = next(s for s in checkpoint["segments"] if s.get("name") == name)
    with source.open(name) as handle:
        digest, size = segments.file_digest(handle)
    if (digest, size) != (entry["digest"], entry["bytes"]):
        raise LoadFailed(f"{name} is not the file its checkpoint signs")
    with source.open(name) as handle:
        parsed = segments.read_segment(handle)
        header, pairs = parsed.header, list(parsed.changesets)
    start = chain.Start(
        seq=header["first_seq"], hash=header["prev_hash"], v1_hash=header["prev_v1_hash"]
    )
    _, broken = chain.verify(iter(pairs), head=None, start=start)
    if broken is not None:
        raise LoadFailed(f"{name}: the chain breaks at seq {broken.seq}: {broken.reason}")
    last = pairs[-1][0] if pairs else None
    if last is None or last.seq != entry["last_seq"]:
        raise LoadFailed(f"{name} ends before its last seq")
    if last.seq == checkpoint["seq"] and last.hash != checkpoint["hash"]:
        raise LoadFailed(f"{name} does not end at its checkpoint's hash")
    return pairs


def load_segment(
    source: offline.Source, name: str, *, schema: str, public_keys: Iterable[Any]
) -> Loaded:
    """Verify segment ``name`` and load it into ``schema`` (made if missing); one transaction."""
    schema = schema_name(schema)
    checkpoint = find_checkpoint(source, name)
    pairs = _verified_pairs(source, name, checkpoint, list(public_keys))
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in _TABLES.format(s=schema).split(";"):
            if statement.strip():
                cursor.execute(statement)
        revisions = 0
        for changeset, rows in pairs:
            cursor.execute(
                f"INSERT INTO {schema}.changeset VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                _changeset_row(changeset, name, checkpoint["hash"]),
            )
            for position, revision in enumerate(rows):
                cursor.execute(
                    f"INSERT INTO {schema}.revision VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s,"
                    " %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    _revision_row(revision, position),
                )
            revisions += len(rows)
    return Loaded(len(pairs), revisions, checkpoint)


def _j(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False)


def _changeset_row(c: Any, segment: str, checkpoint: str) -> list[Any]:
    return [
        c.id, c.seq, c.author_name, c.at, c.message, c.comment, c.branch, c.rpc, c.op_count,
        c.namespaces, c.prev_hash, c.hash, _j(c.metadata), _j(c.context), c.v1_hash,
        segment, checkpoint,
    ]  # fmt: skip


def _revision_row(r: Any, position: int) -> list[Any]:
    return [
        r.changeset_id, position, r.seq, r.branch, r.at, r.namespace, r.kind, r.slug, r.op,
        _j(r.before), _j(r.after), r.before_version, r.after_version, r.changed, r.salt,
        _j(r.sealed),
    ]  # fmt: skip
