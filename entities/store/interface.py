"""The entity store's interface: keys, rows, what a store returns to the write
service, and the protocols a store implements (baseline here, branch overlays in
``branches.store``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from uuid import UUID

from entities.models import Namespace

if TYPE_CHECKING:
    from entities.access import WriteGuard


@dataclass(frozen=True, order=True)
class EntityKey:
    namespace: str
    kind: str
    slug: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.slug}"


@dataclass(frozen=True)
class StoredEntity:
    key: EntityKey
    content: dict[str, Any]
    version: int
    created_at: datetime
    updated_at: datetime
    changeset_id: UUID | None  # None only in a dry run's preview


@dataclass(frozen=True)
class EntityWrite:
    key: EntityKey
    content: dict[str, Any]
    version: int
    # ``content`` as JSON text when the writer has it already (the write service
    # serializes each image once); stores pass it to PostgreSQL as ``::jsonb``.
    text: str | None = None


class KeyRaced(Exception):
    """A key this transaction meant to create was created concurrently; retry."""


class Locked(NamedTuple):
    """What :meth:`EntityStore.lock` returns.

    ``rows``: the locked existing rows by key. ``namespaces``: the keys'
    namespaces that exist, name → ``protected`` (the write service's
    existence and role checks; a missing name does not exist).
    """

    rows: dict[EntityKey, StoredEntity]
    namespaces: dict[str, bool]


class WriteSql(NamedTuple):
    """A store's writes for one changeset, as SQL (:meth:`EntityStore.write_sql`).

    ``ctes``: data-modifying CTEs, comma-separated, to follow ``WITH`` (empty
    when the store has nothing to add to the log statement);
    ``params``: their named parameters (prefixed ``e``, clear of the log's);
    ``created``: an expression counting the rows the creates inserted, and
    ``creates``: the count it reaches when no create lost a race;
    ``written``: one counting every row written. A statement that must run
    after the writes (taking the log head's lock) reads ``written``: a CTE's
    rows are complete only once it has been read to the end.
    """

    ctes: str
    params: dict[str, Any]
    created: str
    written: str
    creates: int


# What a store that writes no rows of its own returns (the tests' stand-in stores).
NO_WRITES = WriteSql("", {}, "0", "0", 0)


def namespaces_of(names: Iterable[str]) -> dict[str, bool]:
    """The existing namespaces among ``names``: name → ``protected`` (one statement)."""
    rows = Namespace.objects.filter(name__in=sorted(set(names))).values_list("name", "protected")
    return dict(rows)


def guard_allows(guard: WriteGuard | None, namespaces: dict[str, bool]) -> bool:
    """True when ``guard`` lets its user write every one of ``namespaces``."""
    return guard is None or all(guard.allows(n, p) for n, p in namespaces.items())


class EntityStore(Protocol):
    branch: str

    def get(self, key: EntityKey) -> StoredEntity | None: ...

    def list(
        self,
        *,
        namespaces: Sequence[str] | None,
        namespace: str | None = None,
        kind: str | None = None,
        slug_prefix: str | None = None,
        after: EntityKey | None = None,
        limit: int = 50,
    ) -> list[StoredEntity]: ...

    def lock(self, keys: Iterable[EntityKey], *, guard: WriteGuard | None = None) -> Locked: ...

    def write_sql(
        self,
        *,
        changeset_id: UUID,
        now: datetime,
        creates: Sequence[EntityWrite],
        updates: Sequence[EntityWrite],
        deletes: Sequence[EntityKey],
    ) -> WriteSql:
        """The store's writes for one changeset (keys disjoint across the three lists).

        The write service runs the returned CTEs in the statement that draws
        seq and writes the log, so every store's rows cost no round trip of
        their own. A store may first run statements of its own for
        bookkeeping that does not belong in that statement (a merge closing
        its branch); only the write service calls it, after :meth:`lock` in
        the same transaction.
        """
        ...


class OptimisticStore(EntityStore, Protocol):
    """A store whose rows the write service may read unlocked and write back
    compare-and-set (``optimistic`` true: ``BaselineStore``)."""

    optimistic: bool

    def lock(
        self,
        keys: Iterable[EntityKey],
        *,
        guard: WriteGuard | None = None,
        for_update: bool = True,
    ) -> Locked: ...

    def write_sql(
        self,
        *,
        changeset_id: UUID,
        now: datetime,
        creates: Sequence[EntityWrite],
        updates: Sequence[EntityWrite],
        deletes: Sequence[EntityKey],
        expect: Mapping[EntityKey, int] | None = None,
    ) -> WriteSql: ...
