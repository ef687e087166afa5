"""The chain as it was before erasure (``atlas-chain-v1``), frozen.

v1 hashed every revision's full before and after images, so erasing a value
from an image broke every hash from there on; ``changesets.chain`` (v2)
replaced it. This module stays for three readers only: migration 0005 (which
built the v1 chain), migration 0018 (which checks the v1 chain it re-chains and
keeps each old changeset's v1 hash) and ``verify_log`` (which recomputes the
v1 hashes of old changesets whose images are intact, so a v1 anchor taken
before the re-chain can still be checked: docs/architecture.md).
Do not change it: a byte of difference breaks every v1 anchor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
VERSION = b"atlas-chain-v1"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def revision_fields(revision: Any) -> list[Any]:
    return [
        revision.namespace,
        revision.kind,
        revision.slug,
        str(revision.op),
        revision.before,
        revision.after,
        revision.before_version,
        revision.after_version,
        revision.branch,
    ]


def revisions_digest(revisions: Iterable[Any]) -> str:
    """Digest of a changeset's revisions (full images), in the order they were written."""
    digest = hashlib.sha256(VERSION)
    for revision in revisions:
        digest.update(_canonical(revision_fields(revision)))
        digest.update(b"\n")
    return digest.hexdigest()


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def changeset_hash(*, prev_hash: str, changeset: Any, revisions_hex: str) -> str:
    """The v1 hash: the header without any v2 member (``v1``), provenance only when set."""
    header: dict[str, Any] = {
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
    header["seq"] = changeset.seq
    header["at"] = _timestamp(changeset.at)
    digest = hashlib.sha256(VERSION)
    digest.update(prev_hash.encode())
    digest.update(_canonical(header))
    return digest.hexdigest()
