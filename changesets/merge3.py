"""One three-way merge over entity content: (base, ours, theirs) → merged, or conflicts.

Pure Python, no database: key-level revert (``changesets.services.revert``),
key-level merge and branch sync (``branches``) all call :func:`merge3`, so one
rule decides what a concurrent change is. A document is an entity's content
(a JSON object) or ``None`` (the entity does not exist).

Pointers are the ones revisions' ``changed`` lists use (:func:`changesets.pointers.changed`):
object members recursively; arrays, scalars and empty objects are values.

The algorithm, for three objects:

1. ``ours_changed`` = changed(base, ours), ``theirs_changed`` = changed(base, theirs).
   Within each list no pointer lies inside another (they are the deepest ones).
2. Start from ``ours``. For each pointer P theirs changed:
   a. no pointer ours changed is related to P (equal, inside, containing):
      ours still holds base's value at P, so theirs' value is set there
      (or the member removed, when theirs removed it);
   b. otherwise the shallowest of P and the related pointers, S, is where both
      sides meet. Ours and theirs holding the same value at S: nothing to do
      (both made the same change). Different values: a conflict at S, with
      base's, ours' and theirs' values there (``None`` where absent).
3. The merged document keeps ours' value at every conflict, so a caller can
   settle conflicts one by one (:func:`take`).

Documents that are not all objects (a side absent) merge whole: theirs when
ours did not move, ours when theirs did not move or both agree, else one
conflict at ``""`` (the whole document). ``granularity="entity"`` treats
objects the same way.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from changesets.canonical import same_content
from changesets.pointers import changed, join, relates, segments

Doc = dict[str, Any] | None
Granularity = Literal["entity", "key"]
GRANULARITIES: tuple[Granularity, ...] = ("entity", "key")


class _Missing:
    """A member that is not there (distinct from JSON ``null``)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


@dataclass(frozen=True)
class Conflict:
    """Both sides changed ``pointer`` (or something at or inside it) differently.

    Values are those at ``pointer`` in each document; ``None`` where absent
    (for ``""``: where the entity does not exist).
    """

    pointer: str
    base: Any
    ours: Any
    theirs: Any


@dataclass(frozen=True)
class Merged:
    """The merge: ``content`` holds ours' value at every conflict."""

    content: Doc
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.conflicts


def merge3(base: Doc, ours: Doc, theirs: Doc, *, granularity: Granularity = "key") -> Merged:
    """Three-way merge of ``theirs``' changes (relative to ``base``) into ``ours``."""
    if same_content(theirs, base) or same_content(ours, theirs):
        return Merged(ours)
    if same_content(ours, base):
        return Merged(theirs)
    if base is None or ours is None or theirs is None or granularity == "entity":
        return Merged(ours, [Conflict("", base, ours, theirs)])
    return _merge_objects(base, ours, theirs)


def _merge_objects(base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any]) -> Merged:
    ours_changed = changed(base, ours)
    result: dict[str, Any] = copy.deepcopy(ours)
    conflicts: dict[str, Conflict] = {}
    for pointer in changed(base, theirs):
        related = [q for q in ours_changed if relates(q, pointer)]
        if not related:
            result = put(result, pointer, value_at(theirs, pointer))
            continue
        meet = min([pointer, *related], key=lambda p: len(segments(p)))
        if meet in conflicts:
            continue
        o, t = value_at(ours, meet), value_at(theirs, meet)
        if same_content(_absent_as_none(o), _absent_as_none(t)) and (o is MISSING) == (
            t is MISSING
        ):
            continue
        conflicts[meet] = Conflict(
            meet, _absent_as_none(value_at(base, meet)), _absent_as_none(o), _absent_as_none(t)
        )
    ordered = sorted(conflicts.values(), key=lambda c: segments(c.pointer))
    return Merged(result, ordered)


def _absent_as_none(value: Any) -> Any:
    return None if value is MISSING else value


def value_at(doc: Doc, pointer: str) -> Any:
    """The value at ``pointer`` in ``doc``, or :data:`MISSING`."""
    value: Any = doc
    if value is None:
        return MISSING
    for name in segments(pointer):
        if not isinstance(value, dict) or name not in value:
            return MISSING
        value = value[name]
    return value


def put(doc: dict[str, Any], pointer: str, value: Any) -> dict[str, Any]:
    """``doc`` with ``value`` at ``pointer`` (the member removed for :data:`MISSING`).

    Copies along the path only; the parents must be objects (the merge only
    writes where base, ours and theirs all have objects above ``pointer``).
    """
    parts = segments(pointer)
    if not parts:
        raise ValueError("put() sets members; the whole document is replaced by its caller")
    out = dict(doc)
    node = out
    for depth, name in enumerate(parts[:-1], start=1):
        child = node.get(name)
        if not isinstance(child, dict):
            raise ValueError(f"no object at {join(parts[:depth])!r}")
        node[name] = dict(child)
        node = node[name]
    if value is MISSING:
        node.pop(parts[-1], None)
    else:
        node[parts[-1]] = copy.deepcopy(value)
    return out


def take(merged: Doc, theirs: Doc, pointer: str) -> Doc:
    """``merged`` with theirs' value at a conflict's ``pointer`` (the whole of theirs for ``""``).

    Settling a conflict "take theirs"; "take ours" is the merge as it is.
    Conflict pointers never lie inside one another, so settling them in any
    order gives the same document.
    """
    if pointer == "" or merged is None:
        return copy.deepcopy(theirs)
    return put(merged, pointer, value_at(theirs, pointer))
