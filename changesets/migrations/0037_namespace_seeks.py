"""A namespace's changesets newest first as index seeks; the whole-log GIN index goes.

``changeset_namespaces`` (GIN over the ``namespaces`` array) found a namespace's
changesets, but a GIN index returns them in no order: a page of a rare
namespace sorted every changeset the namespace ever had, and a scoped reader's
``as_of_time`` far back read a bitmap of hers (issue 18: both grew with the
log). B-trees over the array's positions return them in seq order:

- ``changeset_ns1_seq`` on ``(key of namespaces[1], seq)``: every changeset;
- ``changeset_ns2_seq`` on ``(key of namespaces[2], seq)``: those that touched
  two or more namespaces (a batch across namespaces);
- ``changeset_ns3_more``: GIN again, but only over the few that touched three or
  more, so what a page sorts from it is those few, not the log.

The key is the name's 64-bit hash (``hashtextextended(name, 0)``,
``changesets.models.namespace_key`` says why: an index of int8 keys stays
dense where one of text keys was half empty); queries recheck the name. A
namespace X's changesets are then two ordered seeks and a small bitmap
(``changesets.selectors.by_namespace``). Bytes per single write: the first
B-tree's entry instead of the GIN's (docs/benchmarks.md, "Where a write's bytes
go").
"""

import django.contrib.postgres.indexes
from django.db import migrations, models


def namespace_key(position: int) -> models.Func:
    """``changesets.models.namespace_key`` as of this migration."""
    return models.Func(
        models.F(f"namespaces__{position}"),
        models.Value(0),
        function="hashtextextended",
        output_field=models.BigIntegerField(),
    )


# What the planner knows of the positions. A query asks for the hash and the
# name together, which the planner would take for two independent conditions
# (the share of the log squared) without statistics that tie them; and the
# second and third positions have no whole-table index whose expression
# PostgreSQL would keep statistics for. Without these objects it guessed 0.5%
# of the log for ``namespaces[2] = X`` and 99.5% for ``namespaces[3] IS NOT
# NULL``, and walked the seq index backwards looking for rows that are few.
# Dependencies only: with an MCV list as well, a name outside the list (a rare
# namespace, the very case) was estimated as the product again (1 row for
# 1,713). Expression statistics are PostgreSQL 14's; on 13 the guesses stay
# (``by_namespace`` orders the wide arm by ``seq + 0`` so that it cannot walk).
STATISTICS = """
DO $$ BEGIN
    IF current_setting('server_version_num')::int >= 140000 THEN
        CREATE STATISTICS changeset_ns1_stats (dependencies) ON (namespaces[1]),
            (hashtextextended(namespaces[1], 0)) FROM changesets_changeset;
        CREATE STATISTICS changeset_ns2_stats (dependencies) ON (namespaces[2]),
            (hashtextextended(namespaces[2], 0)) FROM changesets_changeset;
        CREATE STATISTICS changeset_ns3_stats ON ((namespaces[3])) FROM changesets_changeset;
    END IF;
END $$;
"""
NO_STATISTICS = """
DROP STATISTICS IF EXISTS changeset_ns1_stats;
DROP STATISTICS IF EXISTS changeset_ns2_stats;
DROP STATISTICS IF EXISTS changeset_ns3_stats;
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0036_write_moved_check")]

    operations = [
        migrations.AddIndex(
            model_name="changeset",
            index=models.Index(namespace_key(0), models.F("seq"), name="changeset_ns1_seq"),
        ),
        migrations.AddIndex(
            model_name="changeset",
            index=models.Index(
                namespace_key(1),
                models.F("seq"),
                condition=models.Q(("namespaces__1__isnull", False)),
                name="changeset_ns2_seq",
            ),
        ),
        migrations.AddIndex(
            model_name="changeset",
            index=django.contrib.postgres.indexes.GinIndex(
                condition=models.Q(("namespaces__2__isnull", False)),
                fields=["namespaces"],
                name="changeset_ns3_more",
            ),
        ),
        migrations.RunSQL(STATISTICS, NO_STATISTICS),
        migrations.RemoveIndex(model_name="changeset", name="changeset_namespaces"),
        # The statistics are empty until the table is analyzed, and until then the
        # planner squares a namespace's share (see above): a sample, a few seconds.
        migrations.RunSQL("ANALYZE changesets_changeset", migrations.RunSQL.noop),
    ]
