"""The entity store interface and its baseline implementation.

The write service (``changesets.services.apply``) takes a store, so the same code
writes baseline and branch overlays, and ``changesets`` never imports
``branches``. Every method here is set-based: one statement for any number of
keys, so a 1,000-op batch costs a handful of round trips.

Only the write service may call the mutating methods (DESIGN invariant 1).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from uuid import UUID

from django.db import connection

from atlas.db import prepared_cursor
from entities import access, writer
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


def json_array(texts: Iterable[str | None]) -> str:
    """One JSON array of JSON texts (``None`` → ``null``), for a ``%s::jsonb`` parameter.

    Many JSON values go to PostgreSQL as one array document, unpacked with
    ``jsonb_array_elements`` (zipped with the key arrays by ``ROWS FROM``),
    not as a ``text[]``: psycopg quotes every array element in Python, with a
    regular expression per quote character, and JSON is full of them (it was
    most of a 1,000-row write's client time). One string is quoted in C.
    """
    return "[" + ",".join("null" if t is None else t for t in texts) + "]"


def counted(rows: str, count: int) -> str:
    """``rows`` (a ``FROM`` item with its alias and column names) as a subquery that
    tells the planner how many rows it holds.

    PostgreSQL estimates every ``jsonb_array_elements`` at 100 rows, so a
    one-key write joined against the entity table was planned as a hash join
    over a sequential scan of the whole table once it held a few thousand
    rows (about 1 ms at 4,500, against 0.05 ms by index), and a write cost
    more the more entities there were. ``LIMIT`` with the exact count is the
    estimate (and never cuts a row off): the join becomes an index probe per
    key, and a big batch still gets the hash join it should. The count is
    written into the text, so each batch size is its own prepared statement
    (psycopg keeps the most recent 100 per connection).
    """
    return f"(SELECT * FROM {rows} LIMIT {int(count)})"


def contents_json(writes: Sequence[EntityWrite]) -> str:
    """The writes' contents as one JSON array (see :func:`json_array`)."""
    return json_array(w.text if w.text is not None else json.dumps(w.content) for w in writes)


def _keys_json(writes: Sequence[EntityWrite], expect: Mapping[EntityKey, int] | None = None) -> str:
    """``[[namespace, kind, slug, version(, expected version)], …]`` of ``writes``, as
    one JSON text (the expected version, the one read, only with ``expect``)."""
    return json.dumps(
        [
            [w.key.namespace, w.key.kind, w.key.slug, w.version, *_expected(expect, w.key)]
            for w in writes
        ]
    )


def _row_of(item: str, version_at: int | None) -> str:
    """The condition matching ``e`` to the JSON key ``item`` (``[namespace, kind, slug,
    …]``); with ``version_at``, only at the version in that element (compare-and-set)."""
    match = f"e.namespace_id = {item}->>0 AND e.kind = {item}->>1 AND e.slug = {item}->>2"
    return match if version_at is None else f"{match} AND e.version = ({item}->>{version_at})::int"


def _expected(expect: Mapping[EntityKey, int] | None, key: EntityKey) -> list[int]:
    """``[the version key was read at]`` with ``expect``, else nothing."""
    return [] if expect is None else [expect[key]]


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


def entity_filters(
    ns_col: str,
    kind_col: str,
    slug_col: str,
    *,
    namespaces: Sequence[str] | None,
    namespace: str | None,
    kind: str | None,
    slug_prefix: str | None,
    after: EntityKey | None,
) -> tuple[str, list[Any]]:
    """SQL conditions shared by live, overlay and as-of listings.

    With a namespace the caller may read, that namespace is the whole
    visibility test (and with one she may not, nothing is): with ``= ANY`` of
    her namespaces as well, the planner took the as-of listing's index range
    for both conditions, could not read it in key order, and sorted the
    namespace's every key before the page (issue 18: a scoped ``as_of_time``
    page, 3,985 keys sorted for 83 at ten million changesets).
    """
    clauses: list[str] = ["TRUE"]
    params: list[Any] = []
    if namespaces is not None and namespace is not None:
        if namespace not in namespaces:
            clauses.append("FALSE")
    elif namespaces is not None:
        clauses.append(f"{ns_col} = ANY(%s::text[])")
        params.append(list(namespaces))
    if namespace is not None:
        clauses.append(f"{ns_col} = %s")
        params.append(namespace)
    if kind is not None:
        clauses.append(f"{kind_col} = %s")
        params.append(kind)
    if slug_prefix:
        clauses.append(f"{slug_col} LIKE %s")
        params.append(like_prefix(slug_prefix))
    if after is not None:
        clauses.append(f"({ns_col}, {kind_col}, {slug_col}) > (%s, %s, %s)")
        params.extend([after.namespace, after.kind, after.slug])
    return " AND ".join(clauses), params


_SELECT = (
    "SELECT e.namespace_id, e.kind, e.slug, e.content, e.version, e.created_at,"
    " e.updated_at, e.changeset_id FROM entities_entity e"
)


def load_json(value: Any) -> Any:
    """Django has psycopg hand jsonb over as text (JSONField decodes it); raw SQL must too."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def row_to_entity(row: Sequence[Any]) -> StoredEntity:
    """A row of (namespace, kind, slug, content, version, created_at, updated_at,
    changeset_id) as a :class:`StoredEntity` (the column order every store selects)."""
    return StoredEntity(
        key=EntityKey(row[0], row[1], row[2]),
        content=load_json(row[3]),
        version=row[4],
        created_at=row[5],
        updated_at=row[6],
        changeset_id=row[7],
    )


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with ``prefix`` literally."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# The keys of a lock statement: one as three parameters, many as one JSON document
# whose count the text states (:func:`counted`). A generic plan takes a set-returning
# function for 100 rows, so a lock of a few keys was planned as a hash join over a scan
# of the entity table; as one row (or the count) it is a probe of the key's unique index
# per key (0.24 against 0.33 ms at the client for a single write's read).
_ONE_KEY = "SELECT %(ns)s::text AS ns, %(kind)s::text AS kind, %(slug)s::text AS slug"


def _keys_sql(count: int) -> str:
    if count == 1:
        return _ONE_KEY
    rows = counted("jsonb_array_elements(%(keys)s::jsonb) AS j(key)", count)
    return f"SELECT x.key->>0 AS ns, x.key->>1 AS kind, x.key->>2 AS slug FROM {rows} x"


@functools.lru_cache(maxsize=256)
def _lock_sql(for_update: bool = True, count: int = 1) -> str:
    """:meth:`BaselineStore.lock`'s statement for ``count`` keys; rows tagged ``n``
    (namespace), ``e`` (a locked entity row, or without ``for_update`` a read one) or
    ``r`` (one of a pending guard's role rows)."""
    lock = " FOR UPDATE OF e" if for_update else ""
    return (
        f"WITH k AS ({_keys_sql(count)}),"
        " n AS (SELECT name, protected FROM entities_namespace"
        "  WHERE name IN (SELECT ns FROM k)),"
        f" {access.guard_ctes()},"
        " e AS (SELECT e.namespace_id, e.kind, e.slug, e.content, e.version,"
        "  e.created_at, e.updated_at, e.changeset_id FROM entities_entity e"
        "  JOIN k ON e.namespace_id = k.ns AND e.kind = k.kind AND e.slug = k.slug"
        "  JOIN wa ON wa.name = e.namespace_id"
        f"  ORDER BY e.namespace_id, e.kind, e.slug{lock})"
        " SELECT name, NULL, NULL, NULL::jsonb, NULL::int, NULL::timestamptz,"
        "  NULL::timestamptz, NULL::uuid, protected, 'n' FROM n"
        " UNION ALL SELECT *, NULL, 'e' FROM e"
        " UNION ALL SELECT object_pk, codename, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 'r'"
        "  FROM ur"
    )


class BaselineStore:
    """The live entity table."""

    branch = ""

    def get(self, key: EntityKey) -> StoredEntity | None:
        # Raw SQL buys speed on every GET: measured ~0.25 ms here, ~1 ms through values_list().
        with connection.cursor() as cursor:
            cursor.execute(
                f"{_SELECT} WHERE e.namespace_id = %s AND e.kind = %s AND e.slug = %s",
                [key.namespace, key.kind, key.slug],
            )
            row = cursor.fetchone()
        return row_to_entity(row) if row else None

    def list(
        self,
        *,
        namespaces: Sequence[str] | None,
        namespace: str | None = None,
        kind: str | None = None,
        slug_prefix: str | None = None,
        after: EntityKey | None = None,
        limit: int = 50,
    ) -> list[StoredEntity]:
        """One keyset page in (namespace, kind, slug) order, off the unique index.

        ``namespaces`` is the caller's readable set (``None`` = all).
        """
        where, params = entity_filters(
            "e.namespace_id",
            "e.kind",
            "e.slug",
            namespaces=namespaces,
            namespace=namespace,
            kind=kind,
            slug_prefix=slug_prefix,
            after=after,
        )
        sql = f"{_SELECT} WHERE {where} ORDER BY e.namespace_id, e.kind, e.slug LIMIT %s"
        # Raw SQL buys the keyset's row-value comparison (entity_filters), which the ORM lacks.
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, limit])
            return [row_to_entity(row) for row in cursor.fetchall()]

    # The write service may read this store's rows unlocked and write them back
    # compare-and-set (``lock(for_update=False)``, ``write_sql(expect=...)``).
    optimistic = True

    def lock(
        self,
        keys: Iterable[EntityKey],
        *,
        guard: WriteGuard | None = None,
        for_update: bool = True,
    ) -> Locked:
        """Lock the existing rows among ``keys`` (FOR UPDATE) and return them, with
        the keys' namespaces (existence and ``protected``), in one statement.

        Rows are locked in key order, so two batches over overlapping keys
        queue behind each other instead of deadlocking. With a ``guard``, only
        rows in namespaces it allows are locked: a caller the service will
        refuse (after this statement, from ``namespaces``) never holds a lock.
        A pending guard's role rows are read by this statement too
        (``entities.access.guard_ctes``) and handed back to it.

        Without ``for_update`` the same statement only reads: the write service's
        unlocked single write, which then writes with ``write_sql(expect=...)``.
        """
        keys = sorted(set(keys))
        if not keys:
            return Locked({}, {})
        # Raw SQL buys one prepared round trip for the namespace check, the role check
        # and a guarded, key-ordered FOR UPDATE: the first of a single write's two statements.
        params = access.guard_params(guard)
        if len(keys) == 1:
            params.update(ns=keys[0].namespace, kind=keys[0].kind, slug=keys[0].slug)
        else:
            params["keys"] = json.dumps([[k.namespace, k.kind, k.slug] for k in keys])
        with prepared_cursor() as cursor:
            cursor.execute(_lock_sql(for_update, len(keys)), params)
            result = cursor.fetchall()
        rows: dict[EntityKey, StoredEntity] = {}
        namespaces: dict[str, bool] = {}
        grants: list[tuple[str | None, str | None]] = []
        for row in result:
            if row[9] == "e":
                rows[EntityKey(row[0], row[1], row[2])] = row_to_entity(row)
            elif row[9] == "n":
                namespaces[row[0]] = row[8]
            else:
                grants.append((row[0], row[1]))
        if guard is not None:
            guard.learn(grants)
        return Locked(rows, namespaces)

    def write_sql(
        self,
        *,
        changeset_id: UUID,
        now: datetime,
        creates: Sequence[EntityWrite],
        updates: Sequence[EntityWrite],
        deletes: Sequence[EntityKey],
        expect: Mapping[EntityKey, int] | None = None,
    ) -> WriteSql:
        """The live rows' writes as data-modifying CTEs (:meth:`EntityStore.write_sql`).

        Keys are disjoint across creates, updates and deletes (one net change
        each), so the three can run in one statement. A create that lost a race
        inserts nothing (``ON CONFLICT DO NOTHING``): ``created`` counts fewer rows.
        Each CTE joins the writer's marker and ``written`` clears it, which is
        what lets the table's guard trigger pass these rows (``entities.writer``).

        ``expect`` (the version each updated or deleted key was read at) makes the
        update and the delete compare-and-set: a row at another version is left
        alone, so ``written`` counts fewer rows than the write meant. The write
        service passes it when it read the rows without locking them.
        """
        # Raw SQL buys the round trip: these CTEs ride the log statement (one for a write).
        ctes: list[str] = []
        params: dict[str, Any] = {"e_now": now, "e_cs": changeset_id}
        counts: list[str] = []
        # Keys (and versions) go over as one JSON document per kind of change,
        # contents as another (json_array): psycopg adapts array parameters in Python.
        if deletes:
            ctes.append(
                f"ed AS (DELETE FROM entities_entity e USING {writer.MARK_JOIN}, "
                + counted("jsonb_array_elements(%(ed_keys)s::jsonb) AS d(k)", len(deletes))
                + f" d WHERE {_row_of('d.k', None if expect is None else 3)} RETURNING 1)"
            )
            params["ed_keys"] = json.dumps(
                [[k.namespace, k.kind, k.slug, *_expected(expect, k)] for k in deletes]
            )
            counts.append("(SELECT count(*) FROM ed)")
        if updates:
            ctes.append(
                "eu AS (UPDATE entities_entity e SET content = k.content,"
                " version = (k.key->>3)::int, updated_at = %(e_now)s::timestamptz,"
                " changeset_id = %(e_cs)s::uuid"
                f" FROM {writer.MARK_JOIN}, "
                + counted(
                    "ROWS FROM (jsonb_array_elements(%(eu_keys)s::jsonb),"
                    " jsonb_array_elements(%(eu_content)s::jsonb)) AS k(key, content)",
                    len(updates),
                )
                + f" k WHERE {_row_of('k.key', None if expect is None else 4)} RETURNING 1)"
            )
            params["eu_keys"] = _keys_json(updates, expect)
            params["eu_content"] = contents_json(updates)
            counts.append("(SELECT count(*) FROM eu)")
        created = "0"
        if creates:
            ctes.append(
                "ec AS (INSERT INTO entities_entity"
                " (namespace_id, kind, slug, content, version, created_at, updated_at,"
                " changeset_id)"
                " SELECT k.key->>0, k.key->>1, k.key->>2, k.content, (k.key->>3)::int,"
                " %(e_now)s::timestamptz, %(e_now)s::timestamptz, %(e_cs)s::uuid"
                f" FROM {writer.MARK_JOIN}, ROWS FROM (jsonb_array_elements(%(ec_keys)s::jsonb),"
                " jsonb_array_elements(%(ec_content)s::jsonb)) AS k(key, content)"
                " ON CONFLICT (namespace_id, kind, slug) DO NOTHING RETURNING 1)"
            )
            params["ec_keys"] = _keys_json(creates)
            params["ec_content"] = contents_json(creates)
            created = "(SELECT count(*) FROM ec)"
        counts.append(created)
        # The marker first, so that every CTE after it may join it (entities.writer).
        ctes.insert(0, writer.MARK_CTE)
        written = writer.done_sql(" + ".join(counts))
        return WriteSql(", ".join(ctes), params, created, written, len(creates))


baseline = BaselineStore()
