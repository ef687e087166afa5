"""Domain assertions for the changeset log.

JSON is compared through :func:`changesets.ops.canonical`, never with ``==``:
Python calls ``1``, ``1.0`` and ``True`` equal, JSON does not, and the log
must not either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from changesets.models import Changeset, JournalEntry, LogHead, Revision
from changesets.ops import canonical
from entities.models import Entity
from entities.store import EntityKey

_UNSET: Any = object()


def key(path: str) -> EntityKey:
    """``key("acme.orders/order/o-1")``."""
    return EntityKey(*path.split("/"))


def assert_json_identical(actual: Any, expected: Any, *, what: str = "value") -> None:
    """Byte-identical JSON (``1`` is not ``true`` is not ``1.0``)."""
    assert canonical(actual) == canonical(expected), (
        f"{what}: {canonical(actual)} != {canonical(expected)}"
    )


def assert_revision(
    rev: Revision,
    *,
    op: str = _UNSET,
    key: EntityKey | None = None,
    before: Any = _UNSET,
    after: Any = _UNSET,
    before_version: int | None = _UNSET,
    after_version: int | None = _UNSET,
) -> None:
    """Assert the fields given (``None`` means "must be null"); others are not checked."""
    if op is not _UNSET:
        assert rev.op == op, f"{rev}: op {rev.op!r} != {op!r}"
    if key is not None:
        assert EntityKey(rev.namespace, rev.kind, rev.slug) == key
    for name, expected in (("before", before), ("after", after)):
        if expected is _UNSET:
            continue
        actual = getattr(rev, name)
        if expected is None:
            assert actual is None, f"{rev}: {name} should be null, is {actual!r}"
        else:
            assert_json_identical(actual, expected, what=f"{rev}: {name}")
    if before_version is not _UNSET:
        assert rev.before_version == before_version, (
            f"{rev}: before_version {rev.before_version} != {before_version}"
        )
    if after_version is not _UNSET:
        assert rev.after_version == after_version, (
            f"{rev}: after_version {rev.after_version} != {after_version}"
        )


def only_revision(changeset: Changeset) -> Revision:
    """The changeset's single revision (fails unless there is exactly one)."""
    revisions = list(changeset.revisions.all())
    assert len(revisions) == 1, f"{changeset} has {len(revisions)} revisions, expected 1"
    return revisions[0]


def revisions_by_key(changeset: Changeset) -> dict[EntityKey, Revision]:
    return {EntityKey(r.namespace, r.kind, r.slug): r for r in changeset.revisions.all()}


def head_seq() -> int:
    """The log head's seq (0 when its row is absent, e.g. after a test flush)."""
    head = LogHead.objects.filter(id=1).first()
    return head.seq if head else 0


def entity_table(namespaces: Iterable[str] | None = None) -> dict[EntityKey, tuple[str, int]]:
    """The live entity table as ``{key: (canonical content, version)}``."""
    rows = Entity.objects.all()
    if namespaces is not None:
        rows = rows.filter(namespace_id__in=list(namespaces))
    return {
        EntityKey(e.namespace_id, e.kind, e.slug): (canonical(e.content), e.version) for e in rows
    }


def replayed_table(*, branch: str = "") -> dict[EntityKey, tuple[str, int]]:
    """The entity table rebuilt from revisions alone: per key, the newest ``after``.

    Also checks that each key's history is an unbroken chain (every revision's
    ``before`` is the previous one's ``after``), which is what invariant 1 buys.
    """
    last: dict[EntityKey, Revision] = {}
    for rev in Revision.objects.filter(branch=branch).order_by("seq", "id"):
        k = EntityKey(rev.namespace, rev.kind, rev.slug)
        prev = last.get(k)
        prev_after = prev.after if prev else None
        prev_version = prev.after_version if prev else None
        assert canonical(rev.before) == canonical(prev_after), (
            f"{rev}: before does not continue the previous revision's after"
        )
        assert rev.before_version == prev_version, (
            f"{rev}: before_version {rev.before_version} != previous after_version {prev_version}"
        )
        if prev is not None:
            assert rev.seq > prev.seq, f"{rev}: two revisions of one key in seq {rev.seq}"
        last[k] = rev
    return {
        k: (canonical(rev.after), rev.after_version)
        for k, rev in last.items()
        if rev.after is not None
    }


@dataclass(frozen=True)
class LogSnapshot:
    """Everything a write may touch, for "nothing happened" assertions."""

    changesets: int
    revisions: int
    journal: int
    head_seq: int
    entities: dict[EntityKey, tuple[str, int]]


def log_snapshot() -> LogSnapshot:
    return LogSnapshot(
        changesets=Changeset.objects.count(),
        revisions=Revision.objects.count(),
        journal=JournalEntry.objects.count(),
        head_seq=head_seq(),
        entities=entity_table(),
    )


def assert_nothing_written(before: LogSnapshot) -> None:
    """No changeset, revision, journal entry, seq or entity change since ``before``."""
    after = log_snapshot()
    assert after.changesets == before.changesets, "a changeset was left behind"
    assert after.revisions == before.revisions, "a revision was left behind"
    assert after.journal == before.journal, "a journal entry was left behind"
    assert after.head_seq == before.head_seq, "the log head moved"
    assert after.entities == before.entities, "entity rows changed"
