"""API keys: how they look and how they are hashed (no database access here).

A key is ``atlas_`` plus 40 hex digits (160 random bits). Only its SHA-256
digest is stored (``atlas.models.ApiToken``). A plain, unsalted hash is
enough for a random key of this strength (no dictionary to try, unlike a
password) and lets a request find its token by one unique-index seek on the
digest. Keys converted from DRF's old ``authtoken`` table (40 hex digits, no
``atlas_``) keep working: they are looked up the same way.
"""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "atlas_"
KEY_RANDOM_BYTES = 20
# Characters of a key shown in the admin and listings: enough to tell keys apart.
SHOWN_RANDOM_CHARS = 8


def generate_key() -> str:
    """A new random key (shown once, never stored)."""
    return KEY_PREFIX + secrets.token_hex(KEY_RANDOM_BYTES)


def key_digest(key: str) -> str:
    """The stored form of a key: its SHA-256 as 64 lowercase hex digits."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_prefix(key: str) -> str:
    """What people see of a key: ``atlas_`` and 8 characters, or 8 of an older key."""
    head = KEY_PREFIX if key.startswith(KEY_PREFIX) else ""
    return key[: len(head) + SHOWN_RANDOM_CHARS]
