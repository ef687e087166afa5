"""Side-by-side diffs of two entity images, for the admin's templates.

One row per top-level key of either image, marked ``added``, ``removed``,
``changed`` or ``same``; values are pretty JSON. Within a changed value the
lines that differ are marked too, so a change deep inside a nested object is
easy to find. Values compare as canonical JSON (``1`` is not ``true``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from atlas.admin_mixins import pretty_json
from changesets.ops import canonical

ADDED, REMOVED, CHANGED, SAME = "added", "removed", "changed", "same"


@dataclass(frozen=True)
class Line:
    text: str
    marked: bool


@dataclass(frozen=True)
class DiffRow:
    key: str
    status: str
    before: list[Line] | None  # None: the key is absent on that side
    after: list[Line] | None


@dataclass(frozen=True)
class Diff:
    rows: list[DiffRow]
    before_exists: bool
    after_exists: bool

    @property
    def changed_keys(self) -> list[str]:
        return [row.key for row in self.rows if row.status != SAME]


def _lines(value: Any, marked: bool) -> list[Line]:
    return [Line(text, marked) for text in pretty_json(value).splitlines()]


def _marked_pair(before: Any, after: Any) -> tuple[list[Line], list[Line]]:
    """Both values' lines, with the lines that differ between them marked."""
    a, b = pretty_json(before).splitlines(), pretty_json(after).splitlines()
    marked_a, marked_b = set(range(len(a))), set(range(len(b)))
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            marked_a -= set(range(i1, i2))
            marked_b -= set(range(j1, j2))
    return (
        [Line(text, i in marked_a) for i, text in enumerate(a)],
        [Line(text, j in marked_b) for j, text in enumerate(b)],
    )


def diff_images(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Diff:
    """Rows for every top-level key of ``before`` or ``after`` (either may be None)."""
    old, new = before or {}, after or {}
    rows: list[DiffRow] = []
    for key in sorted(set(old) | set(new)):
        if key not in old:
            rows.append(DiffRow(key, ADDED, None, _lines(new[key], True)))
        elif key not in new:
            rows.append(DiffRow(key, REMOVED, _lines(old[key], True), None))
        elif canonical(old[key]) == canonical(new[key]):
            rows.append(DiffRow(key, SAME, _lines(old[key], False), _lines(new[key], False)))
        else:
            left, right = _marked_pair(old[key], new[key])
            rows.append(DiffRow(key, CHANGED, left, right))
    return Diff(rows=rows, before_exists=before is not None, after_exists=after is not None)
