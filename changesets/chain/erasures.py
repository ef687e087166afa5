"""The erasure records' own chain, and what an erasure's targets reach."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from changesets.chain.encoding import _canonical, _timestamp

ERASURE_VERSION = b"atlas-erasure-v1"


def erasure_hash(*, prev_hash: str, erasure: Any) -> str:
    """An erasure record's link in the erasures' own chain (who, when, why, where; no values).

    Erasures destroy values the log chain can no longer recompute, so the
    records of them are chained too: a forged, edited or removed erasure
    record breaks this chain, which ``verify_log`` walks in id order.
    """
    body = {
        "id": str(erasure.id),
        "author": erasure.author_name,
        "at": _timestamp(erasure.at),
        "reason": erasure.reason,
        "targets": erasure.targets,
        "revisions_redacted": erasure.revisions_redacted,
        "changesets": [str(c) for c in erasure.changeset_ids],
    }
    digest = hashlib.sha256(ERASURE_VERSION)
    digest.update(prev_hash.encode())
    digest.update(_canonical(body))
    return digest.hexdigest()


def erasure_covers(targets: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str, str]]:
    """(namespace, kind, slug, top-level member) that an erasure's targets reach."""
    covered = set()
    for t in targets:
        for pointer in t.get("pointers", []):
            first = pointer.split("/")[1] if pointer.count("/") else ""
            member = first.replace("~1", "/").replace("~0", "~")
            covered.add((t["namespace"], t["kind"], t["slug"], member))
    return covered
