"""What the chain commits to for a changeset's revisions: one digest line per
revision (its images as member digests), from a stored row or, on the write path,
before the row exists, and the digest of those lines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from changesets.chain.encoding import VERSION, _canonical
from changesets.chain.members import image_digests


def _salt(revision: Any) -> bytes | None:
    salt = getattr(revision, "salt", None)
    return None if salt is None else bytes(salt)


def revision_fields(revision: Any) -> list[Any]:
    """What the chain commits to for one revision row (its images as member digests)."""
    salt, sealed = _salt(revision), getattr(revision, "sealed", None)
    return [
        revision.namespace,
        revision.kind,
        revision.slug,
        str(revision.op),
        image_digests(revision.before, side="before", salt=salt, sealed=sealed),
        image_digests(revision.after, side="after", salt=salt, sealed=sealed),
        revision.before_version,
        revision.after_version,
        revision.branch,
    ]


def revisions_digest(revisions: Iterable[Any]) -> str:
    """Digest of a changeset's revisions, in the order they were written."""
    return digest_lines(_canonical(revision_fields(r)).decode() for r in revisions)


def revision_line(
    *,
    namespace: str,
    kind: str,
    slug: str,
    op: str,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any] | None,
    salt: bytes,
    before_version: int | None,
    after_version: int | None,
    branch: str,
) -> str:
    """One revision's digest line as the write path makes it, before the row exists.

    The same encoding :func:`revision_fields` gives a stored row (``tests/
    changesets/test_write_path.py`` pins it byte for byte).
    """
    fields = [
        namespace,
        kind,
        slug,
        str(op),
        image_digests(before, side="before", salt=salt),
        image_digests(after, side="after", salt=salt),
        before_version,
        after_version,
        branch,
    ]
    return _canonical(fields).decode()


def digest_lines(lines: Iterable[str]) -> str:
    """:func:`revisions_digest` over lines made by :func:`revision_line`."""
    digest = hashlib.sha256(VERSION)
    digest.update("".join(line + "\n" for line in lines).encode())
    return digest.hexdigest()
