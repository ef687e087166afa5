"""``revision_asof``: the as-of seek on a compact key.

An as-of page seeks, per key, the newest baseline revision at or before X.
On ``revision_history`` (branch, namespace, kind, slug, seq) a B-tree leaf
read checks every entry of the key's run after the start position against
all five columns, so a seek near the head of a long history (X recent, every
older revision still on the page) cost about four times one deep in the past.
On a 64-bit hash of the key plus ``seq`` those checks are two integer
comparisons: the 10-changesets-back page went from ~0.045 to ~0.015 ms per
key (docs/benchmarks.md). Hash collisions cost correctness nothing: the
query compares the real key and falls back to ``revision_history``.

Raw SQL because the query must spell the same expression for the planner to
match it, and Django's ``Concat`` compiles to ``CONCAT()``, which is not
immutable and cannot be indexed. Kept in step with ``changesets.asof.KEY_HASH``.
"""

from django.db import migrations

CREATE = (
    "CREATE INDEX IF NOT EXISTS revision_asof ON changesets_revision"
    " (hashtextextended(namespace || '/' || kind || '/' || slug, 0), seq DESC)"
    " WHERE branch = ''"
)


class Migration(migrations.Migration):
    dependencies = [("changesets", "0006_revision_at")]

    operations = [
        migrations.RunSQL(CREATE, "DROP INDEX IF EXISTS revision_asof"),
    ]
