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
from collections.abc import Iterable
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


def digest(lines: Iterable[tuple[tuple[str, str, str, int], str]]) -> str:
    """The state digest over ``(sort key, line)`` pairs, in any order (sorted here)."""
    sha = hashlib.sha256(VERSION)
    for _, line in sorted(lines):
        sha.update(line.encode() + b"\n")
    return sha.hexdigest()


class Replay:
    """The state at a cut, rolled forward revision by revision (baseline only).

    Holds per key the digest lines of its life's create and its newest
    revision, so memory follows the number of live keys, not the log.
    """

    def __init__(self, rows: Iterable[Any] = ()) -> None:
        self._keys: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        for row in sorted(rows, key=lambda r: int(r.seq)):
            self._apply(row)

    def apply(self, revision: Any, fields: list[Any] | None = None) -> None:
        if revision.branch == BASELINE:
            self._apply(revision, fields)

    def _apply(self, row: Any, fields: list[Any] | None = None) -> None:
        key = (row.namespace, row.kind, row.slug)
        line = row_line(row, fields)
        if row.op == "delete":
            self._keys.pop(key, None)
        elif row.op == "create" or key not in self._keys:
            self._keys[key] = (line, line)
        else:
            self._keys[key] = (self._keys[key][0], line)

    def lines(self) -> list[tuple[tuple[str, str, str, int], str]]:
        out = []
        for create, newest in self._keys.values():
            out.append(create)
            if newest[0] != create[0]:
                out.append(newest)
        return out

    def digest(self) -> str:
        return digest(self.lines())

    def __len__(self) -> int:
        return len(self._keys)
