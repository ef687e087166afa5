"""The log head's single row, and triggers that make the log append-only.

The triggers are the database half of invariant 7: no client, ORM or raw SQL,
can UPDATE or DELETE a changeset or revision row. TRUNCATE stays possible for
the table owner: it is an operator's act (and what Django's test flush uses),
not something application code or the admin can do row by row.
"""

from django.db import migrations

APPEND_ONLY_FUNCTION = """
CREATE OR REPLACE FUNCTION atlas_log_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the changeset log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

TRIGGERS = [
    ("changesets_changeset", "changeset"),
    ("changesets_revision", "revision"),
]


def forward_sql() -> list[str]:
    statements = [APPEND_ONLY_FUNCTION]
    for table, short in TRIGGERS:
        statements.append(
            f"CREATE TRIGGER {short}_append_only BEFORE UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION atlas_log_append_only();"
        )
    return statements


def reverse_sql() -> list[str]:
    statements = []
    for table, short in TRIGGERS:
        statements.append(f"DROP TRIGGER IF EXISTS {short}_append_only ON {table};")
    statements.append("DROP FUNCTION IF EXISTS atlas_log_append_only();")
    return statements


class Migration(migrations.Migration):
    dependencies = [("changesets", "0001_initial")]

    operations = [
        migrations.RunSQL(
            "INSERT INTO changesets_loghead (id, seq, at) VALUES (1, 0, NULL)"
            " ON CONFLICT (id) DO NOTHING;",
            reverse_sql="DELETE FROM changesets_loghead WHERE id = 1;",
        ),
        migrations.RunSQL(forward_sql(), reverse_sql=reverse_sql()),
    ]
