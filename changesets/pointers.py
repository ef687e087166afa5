"""RFC 6901 JSON pointers into an entity's content, as key-level history uses them.

A revision's ``changed`` pointers are computed in PostgreSQL, inside the log
statement (``atlas_changed_keys``, migration 0013), so a batch of any size
costs no Python loop. What is here is the rest of the rule, for reads: the
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
