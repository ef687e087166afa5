"""The tamper-evident log: a hash chain over changesets in seq order (v2).

Each changeset's ``hash`` is SHA-256 over the previous changeset's hash, a
canonical encoding of its own fields, and a digest of its revisions, so an
edit or deletion of any changeset or revision row, anywhere in the log,
breaks every hash from there on. ``verify_log`` recomputes the chain;
``GET /api/v1/log/head`` publishes the newest seq and hash so that others
can anchor it (keep a copy elsewhere; a rewritten log can't match it).

Why v2 commits to member digests, not images (docs/architecture.md, "A
chain that survives erasure"): an erasure must be able to destroy a value
and leave the rest of the log verifiable. So a revision's digest line holds,
for each top-level member of its before and after images, a salted digest
of that member's value, not the value:

1. Every revision row has a random 16-byte ``salt``.
2. Member ``name`` of side ``before``/``after`` has the key
   ``BLAKE2b-256(side + NUL + name, key=salt)``, and the digest
   ``BLAKE2b-256(canonical(value), key=key)`` (keyed BLAKE2b is a MAC). Keys
   are independent: knowing one member's key says nothing about another's,
   nor about the salt.
3. An erasure (``changesets.services.erase``) replaces the value with
   ``"[erased]"``, sets the salt to NULL and keeps, in ``sealed``, the digest
   of each erased member (``{"d": hex}``) and the key of every other member
   (``{"k": hex}``). The erased value can no longer be recomputed or
   brute-forced (its key is gone with the salt); every other member still is.

The revision digest is computed before the write takes the log head's lock,
so the serialized part of a commit only hashes a few hundred bytes.
``changesets.chainv1`` keeps the chain before erasure (migration 0018
re-chained v1 logs; each old changeset keeps its v1 hash, committed to in
its v2 header).

Where it lives: ``encoding`` (the version tag, the genesis hash, the canonical
JSON and the time), ``members`` (steps 1-3: salts, member keys and digests),
``revisions`` (a revision's digest line, from a row or from the write path),
``header`` (a changeset's header and hash, and the SQL twin the write path
runs), ``verification`` (the walk of ``verify_log`` and the archive) and
``erasures`` (the erasure records' own chain). Import from the package.
"""

from __future__ import annotations

from changesets.chain.encoding import GENESIS, VERSION
from changesets.chain.erasures import ERASURE_VERSION, erasure_covers, erasure_hash
from changesets.chain.header import changeset_hash, hash_sql, header_middle
from changesets.chain.members import (
    ERASED,
    SALT_BYTES,
    SIDES,
    image_digests,
    member_digest,
    member_key,
    new_salt,
)
from changesets.chain.revisions import (
    digest_lines,
    revision_fields,
    revision_line,
    revisions_digest,
)
from changesets.chain.verification import Break, Start, Stats, holds_erased, verify

__all__ = [
    "ERASED",
    "ERASURE_VERSION",
    "GENESIS",
    "SALT_BYTES",
    "SIDES",
    "VERSION",
    "Break",
    "Start",
    "Stats",
    "changeset_hash",
    "digest_lines",
    "erasure_covers",
    "erasure_hash",
    "hash_sql",
    "header_middle",
    "holds_erased",
    "image_digests",
    "member_digest",
    "member_key",
    "new_salt",
    "revision_fields",
    "revision_line",
    "revisions_digest",
    "verify",
]
