"""Changeset indexes ascending, and ``at`` with ``seq`` as its tiebreak (issues 17, 18).

``changeset_branch_seq`` and ``changeset_author_seq`` were descending on seq,
a value that only rises: every insert went to the leftmost leaf of its prefix,
whose splits leave pages half empty (about 73 and 57 bytes per row against
22.5 for the ascending ``seq`` index). Ascending, the insert point is the
rightmost leaf and pages fill; PostgreSQL reads them backwards for "newest
first" at the same cost.

``changeset_at`` becomes ``(at, seq)`` so that a time resolves to the last seq
at or before it (or the first at or after it) in one seek, ties within a
millisecond included: ``as_of_time`` and ``since``/``until`` bound the log by
seq from there instead of walking the seq index back from the newest row.

Plain ``AddIndex``/``RemoveIndex``: the build blocks writes while it reads the
changeset table once (three narrow indexes; not timed at scale here). A
deployment with a very large log can build them ``CONCURRENTLY`` by hand first.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("changesets", "0013_revision_changed")]

    operations = [
        migrations.RemoveIndex(model_name="changeset", name="changeset_branch_seq"),
        migrations.RemoveIndex(model_name="changeset", name="changeset_author_seq"),
        migrations.RemoveIndex(model_name="changeset", name="changeset_at"),
        migrations.AddIndex(
            model_name="changeset",
            index=models.Index(fields=["branch", "seq"], name="changeset_branch_seq"),
        ),
        migrations.AddIndex(
            model_name="changeset",
            index=models.Index(fields=["author_name", "seq"], name="changeset_author_seq"),
        ),
        migrations.AddIndex(
            model_name="changeset",
            index=models.Index(fields=["at", "seq"], name="changeset_at_seq"),
        ),
    ]
