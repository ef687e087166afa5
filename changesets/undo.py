"""A revision's before image, stored as what differs from its after image.

A revision row keeps ``after`` whole and, instead of a second whole image,
only what rebuilds ``before`` from it (migration 0029; docs/architecture.md,
"How a revision stores its before image"):

- ``create``: nothing (before is absent);
- ``delete``: ``undo`` is the whole before image (after is absent);
- ``update``: ``undo`` holds the top-level members of before whose value
  differs from after's, or that after no longer has; ``undo_gone`` names the
  members after has and before had not. Either is NULL when empty.

The rebuild is ``before = (after - undo_gone) || undo``: jsonb's ``-`` of a
``text[]`` and ``||`` of two objects, both top-level only, exactly this. In
SQL it is ``atlas_before_image(op, after, undo, undo_gone)``; this module is
the same rule for rows already in Python, so a reader that has ``after``
decoded pays for decoding only the (small) ``undo``.

Member equality is decided in SQL (``atlas_undo``), by the members' ``jsonb``
texts: ``1`` and ``1.0`` are equal as jsonb numbers but print differently, so
a member is left to ``after`` only when its text is byte for byte the one
``before`` would print. The rebuilt image is therefore the stored one, member
for member; :func:`before_image` gives them in jsonb's key order (shorter keys
first, then bytewise), the order a ``before`` column used to come back in, so
every rendering of it is unchanged. (``after`` as read is in that order already:
only when removed members come back does the rebuild sort.)

Pure, like :mod:`changesets.canonical`: no Django, so the pure modules can use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def jsonb_key_order(item: tuple[str, Any]) -> tuple[int, bytes]:
    """The sort key PostgreSQL gives an object member's name: byte length, then bytes."""
    name = item[0].encode()
    return len(name), name


def before_image(
    op: str,
    after: Mapping[str, Any] | None,
    undo: Mapping[str, Any] | None,
    undo_gone: Iterable[str] | None,
) -> dict[str, Any] | None:
    """The before image of a revision stored as ``(op, after, undo, undo_gone)``.

    A new dict each call (its member values are shared with ``after`` and
    ``undo``: the log's images are read, never edited in place).
    """
    if op != "update":
        # create: None; delete: the whole image. A copy, so that no two readers
        # of one row share the top-level dict.
        return None if undo is None else dict(undo)
    if after is None:  # not a stored shape (revision_images_match_op refuses it)
        return None
    gone = frozenset(undo_gone) if undo_gone else frozenset()
    changed = undo or {}
    if all(name in after for name in changed):
        # Nothing removed (the common update): before's members are after's less the
        # gone ones, so after's order (jsonb's) is theirs; no sort.
        return {k: changed.get(k, v) for k, v in after.items() if k not in gone}
    members = [(k, v) for k, v in after.items() if k not in gone and k not in changed]
    members.extend(changed.items())
    members.sort(key=jsonb_key_order)
    return dict(members)
