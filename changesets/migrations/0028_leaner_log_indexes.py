"""Fewer index bytes per write (issue 16, "half the bytes"): two indexes go, one narrows.

1. ``revision_seq_entity``, unique ``(seq, namespace, kind, slug)``, takes the
   place of both ``revision_one_per_entity_changeset`` (unique ``(changeset_id,
   namespace, kind, slug, seq)``) and ``revision_seq`` (``(seq)``): a changeset
   has exactly one seq, so it holds invariant 4 as the old constraint did, and
   led by seq it serves what ``revision_seq`` served. Every read of a
   changeset's revisions names its seq as well as its id.
2. ``changeset_branch_seq`` becomes partial, ``WHERE branch <> ''``: baseline
   writes (almost all of them) no longer insert into it; a baseline filter reads
   the seq index backwards instead.

Built so that readers are not held up (the migration is one transaction, so
nothing here can be ``CONCURRENTLY``): first every build, each under a SHARE
lock (writers wait, readers do not): each partition's unique index, and the
new changeset index under another name. Then the catalog work, under ACCESS
EXCLUSIVE locks held to COMMIT but each taken for a moment: each partition's
index becomes its constraint, the parent's constraint adopts them (nothing
left to build), the old indexes go and the new one takes its name.
docs/retention.md ("Migration 0028: the log's indexes") has the times, and how
to build the indexes beforehand CONCURRENTLY on a log too big to wait for.
"""

from django.db import migrations, models
from django.db.models import Q

NAME = "revision_seq_entity"
COLUMNS = "seq, namespace, kind, slug"


def _parts(schema_editor):
    from changesets import partitions

    with schema_editor.connection.cursor() as cursor:
        return partitions.PARENT, partitions.partitions(cursor)


def _part_index(part) -> str:
    # The name PostgreSQL gives the index it makes on a partition attached later.
    return f"{part.name}_seq_namespace_kind_slug_key"


def build_partition_indexes(apps, schema_editor):
    # IF NOT EXISTS: an operator may have built them beforehand CONCURRENTLY
    # (docs/retention.md), leaving the migration the catalog work only.
    _, parts = _parts(schema_editor)
    for part in parts:
        schema_editor.execute(
            f"CREATE UNIQUE INDEX IF NOT EXISTS {_part_index(part)} ON {part.name} ({COLUMNS})"
        )


def _has_constraint(schema_editor, table, name):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass(%s) AND conname = %s",
            [table, name],
        )
        return cursor.fetchone() is not None


def make_constraint(apps, schema_editor):
    parent, parts = _parts(schema_editor)
    for part in parts:
        if _has_constraint(schema_editor, part.name, _part_index(part)):
            continue
        schema_editor.execute(
            f"ALTER TABLE {part.name} ADD CONSTRAINT {_part_index(part)}"
            f" UNIQUE USING INDEX {_part_index(part)}"
        )
    # Adopts each partition's constraint on the same columns: catalog work only. (A
    # table that is not partitioned builds its index here.)
    schema_editor.execute(f"ALTER TABLE {parent} ADD CONSTRAINT {NAME} UNIQUE ({COLUMNS})")


def drop_constraint(apps, schema_editor):
    parent, _ = _parts(schema_editor)
    # The partitions' constraints and indexes go with it.
    schema_editor.execute(f"ALTER TABLE {parent} DROP CONSTRAINT {NAME}")


class Migration(migrations.Migration):
    dependencies = [("changesets", "0027_hashes_bytea")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddConstraint(
                    model_name="revision",
                    constraint=models.UniqueConstraint(
                        fields=("seq", "namespace", "kind", "slug"), name=NAME
                    ),
                ),
                migrations.RemoveConstraint(
                    model_name="revision", name="revision_one_per_entity_changeset"
                ),
                migrations.RemoveIndex(model_name="revision", name="revision_seq"),
                migrations.RemoveIndex(model_name="changeset", name="changeset_branch_seq"),
                migrations.AddIndex(
                    model_name="changeset",
                    index=models.Index(
                        condition=~Q(branch=""),
                        fields=["branch", "seq"],
                        name="changeset_branch_seq",
                    ),
                ),
            ],
            database_operations=[
                # The builds (SHARE locks).
                migrations.RunPython(build_partition_indexes, migrations.RunPython.noop),
                migrations.RunSQL(
                    "CREATE INDEX IF NOT EXISTS changeset_branch_seq_new"
                    " ON changesets_changeset (branch, seq) WHERE branch <> ''",
                    "DROP INDEX changeset_branch_seq_new",
                ),
                # The catalog (ACCESS EXCLUSIVE, a moment each).
                migrations.RunPython(make_constraint, drop_constraint),
                migrations.RunSQL(
                    "DROP INDEX changeset_branch_seq;"
                    " ALTER INDEX changeset_branch_seq_new RENAME TO changeset_branch_seq",
                    "ALTER INDEX changeset_branch_seq RENAME TO changeset_branch_seq_new;"
                    " CREATE INDEX changeset_branch_seq ON changesets_changeset (branch, seq)",
                ),
                migrations.RunSQL(
                    "ALTER TABLE changesets_revision"
                    " DROP CONSTRAINT revision_one_per_entity_changeset;"
                    " DROP INDEX revision_seq",
                    "CREATE INDEX revision_seq ON changesets_revision (seq);"
                    " ALTER TABLE changesets_revision ADD CONSTRAINT"
                    " revision_one_per_entity_changeset"
                    " UNIQUE (changeset_id, namespace, kind, slug, seq)",
                ),
            ],
        ),
    ]
