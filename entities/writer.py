"""The database's half of invariant 1: only the write service's statement writes entity rows.

Once Atlas runs inside another project, that project's code can reach
``Entity`` (or the table) directly: ``Entity.objects.bulk_update(...)``, a
queryset ``update()``/``delete()``, raw SQL. Such a write would move an entity
with no revision and no changeset, and every history, as-of read and revert
after it would be wrong. So PostgreSQL refuses it: a ``BEFORE`` row trigger on
``entities_entity`` (migration ``entities`` 0004) and on the branch overlay
(``branches`` 0005) lets a row change only while the transaction-local setting
``atlas.writer`` holds this statement's marker.

How the write service holds the marker, at no round trip of its own:

1. The store's CTEs in the log statement start with :data:`MARK_CTE`, which
   sets ``atlas.writer`` to ``cs:<changeset id>`` (transaction-local).
2. Every entity-writing CTE joins it, so PostgreSQL has evaluated it before
   the first row reaches the table: a row exists only once the join emitted it.
   The trigger accepts an inserted or updated row only when its
   ``changeset_id`` is the marker's, so a marker cannot write rows under any
   other changeset.
3. The statement's count of written rows goes through :func:`done_sql`
   (``atlas_writer_done(n)``), which clears the marker and returns ``n``. Its
   argument reads every entity CTE to the end, so it runs after the last row
   (and its trigger); the log head's update reads that count, so the marker
   is gone before the statement draws ``seq``. Nothing later in the same
   transaction can ride it. A statement that fails aborts the transaction (or
   its savepoint), which restores the setting too.

Other sanctioned writers set a marker of their own the same way: closing a
branch drops its overlay under ``close:<branch id>`` (``branches.store.close_branch``).
Seeding and repair scripts run by the table's owner may ``ALTER TABLE ...
DISABLE TRIGGER`` inside their transaction, as the log's append-only guard
allows (docs/architecture.md).
"""

from __future__ import annotations

from uuid import UUID

SETTING = "atlas.writer"

# The named parameter holding the changeset id is the store's (``e_cs``).
MARK_CTE = "em AS MATERIALIZED (SELECT set_config('atlas.writer', 'cs:' || %(e_cs)s::text, true))"
# What an entity-writing CTE puts in its FROM/USING list to depend on MARK_CTE.
MARK_JOIN = "em"


def changeset_marker(changeset_id: UUID | str) -> str:
    """The marker the write service holds while it writes ``changeset_id``'s rows."""
    return f"cs:{changeset_id}"


def done_sql(written: str) -> str:
    """``written`` (an expression counting the rows written), clearing the marker once
    it is known: see the module docstring, step 3."""
    return f"atlas_writer_done({written})"
