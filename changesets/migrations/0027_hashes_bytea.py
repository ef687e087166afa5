"""Chain hashes stored as their 32 bytes (``bytea``), not 64 characters of hex (issue 16, item 6).

``changesets_changeset.prev_hash``, ``.hash`` and ``.v1_hash`` and the log
head's ``hash`` and ``prev_hash`` hold the same values, in half the bytes
(33 B each on disk instead of 65). The chain does not change: what each hash
covers, its values, and every place that shows one (hex, as before:
``changesets.fields.ChainHashField``). An empty string ("no hash yet": the log
head before the first write) becomes NULL.

One ``ALTER TABLE`` per table, so the changeset table is rewritten once (with
its indexes), under an ACCESS EXCLUSIVE lock: nothing reads or writes the log
meanwhile. docs/deploy.md ("Upgrading") has the time it takes at scale. The
reverse turns the bytes back into hex text (NULL back into ``''``).
"""

from django.db import migrations

import changesets.fields

# (table, column, NOT NULL before this migration)
COLUMNS = {
    "changesets_changeset": (("prev_hash", True), ("hash", True), ("v1_hash", False)),
    "changesets_loghead": (("hash", True), ("prev_hash", True)),
}


def _to_bytea(table: str) -> str:
    parts = []
    for column, _ in COLUMNS[table]:
        parts.append(f"ALTER COLUMN {column} DROP NOT NULL")
        parts.append(
            f"ALTER COLUMN {column} TYPE bytea USING decode(NULLIF({column}, ''), 'hex')"
        )
    return f"ALTER TABLE {table} " + ", ".join(parts)


def _to_hex(table: str) -> str:
    parts = []
    for column, not_null in COLUMNS[table]:
        if not_null:
            parts.append(
                f"ALTER COLUMN {column} TYPE varchar(64)"
                f" USING COALESCE(encode({column}, 'hex'), '')"
            )
            parts.append(f"ALTER COLUMN {column} SET NOT NULL")
        else:
            parts.append(f"ALTER COLUMN {column} TYPE varchar(64) USING encode({column}, 'hex')")
    return f"ALTER TABLE {table} " + ", ".join(parts)


class Migration(migrations.Migration):
    dependencies = [("changesets", "0026_journal_published_gone")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(_to_bytea(table), reverse_sql=_to_hex(table))
                for table in COLUMNS
            ],
            state_operations=[
                migrations.AlterField(
                    model_name=model,
                    name=column,
                    field=changesets.fields.ChainHashField(null=True),
                )
                for model, table in (("changeset", "changesets_changeset"), ("loghead", "changesets_loghead"))
                for column, _ in COLUMNS[table]
            ],
        ),
    ]
