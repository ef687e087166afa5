"""SQL pieces every store builds its statements from: many values as one JSON
parameter, row counts the planner can trust, the listing filters, and rows
read back as :class:`~entities.store.interface.StoredEntity`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from entities.store.interface import EntityKey, EntityWrite, StoredEntity


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
