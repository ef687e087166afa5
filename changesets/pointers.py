"""RFC 6901 JSON pointers into an entity's content, as key-level history uses them.

A revision's ``changed`` pointers are computed in PostgreSQL, inside the log
statement (``atlas_changed_keys``, migration 0013), so a batch of any size
costs no Python loop. :func:`changed` is the same rule in Python, for the
three-way merge (:mod:`changesets.merge3`), pinned to the SQL function by
``tests/changesets/test_changed_keys.py``. What is here besides is the rest
of the rule, for reads: the
syntax a ``key`` query parameter must have, the leaves blame reports, the
key rule ("equal, inside or containing") and the sort order of API.md
("Decisions for the added sections"): by unescaped segments, segment by
segment, in code point order. Python compares ``str`` by code point, so a
tuple of segments is that order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from changesets.canonical import canonical

# A pointer a client may send: "" (the whole document) or "/"-separated segments
# where "~" only escapes ("~0" is "~", "~1" is "/"). U+0000 can be in no stored key.
MAX_POINTER_LENGTH = 2000
POINTER_PATTERN = r"^(/([^~/\x00]|~[01])*)*$"  # as the OpenAPI document states it
_POINTER = re.compile(POINTER_PATTERN[1:-1])
MSG_POINTER = (
    'Must be an RFC 6901 JSON pointer: "" or "/"-separated segments, "~" only as'
    ' "~0" or "~1", at most 2000 characters, no U+0000.'
)


def is_pointer(value: str) -> bool:
    """Whether ``value`` is a well-formed pointer a client may filter by."""
    return len(value) <= MAX_POINTER_LENGTH and _POINTER.fullmatch(value) is not None


def escape(segment: str) -> str:
    return segment.replace("~", "~0").replace("/", "~1")


def unescape(segment: str) -> str:
    return segment.replace("~1", "/").replace("~0", "~")


def segments(pointer: str) -> tuple[str, ...]:
    """The unescaped segments of a well-formed pointer ("" has none)."""
    if not pointer:
        return ()
    return tuple(unescape(part) for part in pointer[1:].split("/"))


def join(parts: Iterable[str]) -> str:
    return "".join("/" + escape(part) for part in parts)


def sort_key(pointer: str) -> tuple[str, ...]:
    """API.md's order of pointers: unescaped segments compared in code point order."""
    return segments(pointer)


def relates(changed: str, key: str) -> bool:
    """The key rule: ``changed`` equals ``key``, lies inside it, or contains it."""
    # key "" is the whole document: every pointer starts with "" + "/".
    return changed == key or changed.startswith(key + "/") or key.startswith(changed + "/")


def leaves(content: dict[str, Any]) -> list[str]:
    """Every leaf of ``content``, sorted: object members recursively, where an
    array, a scalar, or an empty object or array is a leaf (API.md)."""
    found = sorted(_leaves(content, ()))
    return [join(parts) for parts in found]


def _leaves(value: dict[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, member in value.items():
        here = (*path, name)
        if isinstance(member, dict) and member:
            yield from _leaves(member, here)
        else:
            yield here


def changed(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[str]:
    """The pointer rule of API.md ("Changed keys"), as ``atlas_changed_keys`` computes it.

    A create or a delete (one side ``None``) names every top-level member; an
    update the deepest object-member paths whose values differ: objects are
    compared member by member, arrays and scalars as whole values (``1``,
    ``1.0`` and ``true`` all differ), a member added or removed counts. Sorted
    like every pointer list (:func:`sort_key`).
    """
    found: list[tuple[str, ...]]
    if before is None or after is None:
        found = [(name,) for name in (after if before is None else before) or {}]
    else:
        found = list(_changed(before, after, ()))
    return [join(parts) for parts in sorted(found)]


def _changed(
    b: dict[str, Any], a: dict[str, Any], path: tuple[str, ...]
) -> Iterator[tuple[str, ...]]:
    for name in b.keys() | a.keys():
        here = (*path, name)
        if name in b and name in a and isinstance(b[name], dict) and isinstance(a[name], dict):
            yield from _changed(b[name], a[name], here)
        elif name not in b or name not in a or canonical(b[name]) != canonical(a[name]):
            yield here
