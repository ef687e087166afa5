"""How a statement seeks one entity's revisions on ``revision_key`` (migration 0041).

The index is keyed by ``atlas_key_hash(branch, namespace, kind, slug)``, a
64-bit hash of branch and key, then ``seq``. The planner uses it only for a
condition that spells that call over the table's columns, so every seek goes
through here:

- :func:`key_hash` is that call over a table alias, for raw SQL;
- :func:`seek` is the whole condition for one key, with its parameters: the
  hash of the key, and the real branch and key, which a colliding key's rows
  fail;
- :func:`joined` is the same for a key named by another relation's row (a
  lateral seek per row);
- :class:`KeyHash`, :class:`HashOf` and :class:`KeyIs` are the same for the
  ORM (``RevisionQuerySet.of_entity``).

The real key is compared inside ``COALESCE(…, false)`` (its columns are never
NULL, so it means the same). That hides it from the planner's row estimate: it
takes an opaque boolean to pass half the rows, where it multiplied the hash's
selectivity by each column's, as if they were independent, when the hash
already implies them. With the estimate near one row, the planner chose to
read all of a busy entity's revisions and sort them for a page of 200, where
the index returns them in order (``tests/changesets/test_scale_plans.py``).
"""

from __future__ import annotations

from typing import Any

from django.db import models


def key_hash(alias: str) -> str:
    """``revision_key``'s expression over ``alias``'s columns."""
    return f"atlas_key_hash({alias}.branch, {alias}.namespace, {alias}.kind, {alias}.slug)"


def seek(alias: str, branch: str, namespace: str, kind: str, slug: str) -> tuple[str, list[Any]]:
    """SQL for ``alias``'s rows of one key on one branch (a seek on ``revision_key``)."""
    key = [branch, namespace, kind, slug]
    return (
        f"{key_hash(alias)} = atlas_key_hash(%s, %s, %s, %s) AND COALESCE({alias}.branch = %s"
        f" AND {alias}.namespace = %s AND {alias}.kind = %s AND {alias}.slug = %s, false)",
        [*key, *key],
    )


def joined(alias: str, other: str, *, branch: str | None = None) -> str:
    """SQL for ``alias``'s rows of the key ``other`` names (a lateral seek per row).

    ``other`` has ``namespace``, ``kind`` and ``slug`` columns, and ``branch``
    unless it is given (a literal, e.g. ``"''"`` for the baseline).
    """
    on = f"{other}.branch" if branch is None else branch
    return (
        f"{key_hash(alias)} = atlas_key_hash({on}, {other}.namespace, {other}.kind, {other}.slug)"
        f" AND {same_key(alias, other, branch=branch)}"
    )


def same_key(alias: str, other: str, *, branch: str | None = None) -> str:
    """:func:`joined`'s test of the real key, hidden from the row estimate, alone."""
    on = f"{other}.branch" if branch is None else branch
    return (
        f"COALESCE({alias}.branch = {on} AND {alias}.namespace = {other}.namespace"
        f" AND {alias}.kind = {other}.kind AND {alias}.slug = {other}.slug, false)"
    )


class KeyHash(models.Func):
    """``revision_key``'s expression over the query's revision columns (the ORM's
    aliases qualify them), to compare with :class:`HashOf`."""

    function = "atlas_key_hash"
    output_field = models.BigIntegerField()

    def __init__(self) -> None:
        super().__init__(
            models.F("branch"), models.F("namespace"), models.F("kind"), models.F("slug")
        )


class HashOf(models.Func):
    """The hash :class:`KeyHash` gives for a key given as values."""

    function = "atlas_key_hash"
    output_field = models.BigIntegerField()

    def __init__(self, branch: str, namespace: str, kind: str, slug: str) -> None:
        values = (branch, namespace, kind, slug)
        super().__init__(*(models.Value(v, output_field=models.TextField()) for v in values))


class KeyIs(models.Func):
    """The real key's test for the ORM, hidden from the row estimate as :func:`seek`'s is."""

    template = "COALESCE(%(expressions)s, false)"
    output_field = models.BooleanField()

    def __init__(self, branch: str, namespace: str, kind: str, slug: str) -> None:
        same = models.Q(branch=branch, namespace=namespace, kind=kind, slug=slug)
        super().__init__(models.ExpressionWrapper(same, output_field=models.BooleanField()))
