"""Hash-chain columns, and the chain computed for changesets written before them.

The backfill is the one place the log's rows are updated: it fills the two
new columns of existing rows, once, with the append-only trigger switched
off inside this migration's transaction (table owner only).
"""

from django.db import migrations, models


def backfill(apps, schema_editor):
    from changesets import chainv1 as chain

    Changeset = apps.get_model("changesets", "Changeset")
    Revision = apps.get_model("changesets", "Revision")
    LogHead = apps.get_model("changesets", "LogHead")
    if not Changeset.objects.exists():
        return
    schema_editor.execute("ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_append_only")
    prev = chain.GENESIS
    for changeset in Changeset.objects.order_by("seq").iterator(chunk_size=500):
        revisions = list(Revision.objects.filter(changeset_id=changeset.id).order_by("id"))
        digest = chain.revisions_digest(revisions)
        value = chain.changeset_hash(prev_hash=prev, changeset=changeset, revisions_hex=digest)
        Changeset.objects.filter(pk=changeset.pk).update(prev_hash=prev, hash=value)
        prev = value
    schema_editor.execute("ALTER TABLE changesets_changeset ENABLE TRIGGER changeset_append_only")
    LogHead.objects.filter(pk=1).update(hash=prev)


class Migration(migrations.Migration):

    dependencies = [
        ('changesets', '0004_subscription'),
    ]

    operations = [
        migrations.AddField(
            model_name='changeset',
            name='hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='changeset',
            name='prev_hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='loghead',
            name='hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
