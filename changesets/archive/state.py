"""The baseline state at a cut, as the checkpoint's ``state_digest`` commits to it.

Pure Python (no Django), shared by the archiver (from the database's
``ArchiveBase`` rows) and the offline verifier (by replaying the segments),
which must agree byte for byte.

The state at cut C is, per baseline key alive at C, two revision rows: the
create of its current life and its newest revision at or before C (one row
when they are the same). These are exactly the rows as-of reads after the cut
need (``changesets.selectors.asof``: the key walk starts at the newest
create, the value is the newest revision). Each row is committed to as the
chain commits to revisions (``changesets.chain.revision_fields``: member
digests, never values), so the digest survives erasures as the chain does.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from changesets import chain

VERSION = b"atlas-archive-state-v1"
BASELINE = ""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def row_line(row: Any, fields: list[Any] | None = None) -> tuple[tuple[str, str, str, int], str]:
    """(sort key, digest line) of one state row (a revision or a copy of one); ``fields``
    are its ``chain.revision_fields`` when the caller has them already."""
    key = (row.namespace, row.kind, row.slug, int(row.seq))
    fields = fields if fields is not None else chain.revision_fields(row)
    return key, _canonical([*key, str(row.changeset_id), fields])


# Past this many keys (or lines, for a digest) the state moves from memory to a
# temporary SQLite file: a line is a few hundred bytes of JSON and a Python tuple
# around it, about 3 KB per live key in all (2.9 GB for a million keys in the
# 10M-revision run of bench/archive.py), so memory is bounded by this, not by the
# store's live keys.
SPILL = 200_000


def _spill_file() -> sqlite3.Connection:
    """A private temporary SQLite database on disk (SQLite's empty file name: it is
    deleted when the connection closes), with no journal and no fsync: a crash loses
    a replay, which the next run makes again."""
    db = sqlite3.connect("")
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute("PRAGMA cache_size = -65536")  # 64 MiB of pages, the rest on disk
    return db


def _hash(lines: Iterable[str]) -> str:
    sha = hashlib.sha256(VERSION)
    for line in lines:
        sha.update(line.encode() + b"\n")
    return sha.hexdigest()


def digest(lines: Iterable[tuple[tuple[str, str, str, int], str]]) -> str:
    """The state digest over ``(sort key, line)`` pairs, in any order (sorted here,
    in memory up to ``SPILL`` lines and in a temporary SQLite file past that)."""
    held: list[tuple[tuple[str, str, str, int], str]] = []
    db: sqlite3.Connection | None = None
    for pair in lines:
        held.append(pair)
        if len(held) > SPILL:
            if db is None:
                db = _spill_file()
                db.execute("CREATE TABLE l (ns TEXT, kind TEXT, slug TEXT, seq INTEGER, line TEXT)")
            db.executemany("INSERT INTO l VALUES (?, ?, ?, ?, ?)", ((*k, t) for k, t in held))
            held = []
    if db is None:
        return _hash(line for _, line in sorted(held))
    try:
        db.executemany("INSERT INTO l VALUES (?, ?, ?, ?, ?)", ((*k, t) for k, t in held))
        # SQLite's BINARY collation compares UTF-8 bytes: code point order, as Python's.
        rows = db.execute("SELECT line FROM l ORDER BY ns, kind, slug, seq")
        return _hash(line for (line,) in rows)
    finally:
        db.close()


class Replay:
    """The state at a cut, rolled forward revision by revision (baseline only).

    Holds per key the digest lines of its life's create and its newest
    revision, so memory follows the number of live keys, not the log; past
    ``SPILL`` keys they move to a temporary SQLite file, so it stops there.
    ``rows`` (a previous cut's state rows) may come in any order and are read
    one at a time, so a second cut's start is bounded the same way.
    """

    def __init__(self, rows: Iterable[Any] = (), *, spill: int | None = None) -> None:
        self._keys: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._spill = SPILL if spill is None else spill
        self._disk: _DiskState | None = None
        for row in rows:
            self._seed(row)

    def _seed(self, row: Any) -> None:
        """One row of a previous cut's state, in any order: a key's rows there are its
        life's create and its newest revision, so the lower seq is the create and the
        higher the newest, and no sort (of every state row in memory) is needed."""
        key = (row.namespace, row.kind, row.slug)
        line = row_line(row)
        if self._disk is not None:
            self._disk.seed(line)
            return
        held = self._keys.get(key)
        if held is None:
            self._hold(key, line)
        else:
            create, newest = held
            seq = line[0][3]
            self._keys[key] = (
                line if seq < create[0][3] else create,
                line if seq > newest[0][3] else newest,
            )

    def apply(self, revision: Any, fields: list[Any] | None = None) -> None:
        if revision.branch == BASELINE:
            self._apply(revision, fields)

    def _apply(self, row: Any, fields: list[Any] | None = None) -> None:
        key = (row.namespace, row.kind, row.slug)
        line = row_line(row, fields)
        if self._disk is not None:
            self._disk.apply(row.op, line)
        elif row.op == "delete":
            self._keys.pop(key, None)
        elif row.op == "create" or key not in self._keys:
            self._hold(key, line)
        else:
            self._keys[key] = (self._keys[key][0], line)

    def _hold(self, key: tuple[str, str, str], line: Any) -> None:
        """A key's life starts at ``line``; past ``spill`` keys, everything moves to disk."""
        self._keys[key] = (line, line)
        if len(self._keys) > self._spill:
            self._disk = _DiskState(self._keys)
            self._keys = {}

    def lines(self) -> Iterator[tuple[tuple[str, str, str, int], str]]:
        if self._disk is not None:
            yield from self._disk.lines()
            return
        for create, newest in self._keys.values():
            yield create
            if newest[0] != create[0]:
                yield newest

    def digest(self) -> str:
        if self._disk is not None:
            return _hash(line for _, line in self._disk.lines())  # already in order
        return digest(self.lines())

    def __len__(self) -> int:
        return len(self._disk) if self._disk is not None else len(self._keys)


class _DiskState:
    """:class:`Replay`'s keys in a temporary SQLite table, the same rules as the dict:
    a delete drops the key, a create (or a key not held) holds its line twice, any
    other op replaces the newest line. Ops are buffered and run in order, a run of
    one kind per statement."""

    _SQL = {
        "delete": "DELETE FROM k WHERE ns = ? AND kind = ? AND slug = ?",
        "create": "INSERT OR REPLACE INTO k VALUES (?, ?, ?, ?, ?, ?, ?)",
        "other": (
            "INSERT INTO k VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ns, kind, slug)"
            " DO UPDATE SET nseq = excluded.nseq, nline = excluded.nline"
        ),
        # A previous cut's row, in any order (Replay._seed): the lower seq is the create.
        # SQLite evaluates every SET expression against the row before the update.
        "seed": (
            "INSERT INTO k VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (ns, kind, slug) DO UPDATE SET"
            " cseq = min(cseq, excluded.cseq),"
            " cline = CASE WHEN excluded.cseq < cseq THEN excluded.cline ELSE cline END,"
            " nseq = max(nseq, excluded.nseq),"
            " nline = CASE WHEN excluded.nseq > nseq THEN excluded.nline ELSE nline END"
        ),
    }

    def __init__(self, held: dict[tuple[str, str, str], tuple[Any, Any]]) -> None:
        self._db = _spill_file()
        self._db.execute(
            "CREATE TABLE k (ns TEXT, kind TEXT, slug TEXT, cseq INTEGER, cline TEXT,"
            " nseq INTEGER, nline TEXT, PRIMARY KEY (ns, kind, slug)) WITHOUT ROWID"
        )
        self._db.executemany(
            "INSERT INTO k VALUES (?, ?, ?, ?, ?, ?, ?)",
            ((*key, c[0][3], c[1], n[0][3], n[1]) for key, (c, n) in held.items()),
        )
        self._kind = ""
        self._pending: list[tuple[Any, ...]] = []

    def apply(self, op: str, line: tuple[tuple[str, str, str, int], str]) -> None:
        self._queue(op if op in ("delete", "create") else "other", line)

    def seed(self, line: tuple[tuple[str, str, str, int], str]) -> None:
        self._queue("seed", line)

    def _queue(self, what: str, line: tuple[tuple[str, str, str, int], str]) -> None:
        """Buffer one op of kind ``what``; a change of kind runs the buffered ones first."""
        (ns, kind, slug, seq), text = line
        if what != self._kind or len(self._pending) >= 5000:
            self._flush()
            self._kind = what
        row = (ns, kind, slug) if what == "delete" else (ns, kind, slug, seq, text, seq, text)
        self._pending.append(row)

    def _flush(self) -> None:
        if self._pending:
            self._db.executemany(self._SQL[self._kind], self._pending)
            self._pending = []

    def lines(self) -> Iterator[tuple[tuple[str, str, str, int], str]]:
        """Every line in digest order: by key (SQLite's BINARY collation compares UTF-8
        bytes, i.e. code points, as Python does), the create before the newest."""
        self._flush()
        for ns, kind, slug, cseq, cline, nseq, nline in self._db.execute(
            "SELECT * FROM k ORDER BY ns, kind, slug"
        ):
            yield (ns, kind, slug, cseq), cline
            if nseq != cseq:
                yield (ns, kind, slug, nseq), nline

    def __len__(self) -> int:
        self._flush()
        return int(self._db.execute("SELECT count(*) FROM k").fetchone()[0])
