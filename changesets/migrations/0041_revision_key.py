"""``revision_key``: entity history and as-of on one hashed index.

Two indexes found one entity's revisions newest first: ``revision_history``
over ``(branch, namespace, kind, slug, seq)`` for history, blame and every
key seek of the write path, and ``revision_asof`` (migration 0007) over a
64-bit hash of the key and ``seq`` for as-of reads of the baseline. The text
index was the log's widest: 84 bytes a write at 64% leaf density
(``bench/log_layouts.py``), because each key's run grows in the middle of the
index and splits pages half full, and its entries repeat three text columns.

This index is both: a 64-bit hash of branch and key, then ``seq`` (34 bytes a
write at 84% on the same rows). Every seek of a key spells the same expression
(``changesets.keyhash``) and compares the real branch and key too, so a hash
collision costs a row fetched and dropped, never a wrong answer.

The hash is ``atlas_key_hash``, a PL/pgSQL function declared ``COST 1000`` (as
``atlas_key_terms`` is), not the bare expression. Its cost is what keeps a
page of history an ordered index scan. The planner's other choice, a bitmap
scan of all the key's revisions then a sort, recomputes the indexed expression
on every row it reads, and the declared cost charges it for that. As a bare
``hashtextextended(…)`` (cost 1), the two plans cost within 2% of each other
for a key the statistics do not know, and the bitmap won: 771 revisions read
and sorted for a page of 51, 7 ms where the index scan takes 0.3
(``docs/benchmarks.md``). The text index never had that choice: its leading
column, ``branch``, is in physical order, so the planner costed an index scan
as sequential reads. The function adds about 1 µs to each revision written.

What only the text index could do, walk keys in key order, is done off the
partial ``revision_creates`` (one entry per key life), then a seek per key
here. The state at an archive cut gets the same expression
(``archivebase_key``), so an as-of read seeks both arms of
``changesets.archive.boundary.revision_source`` alike.
"""

from django.db import migrations

KEY_HASH = r"""
CREATE OR REPLACE FUNCTION atlas_key_hash(branch text, namespace text, kind text, slug text)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE COST 1000 AS $$
BEGIN
    RETURN hashtextextended(
        branch || chr(31) || namespace || chr(31) || kind || chr(31) || slug, 0
    );
END
$$;
"""
KEY = "atlas_key_hash(branch, namespace, kind, slug)"
OLD_ASOF = "hashtextextended(namespace || '/' || kind || '/' || slug, 0)"


class Migration(migrations.Migration):
    dependencies = [("changesets", "0040_revision_images")]

    operations = [
        migrations.RunSQL(
            KEY_HASH, "DROP FUNCTION IF EXISTS atlas_key_hash(text, text, text, text)"
        ),
        migrations.RunSQL(
            f"CREATE INDEX IF NOT EXISTS revision_key ON changesets_revision ({KEY}, seq DESC)",
            "DROP INDEX IF EXISTS revision_key",
        ),
        migrations.RemoveIndex(model_name="revision", name="revision_history"),
        migrations.RunSQL(
            "DROP INDEX IF EXISTS revision_asof",
            f"CREATE INDEX IF NOT EXISTS revision_asof ON changesets_revision ({OLD_ASOF}, seq DESC)"
            " WHERE branch = ''",
        ),
        migrations.RunSQL(
            [
                "DROP INDEX IF EXISTS archivebase_asof",
                f"CREATE INDEX archivebase_key ON changesets_archivebase ({KEY}, seq DESC)",
            ],
            [
                "DROP INDEX IF EXISTS archivebase_key",
                f"CREATE INDEX archivebase_asof ON changesets_archivebase ({OLD_ASOF}, seq DESC)",
            ],
        ),
        migrations.RunSQL("ANALYZE changesets_revision", migrations.RunSQL.noop),
    ]
