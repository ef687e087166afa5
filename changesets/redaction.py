"""Redaction of images and their seals: the pure half of erasure.

Shared by the erase service (``changesets.services.erase``: revision rows, the
state at an archive cut) and the archive's rewrites (``changesets.archive.
rewrite``: segment lines), so a value is erased from a segment exactly as it
is from a row: replaced by ``"[erased]"``, its member's digest kept in the
seal, every other member's key kept, the salt destroyed (``changesets.chain``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from changesets import chain

ERASED = chain.ERASED
MSG_POINTER = "Must be a JSON pointer to a member, like /email (RFC 6901)."


def parse_pointer(pointer: str) -> list[str]:
    """RFC 6901 segments of a pointer to a member (``""``, the whole document, is refused)."""
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        raise ValueError(MSG_POINTER)
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]


def _erase_at(document: Any, segments: Sequence[str], found: list[Any]) -> bool:
    """Replace the value at ``segments`` with ``"[erased]"`` in place; append the old value."""
    parent = document
    for segment in segments[:-1]:
        parent = _child(parent, segment)
        if parent is _MISSING:
            return False
    last = segments[-1]
    if isinstance(parent, dict) and last in parent:
        slot: Any = last
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        slot = int(last)
    else:
        return False
    if parent[slot] == ERASED:
        return False
    found.append(parent[slot])
    parent[slot] = ERASED
    return True


_MISSING = object()


def _child(value: Any, segment: str) -> Any:
    if isinstance(value, dict):
        return value.get(segment, _MISSING)
    if isinstance(value, list) and segment.isdigit() and int(segment) < len(value):
        return value[int(segment)]
    return _MISSING


def redacted(
    content: Mapping[str, Any] | None, pointers: Iterable[str], found: list[Any]
) -> tuple[dict[str, Any] | None, set[str]]:
    """A copy of ``content`` with every pointer's value erased, and the top-level members hit."""
    if content is None:
        return None, set()
    copied = copy.deepcopy(dict(content))
    members = set()
    for pointer in pointers:
        segments = parse_pointer(pointer)
        if _erase_at(copied, segments, found):
            members.add(segments[0])
    return copied, members


def loads(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def seal_revision(
    salt: Any,
    sealed: Any,
    before: Any,
    after: Any,
    pointers: Sequence[str],
    found: list[Any],
) -> dict[str, Any] | None:
    """One revision redacted, or None if it holds none of the values.

    The seal keeps, per member of each image, the digest of an erased member
    (computed from its value now, before the value and the salt go) or the
    key of any other member (derived from the salt), so verification needs
    neither the salt nor the erased value again.
    """
    salt = None if salt is None else bytes(salt)
    seal = loads(sealed) or {}
    images = {"before": loads(before), "after": loads(after)}
    new_images, hit = {}, {}
    for side, image in images.items():
        new_images[side], hit[side] = redacted(image, pointers, found)
    if not any(hit.values()):
        return None
    new_seal: dict[str, Any] = {}
    for side, image in images.items():
        if image is None:
            continue
        side_seal = dict(seal.get(side) or {})
        for name, value in image.items():
            entry = side_seal.get(name)
            if name in hit[side] and (entry is None or "d" not in entry):
                key = bytes.fromhex(entry["k"]) if entry else _key(salt, side, name)
                side_seal[name] = {"d": chain.member_digest(key, value)}
            elif entry is None:
                side_seal[name] = {"k": _key(salt, side, name).hex()}
        new_seal[side] = side_seal
    return {**new_images, "sealed": new_seal}


def _key(salt: bytes | None, side: str, name: str) -> bytes:
    if salt is None:  # a sealed revision has every member in its seal
        raise AssertionError("revision without salt or seal for a member")
    return chain.member_key(salt, side, name)
