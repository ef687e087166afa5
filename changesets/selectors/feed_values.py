"""A feed record's ``old_values`` and ``new_values``: the top-level members an
operation changed, compared as JSON (``changesets.selectors.feed`` builds the
records; ``capture`` picks which of these it shows).
"""

from __future__ import annotations

from typing import Any

from changesets.ops import same_content
from changesets.undo import before_image


def changed_values(
    before: dict[str, Any] | None, after: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(old_values, new_values)`` of the top-level keys whose value changed.

    A removed key maps to null in ``new_values``; a key that did not exist
    before is absent from ``old_values``. Values are compared as JSON (``1``
    is not ``1.0`` is not ``true``), as everywhere in Atlas.
    """
    b, a = before or {}, after or {}
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key, value in a.items():
        if key not in b:
            new[key] = value
        elif not _same(b[key], value):
            new[key] = value
            old[key] = b[key]
    for key, value in b.items():
        if key not in a:
            new[key] = None
            old[key] = value
    return old, new


def stored_changed_values(
    op: str,
    after: dict[str, Any] | None,
    undo: dict[str, Any] | None,
    undo_gone: list[str] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`changed_values` of a revision as stored (``changesets.undo``), the same
    dicts in the same order, without rebuilding its before image.

    An update's members outside ``undo`` and ``undo_gone`` print alike on both
    sides, so they are skipped unread; ``undo`` is in jsonb key order, which is
    the before image's, so removed members come out in the order ``changed_values``
    gives them. A create or a delete goes the long way (nothing to skip).
    ``tests/changesets/test_undo.py`` pins it against :func:`changed_values`.
    """
    if op != "update" or after is None:
        return changed_values(before_image(op, after, undo, undo_gone), after)
    changed = undo or {}
    gone = frozenset(undo_gone or ())
    old: dict[str, Any] = {}
    new: dict[str, Any] = {}
    for key, value in after.items():
        if key in gone:
            new[key] = value
        elif key in changed and not _same(changed[key], value):
            new[key] = value
            old[key] = changed[key]
    for key, value in changed.items():
        if key not in after:
            new[key] = None
            old[key] = value
    return old, new


def _same(a: Any, b: Any) -> bool:
    """Byte-identical JSON values, without encoding the common unchanged ones.

    Values of different Python types never encode alike (``1``, ``1.0`` and
    ``true`` are three), and equal strings, integers, booleans or nulls always do; only
    floats (``0.0`` is not ``-0.0``), arrays and objects need the canonical
    comparison (``same_content``). Most members of an update are unchanged
    scalars: encoding each of them twice was most of a feed page's time.
    """
    if type(a) is not type(b):
        return False
    if a is None or type(a) in (str, int, bool):
        return a == b
    return same_content(a, b)
