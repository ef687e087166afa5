"""Name and content rules from API.md, shared by the API layer and the services.

Why here and not in serializers: imports, reverts and merges build op lists
inside services, and the rules must hold for them too (DESIGN invariant 1).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any, NamedTuple

from atlas import conf

NAMESPACE_RE = re.compile(r"^[a-z0-9_-]+(\.[a-z0-9_-]+)*$")
KIND_RE = re.compile(r"^[a-z][a-z0-9_]*$")
# A slug made only of dots (".", "..") is refused: HTTP clients resolve such a
# path segment away (RFC 3986 5.2.4), so nobody could address the entity.
# Namespaces and kinds cannot be dots by their own patterns.
SLUG_RE = re.compile(r"^(?!\.+$)[A-Za-z0-9._-]{1,200}$")
NAMESPACE_MAX_LENGTH = 200
KIND_MAX_LENGTH = 100

MSG_NAMESPACE = "Namespace must be dotted lowercase segments of [a-z0-9_-]."
MSG_KIND = "Kind must match [a-z][a-z0-9_]*."
MSG_SLUG = "Slug must be 1-200 characters of [A-Za-z0-9._-], not only dots."
MSG_CONTENT_OBJECT = "Content must be a JSON object."
MSG_BAD_TEXT = "Text may not contain U+0000, and nesting may not exceed 64 levels."
MSG_CONTENT_TOO_LARGE = "Content is {size} bytes encoded; the limit is {limit}."


def is_valid_namespace(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= NAMESPACE_MAX_LENGTH
        and NAMESPACE_RE.fullmatch(value) is not None
    )


def is_valid_kind(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) <= KIND_MAX_LENGTH
        and KIND_RE.fullmatch(value) is not None
    )


def is_valid_slug(value: object) -> bool:
    return isinstance(value, str) and SLUG_RE.fullmatch(value) is not None


def encoded_size(content: Any) -> int:
    """Size of ``content`` as compact UTF-8 JSON, the measure of the content limit."""
    return len(json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode())


def content_too_large(content: Any) -> str | None:
    """Return an error message when ``content`` is over ``ATLAS_MAX_CONTENT_BYTES``."""
    limit = conf.get("ATLAS_MAX_CONTENT_BYTES")
    size = encoded_size(content)
    if size > limit:
        return MSG_CONTENT_TOO_LARGE.format(size=size, limit=limit)
    return None


MAX_DEPTH = 64


def find_nul(value: Any) -> str | None:
    """Pointer to the first string or key holding U+0000, which jsonb cannot store.

    Also refuses nesting deeper than ``MAX_DEPTH`` (returning that pointer), so
    later recursive code (encoding, comparison) never meets a pathological tree.
    Iterative, so it cannot itself overflow the stack.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, pointer, depth = stack.pop()
        if depth > MAX_DEPTH:
            return pointer
        if isinstance(item, str):
            if "\x00" in item:
                return pointer
        elif isinstance(item, dict):
            for key, child in item.items():
                here = pointer + "/" + str(key).replace("~", "~0").replace("/", "~1")
                if "\x00" in str(key):
                    return here
                stack.append((child, here, depth + 1))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                stack.append((child, f"{pointer}/{index}", depth + 1))
    return None


MSG_PATCH_OBJECT = "A merge patch of content must be an object."


class ContentProblem(NamedTuple):
    """What is wrong with a value given as content: where inside it, and why."""

    pointer: str  # RFC 6901, relative to the content ("" = the whole value)
    message: str
    too_large: bool = False  # 413, not 422


def content_problem(value: Any) -> ContentProblem | None:
    """The first thing that makes ``value`` unfit to be an entity's content, or None.

    The one statement of the content rules (API.md "Entity refs"): a JSON
    object, no U+0000 in any key or string, at most 64 levels deep, at most
    ``ATLAS_MAX_CONTENT_BYTES`` encoded. Checked in that order, so the cheap
    checks answer first and the size is measured only of a storable value.
    """
    if not isinstance(value, dict):
        return ContentProblem("", MSG_CONTENT_OBJECT)
    bad = find_nul(value)
    if bad is not None:
        return ContentProblem(bad, MSG_BAD_TEXT)
    too_large = content_too_large(value)
    if too_large:
        return ContentProblem("", too_large, too_large=True)
    return None


def patch_problem(value: Any) -> ContentProblem | None:
    """The first thing that makes ``value`` unfit to be an RFC 7396 merge patch of content.

    Its size is not limited here: the content it produces is, when applied.
    """
    if not isinstance(value, dict):
        return ContentProblem("", MSG_PATCH_OBJECT)
    bad = find_nul(value)
    if bad is not None:
        return ContentProblem(bad, MSG_BAD_TEXT)
    return None


MSG_NOT_FINITE = "Numbers must be finite (no NaN or Infinity)."


def as_stored(value: Any) -> Any:
    """``value`` as PostgreSQL's ``jsonb`` will give it back.

    jsonb keeps numbers as ``numeric`` with the scale they were written with,
    so ``1e16`` comes back as the integer ``10000000000000000`` and ``-0.0``
    as ``0.0``. Normalizing before comparing and storing makes "byte-identical"
    mean the same thing on both sides of the database (invariant 3), and makes
    a revision's images exactly what a later read returns. Callers bound the
    depth first (:func:`find_nul`).
    """
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(MSG_NOT_FINITE)
        number = Decimal(repr(value))
        exponent = number.as_tuple().exponent
        if isinstance(exponent, int) and exponent >= 0:
            return int(number)
        return float(number) or 0.0  # -0.0 is stored as 0.0
    if isinstance(value, dict):
        return {key: as_stored(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_stored(item) for item in value]
    return value
