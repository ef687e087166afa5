"""A revision stores its before image as what differs from its after image (issue 16, item 6).

Each revision held two whole images; an update's ``before`` repeated every
member the update did not touch. Now (``changesets.undo``) the row keeps
``after`` whole and, in ``undo`` (the old ``before`` column, renamed) and
``undo_gone`` (new), only what turns it back into ``before``: nothing for a
create, the whole image for a delete, for an update the members it changed
or removed and the names of the members it added. Still true on its own: no
other row is read to rebuild it.

1. SQL functions, each the one definition of its rule: ``atlas_undo`` (what
   a row stores, both columns, from the two images: the log statement,
   erasure and this migration call it), ``atlas_before_image``
   (the rebuild, ``(after - undo_gone) || undo``, for raw SQL readers and
   the guard). Members are compared by their ``jsonb`` text, not by jsonb
   ``=``, which calls ``1`` and ``1.0`` equal: a member is left to ``after``
   only when it prints byte for byte as ``before``'s did.
2. The check ``revision_images_match_op`` in the new shape.
3. Existing rows converted, one partition at a time: the partition's rows
   are copied, converted on the way (``INSERT … SELECT`` in seq ranges, never
   through Python: bounded memory, a progress bar on stderr) into a new table
   made ``LIKE`` the parent, which then replaces the partition under the same
   name and bounds (its indexes are built after the rows are in, and the old
   versions do not stay behind as dead rows: the space is returned at once).
   Partitions without a row to convert are left as they are.
4. The revision guard (migration 0017) admits an erasure's UPDATE in the new
   shape: both rebuilt images may change only by values turning into
   ``"[erased]"``, and ``undo_gone`` not at all (an erasure never adds or
   removes a member).

Reversible: the reverse stores whole before images again (``undo`` ←
``atlas_before_image(…)``), renames the column back and drops the rest.
A partition left half detached by a stopped archive cut must be finished
first (``manage.py archive_log``); the migration says so and stops.
"""

from __future__ import annotations

import re
import sys

from django.contrib.postgres.fields import ArrayField
from django.db import migrations, models
from tqdm import tqdm

PARENT = "changesets_revision"
# Seqs per INSERT … SELECT (one progress step).
CHUNK_SEQS = 20_000
_BOUND = re.compile(r"FROM \('?(-?\d+)'?\) TO \('?(-?\d+)'?\)")

# What a row stores, from the two images: both columns from one call. Set-returning
# (one row) so that PostgreSQL inlines it into the caller's plan when it is called in
# FROM (``CROSS JOIN LATERAL atlas_undo(before, after) u``): a scalar function with
# subqueries is never inlined, and its call cost more than its work for a small
# document.
UNDO = r"""
CREATE OR REPLACE FUNCTION atlas_undo(before jsonb, after jsonb)
RETURNS TABLE (undo jsonb, undo_gone text[])
LANGUAGE sql IMMUTABLE PARALLEL SAFE ROWS 1 AS $$
    SELECT
        CASE WHEN before IS NULL OR after IS NULL THEN before
            ELSE (SELECT jsonb_object_agg(m.key, m.value) FROM jsonb_each(before) AS m
                  WHERE (after -> m.key)::text IS DISTINCT FROM m.value::text)
        END,
        CASE WHEN before IS NULL OR after IS NULL THEN NULL
            ELSE (SELECT array_agg(k.name ORDER BY k.n)
                  FROM jsonb_object_keys(after) WITH ORDINALITY AS k(name, n)
                  WHERE NOT before ? k.name)
        END
$$;
"""
# Inlined into the statements that call it (a plain expression over the row).
BEFORE_IMAGE = r"""
CREATE OR REPLACE FUNCTION atlas_before_image(op text, after jsonb, undo jsonb, undo_gone text[])
RETURNS jsonb LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN op = 'update'
        THEN (after - COALESCE(undo_gone, '{}'::text[])) || COALESCE(undo, '{}'::jsonb)
        ELSE undo
    END
$$;
"""
DROP_FUNCTIONS = [
    "DROP FUNCTION IF EXISTS atlas_before_image(text, jsonb, jsonb, text[])",
    "DROP FUNCTION IF EXISTS atlas_undo(jsonb, jsonb)",
]

_GUARD_HEAD = r"""
CREATE OR REPLACE FUNCTION atlas_revision_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND current_setting('atlas.erasing', true) = 'on'
       AND NEW.salt IS NULL AND NEW.sealed IS NOT NULL
"""
_GUARD_TAIL = r"""
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the changeset log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""
REVISION_GUARD = (
    _GUARD_HEAD
    + r"""       AND (NEW.id, NEW.changeset_id, NEW.seq, NEW.branch, NEW.at, NEW.namespace, NEW.kind,
            NEW.slug, NEW.op, NEW.before_version, NEW.after_version, NEW.changed, NEW.undo_gone)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.changeset_id, OLD.seq, OLD.branch, OLD.at, OLD.namespace, OLD.kind,
            OLD.slug, OLD.op, OLD.before_version, OLD.after_version, OLD.changed, OLD.undo_gone)
       AND atlas_only_erased(atlas_before_image(OLD.op, OLD.after, OLD.undo, OLD.undo_gone),
                             atlas_before_image(NEW.op, NEW.after, NEW.undo, NEW.undo_gone))
       AND atlas_only_erased(OLD.after, NEW.after) THEN"""
    + _GUARD_TAIL
)
# Migration 0017's, for the reverse.
REVISION_GUARD_0017 = (
    _GUARD_HEAD
    + r"""       AND (NEW.id, NEW.changeset_id, NEW.seq, NEW.branch, NEW.at, NEW.namespace, NEW.kind,
            NEW.slug, NEW.op, NEW.before_version, NEW.after_version, NEW.changed)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.changeset_id, OLD.seq, OLD.branch, OLD.at, OLD.namespace, OLD.kind,
            OLD.slug, OLD.op, OLD.before_version, OLD.after_version, OLD.changed)
       AND atlas_only_erased(OLD.before, NEW.before)
       AND atlas_only_erased(OLD.after, NEW.after) THEN"""
    + _GUARD_TAIL
)

# A conversion: what the copy reads beside a row ``r`` of the partition, and what each
# converted column is made from (the others are copied). Forward, ``undo`` still holds
# the whole before image (the renamed column).
TO_DELTA = (
    "CROSS JOIN LATERAL atlas_undo(r.undo, r.after) AS u",
    {"undo": "u.undo", "undo_gone": "u.undo_gone"},
)
TO_WHOLE = (
    "",
    {"undo": "atlas_before_image(r.op, r.after, r.undo, r.undo_gone)", "undo_gone": "NULL"},
)
# Only updates are stored differently: a partition without one is left as it is.
NEEDS_REWRITE = "op = 'update'"


def _partitions(cursor) -> list[tuple[str, int, int, bool]]:
    """(name, lower, upper, detach pending) of every partition, from the catalog."""
    cursor.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), i.inhdetachpending"
        " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = to_regclass(%s)",
        [PARENT],
    )
    found = []
    for name, bound, pending in cursor.fetchall():
        match = _BOUND.search(bound or "")
        if match is None:  # (a DEFAULT partition: Atlas never makes one)
            raise RuntimeError(f"{name} has no seq range ({bound}): not converted")
        found.append((name, int(match.group(1)), int(match.group(2)), pending))
    return sorted(found, key=lambda p: p[1])


def _columns(cursor) -> list[str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        [PARENT],
    )
    return [row[0] for row in cursor.fetchall()]


def _rewrite(cursor, part: tuple[str, int, int, bool], conversion, bar) -> None:
    """One partition's rows copied, converted, into a table that then takes its place."""
    name, lower, upper, _ = part
    beside, made = conversion
    new = f"{PARENT}_n{lower:012d}"  # not the archive's _p/_x names
    columns = _columns(cursor)
    targets = ", ".join(f'"{c}"' for c in columns)
    sources = ", ".join(made.get(c, f'r."{c}"') for c in columns)
    cursor.execute(
        f"CREATE TABLE {new} (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS"
        " INCLUDING STORAGE INCLUDING COMPRESSION)"
    )
    cursor.execute(f"SELECT min(seq), max(seq) FROM {name}")
    low, high = cursor.fetchone()
    for start in range(int(low), int(high) + 1, CHUNK_SEQS):
        cursor.execute(
            f"INSERT INTO {new} ({targets}) SELECT {sources} FROM {name} AS r {beside}"
            " WHERE r.seq >= %s AND r.seq < %s",
            [start, start + CHUNK_SEQS],
        )
        bar.update(cursor.rowcount)
    # The bound as a constraint, so the attach has nothing to scan (as partitions._attach).
    cursor.execute(
        f"ALTER TABLE {new} ADD CONSTRAINT {new}_range CHECK (seq >= {lower} AND seq < {upper})"
    )
    cursor.execute(f"ALTER TABLE {PARENT} DETACH PARTITION {name}")
    cursor.execute(f"DROP TABLE {name}")
    cursor.execute(f"ALTER TABLE {new} RENAME TO {name}")
    # Attaching builds the partition's indexes and clones the triggers and foreign key.
    cursor.execute(
        f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({upper})"
    )
    cursor.execute(f"ALTER TABLE {name} DROP CONSTRAINT {new}_range")


def _convert(schema_editor, conversion, what: str) -> None:
    with schema_editor.connection.cursor() as cursor:
        parts = _partitions(cursor)
        if not parts:
            raise RuntimeError(f"{PARENT} is not partitioned: migration 0025 comes first")
        pending = [p[0] for p in parts if p[3]]
        if pending:
            raise RuntimeError(
                f"partition(s) {', '.join(pending)} are half detached by a stopped archive"
                " cut: run manage.py archive_log to finish it, then migrate again"
            )
        # DDL on the table refuses to run over foreign-key checks still queued.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        todo = []
        for part in parts:
            cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {part[0]} WHERE {NEEDS_REWRITE})")
            if cursor.fetchone()[0]:
                cursor.execute(f"SELECT count(*) FROM {part[0]}")
                todo.append((part, cursor.fetchone()[0]))
        if not todo:
            return
        total = sum(n for _, n in todo)
        progress = sys.stderr.isatty()
        with tqdm(total=total, unit="revision", desc=what, disable=not progress) as bar:
            for part, _ in todo:
                _rewrite(cursor, part, conversion, bar)
        cursor.execute(f"ANALYZE {PARENT}")
    sys.stderr.write(f"\n  {what}: {total} revision(s) in {len(todo)} partition(s)\n")


def forward(apps, schema_editor):
    _convert(schema_editor, TO_DELTA, "revisions: before as undo")


def backward(apps, schema_editor):
    _convert(schema_editor, TO_WHOLE, "revisions: undo back to before")


class Migration(migrations.Migration):
    dependencies = [("changesets", "0028_leaner_log_indexes")]

    operations = [
        migrations.RunSQL([UNDO, BEFORE_IMAGE], DROP_FUNCTIONS),
        migrations.RemoveConstraint(model_name="revision", name="revision_images_match_op"),
        migrations.RenameField(model_name="revision", old_name="before", new_name="undo"),
        migrations.AddField(
            model_name="revision",
            name="undo_gone",
            field=ArrayField(base_field=models.TextField(), null=True, size=None),
        ),
        migrations.RunPython(forward, backward),
        migrations.AddConstraint(
            model_name="revision",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("after__isnull", False),
                        ("op", "create"),
                        ("undo__isnull", True),
                        ("undo_gone__isnull", True),
                    ),
                    models.Q(("after__isnull", False), ("op", "update")),
                    models.Q(
                        ("after__isnull", True),
                        ("op", "delete"),
                        ("undo__isnull", False),
                        ("undo_gone__isnull", True),
                    ),
                    _connector="OR",
                ),
                name="revision_images_match_op",
            ),
        ),
        migrations.RunSQL(REVISION_GUARD, REVISION_GUARD_0017),
    ]
