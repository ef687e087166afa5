"""A changeset's header and its hash, in Python (:func:`changeset_hash`) and as the
SQL the write path has PostgreSQL run (:func:`hash_sql` around :func:`header_middle`),
byte for byte the same.
"""

from __future__ import annotations

import hashlib
from typing import Any

from changesets.chain.encoding import VERSION, _canonical, _timestamp


def _header_rest(changeset: Any, revisions_hex: str) -> dict[str, Any]:
    """The header's members other than ``at`` and ``seq`` (the two the log head hands out).

    ``metadata`` and ``context`` (provenance, migration 0015) are members only
    when the changeset has them: a changeset written before them hashes as it
    always did, and setting, changing or removing either on any changeset
    changes its header, so ``verify_log`` sees it. Both sort between ``at``
    and ``seq``, so :func:`header_middle` carries them.
    """
    header = {
        "id": str(changeset.id),
        "author": changeset.author_name,
        "message": changeset.message,
        "comment": changeset.comment,
        "branch": changeset.branch,
        "rpc": str(changeset.rpc),
        "op_count": changeset.op_count,
        "namespaces": list(changeset.namespaces),
        "revisions": revisions_hex,
    }
    for name in ("metadata", "context"):
        value = getattr(changeset, name, None)
        if value is not None:
            header[name] = value
    # A changeset from before the re-chain (migration 0018) commits to its v1
    # hash, so a v1 anchor stays checkable whatever is erased later. Named so it
    # sorts between ``at`` and ``seq`` (``header_middle``); absent on new ones.
    v1 = getattr(changeset, "v1_hash", None)
    if v1:
        header["chain_v1"] = v1
    return header


def changeset_hash(*, prev_hash: str, changeset: Any, revisions_hex: str) -> str:
    header = {
        **_header_rest(changeset, revisions_hex),
        "seq": changeset.seq,
        "at": _timestamp(changeset.at),
    }
    digest = hashlib.sha256(VERSION)
    digest.update(prev_hash.encode())
    digest.update(_canonical(header))
    return digest.hexdigest()


def header_middle(changeset: Any, revisions_hex: str) -> str:
    """The canonical header without its first member (``at``) and its last (``seq``).

    The write path has PostgreSQL compute the hash in the statement that draws
    ``seq`` and ``at`` (:func:`hash_sql`), so the log head's lock is taken and
    released without a round trip to Python in between. With sorted keys
    ``at`` sorts first and ``seq`` last, so the header PostgreSQL hashes is
    ``{"at":"<at>",`` + this + ``,"seq":<seq>}``, byte for byte what
    :func:`changeset_hash` hashes (``tests/changesets/test_chain.py`` pins it).
    """
    return _canonical(_header_rest(changeset, revisions_hex)).decode()[1:-1]


def hash_sql(*, prev: str, at: str, seq: str, middle: str) -> str:
    """SQL for :func:`changeset_hash` of SQL expressions ``prev``, ``at``, ``seq``
    and ``middle`` (the text of :func:`header_middle`), as its 32 bytes (``bytea``,
    how the hash columns store it: ``changesets.fields.ChainHashField``).

    ``prev`` is the previous hash's hex text, since that text is what the
    header hashes. ``at`` is formatted as :func:`_timestamp` does (UTC,
    microseconds, ``+00:00``).
    """
    return (
        "sha256(convert_to("
        f"'{VERSION.decode()}' || {prev} || '{{\"at\":\"'"
        f" || to_char(({at}) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        f" || '+00:00\",' || {middle} || ',\"seq\":' || ({seq})::text || '}}',"
        " 'UTF8'))"
    )
