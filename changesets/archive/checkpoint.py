"""A cut's checkpoint: its body, signed (Ed25519) and stored beside the segments.

The body names everything an auditor checks (``changesets.archive.offline``):
the cut's range and chain hashes, each segment's name, SHA-256 and size, the
state digest, and the erasures whose marks the segments carry (as digests).
It is stored as ``checkpoints/<seq>.v<version>.json`` (a re-signing after an
erasure writes the next version, then deletes the older) and kept in the
database (``ArchiveCut.checkpoint``) for ``GET /log/checkpoints``.
"""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

from django.utils import timezone

from changesets import chain
from changesets.archive import offline, signing, storage
from changesets.archive.models import ArchiveCut
from changesets.models import Erasure

FORMAT = 1


def _ms(value: Any) -> str:
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _erasures(cut: ArchiveCut) -> list[dict[str, Any]]:
    """Every erasure reaching a namespace of the cut's segments, oldest first.

    Each lists what it covers as digests (``offline.cover_digest``) of
    (namespace, kind, slug, member): enough for the offline check that every
    erased member was erased by a recorded erasure, without publishing, to
    every reader of ``GET /log/checkpoints``, which entities were erased.
    """
    namespaces = sorted({ns for s in cut.segments.all() for ns in s.namespaces})
    records = Erasure.objects.filter(namespaces__overlap=namespaces).order_by("id")
    return [
        {
            "id": str(e.id),
            "at": _ms(e.at),
            "covers": sorted(offline.cover_digest(c) for c in chain.erasure_covers(e.targets)),
        }
        for e in records
    ]


def body(cut: ArchiveCut, *, public_key: str) -> dict[str, Any]:
    """The signed part of the checkpoint (everything but ``signature``)."""
    return {
        "atlas_archive_checkpoint": FORMAT,
        "algorithm": signing.ALGORITHM,
        "public_key": public_key,
        "seq": cut.seq,
        "hash": cut.hash,
        "at": _ms(cut.at),
        "from_seq": cut.from_seq,
        "prev_hash": cut.prev_hash,
        "v1_hash": cut.v1_hash or None,
        "changesets": cut.changesets,
        "revisions": cut.revisions,
        "max_changeset_id": str(cut.max_changeset_id),
        "state_digest": cut.state_digest,
        "segments": [
            {
                "name": s.name,
                "digest": s.digest,
                "bytes": s.bytes,
                "first_seq": s.first_seq,
                "last_seq": s.last_seq,
                "changesets": s.changesets,
                "revisions": s.revisions,
            }
            for s in cut.segments.order_by("first_seq")
        ],
        "erasures": _erasures(cut),
        "version": cut.rewrites,
        "signed_at": _ms(timezone.now()),
    }


def sign_and_store(cut: ArchiveCut) -> dict[str, Any]:
    """Sign the cut's checkpoint, store its file, and set it on ``cut`` (saved by the caller).

    Storing before the database commits is safe: a stored file whose cut did not
    commit is the same checkpoint again on the rerun (same name, written anew).
    """
    key = storage.signing_key()
    signed = body(cut, public_key=signing.public_key_text(key))
    signed["signature"] = signing.sign(signed, key)
    text = json.dumps(signed, ensure_ascii=False, indent=1, sort_keys=True) + "\n"
    storage.save_bytes(offline.checkpoint_name(cut.seq, cut.rewrites), text.encode())
    cut.checkpoint = {k: v for k, v in signed.items() if k != "signature"}
    cut.signature = signed["signature"]
    cut.signed_at = timezone.now()
    return signed


def published(cut: ArchiveCut) -> dict[str, Any]:
    """The checkpoint as ``GET /log/checkpoints`` lists it: the signed body and signature."""
    return {**(cut.checkpoint or {}), "signature": cut.signature}


def verify_stored(cut: ArchiveCut) -> bool:
    """The cut's recorded checkpoint verifies under the public key it names."""
    if not cut.checkpoint or not cut.signature:
        return False
    try:
        key = signing.load_public_key(str(cut.checkpoint.get("public_key", "")))
    except signing.BadKey:
        return False
    return signing.verify(published(cut), key)
