"""The archive's two advisory locks.

- The archiver's (session-level): one process at a time runs a cut or a
  rewrite, whoever started it (``archive_log``, the retention task, an
  erasure's rewrite). Held on a session of its own past a transaction pooler
  (``ATLAS_DIRECT_DATABASE_URL``), as the journal relay holds its lock.
- Signing's (transaction-level): an erasure and the signing of a checkpoint
  never interleave, so an erasure either lands before the archiver's last
  look (it then rewrites its segments before it signs) or finds the cut
  signed (and asks for a rewrite of it). ``changesets.archive.erasure``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from django.db import connection

from atlas import conf

ARCHIVER_LOCK = int.from_bytes(b"atlasarc", "big") - (1 << 63)
SIGNING_LOCK = int.from_bytes(b"atlassig", "big") - (1 << 63)


class Busy(Exception):
    """Another process is archiving or rewriting right now."""


@contextlib.contextmanager
def archiver() -> Iterator[None]:
    """Hold the archiver's lock for the block, or raise :class:`Busy` at once."""
    if conf.get("ATLAS_DB_POOLING") == "transaction":
        url = conf.get("ATLAS_DIRECT_DATABASE_URL")
        if not url:
            raise Busy(
                "archiving needs a session for its lock: set ATLAS_DIRECT_DATABASE_URL"
                " (docs/deploy.md, Pooled)"
            )
        with psycopg.connect(url, autocommit=True) as direct, _held(direct):
            yield
        return
    connection.ensure_connection()
    with _held(connection.connection):
        yield


@contextlib.contextmanager
def _held(raw: Any) -> Iterator[None]:
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ARCHIVER_LOCK])
        if not cursor.fetchone()[0]:
            raise Busy("another process is archiving (archive_log, retention or a rewrite)")
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error), raw.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ARCHIVER_LOCK])


def hold_signing() -> None:
    """Take the signing lock until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SIGNING_LOCK])
