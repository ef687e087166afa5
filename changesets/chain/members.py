"""Salted member digests: steps 1-3 of ``changesets.chain``'s docstring.

A revision's salt, the key of each top-level member of its images, and the
digest of each member's value; a sealed member (an erasure ran) by its kept
key or digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring as _encode_string
from typing import Any

ERASED = "[erased]"
SALT_BYTES = 16
SIDES = ("before", "after")


def new_salt() -> bytes:
    """A revision's salt: 16 random bytes (128 bits: no table of small values can cover it)."""
    return os.urandom(SALT_BYTES)


# One encoder, built once: ``json.dumps`` with options builds a new one per call,
# which is most of a member digest's cost. Same output as ``_canonical``.
_encoder = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


def _encode(value: Any) -> str:
    """``_canonical(value)`` as text. Strings and integers, most members' values,
    skip the encoder's generic path (an integer through it costs seven times its
    ``repr``); the output is the encoder's own (``tests/changesets/test_chain_encoding.py``)."""
    kind = type(value)
    if kind is str:
        return _encode_string(value)
    if kind is int:
        return int.__repr__(value)
    return _encoder(value)


def member_key(salt: bytes, side: str, name: str) -> bytes:
    """The key of one member of one image (step 2 of the package docstring).

    Keyed BLAKE2b is a PRF/MAC by design (no length extension), and about
    three times faster than HMAC-SHA256 here, which matters: a write makes two
    of these per top-level member of each image.
    """
    return _member_keys(salt)(side, name)


def _member_keys(salt: bytes) -> Callable[[str, str], bytes]:
    """:func:`member_key` for one salt, for an image's many members: the keyed
    state is set up once and copied (a copy costs three quarters of a fresh keyed
    hash, which processes a whole block for the key). The key of member ``name`` of
    image ``side`` is ``BLAKE2b-256(side + NUL + name, key=salt)``."""
    keyed = hashlib.blake2b(key=salt, digest_size=32)

    def key(side: str, name: str) -> bytes:
        state = keyed.copy()
        state.update(f"{side}\0{name}".encode())
        return state.digest()

    return key


def member_digest(key: bytes, value: Any) -> str:
    return hashlib.blake2b(_encode(value).encode(), key=key, digest_size=32).hexdigest()


def image_digests(
    image: Mapping[str, Any] | None,
    *,
    side: str,
    salt: bytes | None,
    sealed: Mapping[str, Any] | None = None,
) -> dict[str, str] | None:
    """``{member: digest}`` of one image (None for an absent image).

    A sealed member (an erasure ran on the revision) uses its kept key, or,
    if the member was erased, its kept digest; otherwise the salt derives
    the key. A member that has neither (a row edited to add one) digests to
    an empty string, which never matches the chain.
    """
    if image is None:
        return None
    seal = (sealed or {}).get(side) or {}
    key = _member_keys(salt) if salt is not None else None
    out: dict[str, str] = {}
    for name, value in image.items():
        entry = seal.get(name)
        if entry is not None:
            kept = entry.get("d")
            out[name] = (
                kept
                if isinstance(kept, str)
                else member_digest(bytes.fromhex(entry.get("k", "")), value)
            )
        elif key is not None:
            out[name] = member_digest(key(side, name), value)
        else:
            out[name] = ""
    return out
