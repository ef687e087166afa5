"""The branch's base point (``base_changeset``, ``base_seq``, ``synced_at``).

Existing branches are based on their fork: the backfill copies it, before the
constraint that a base point never lies before the fork.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('branches', '0002_branch_members'),
        ('changesets', '0016_rpc_erase_restore_sync'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='branch',
            name='base_changeset',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='changesets.changeset'),
        ),
        migrations.AddField(
            model_name='branch',
            name='base_seq',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='branch',
            name='synced_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(
            "UPDATE branches_branch SET base_changeset_id = fork_changeset_id, base_seq = fork_seq",
            migrations.RunSQL.noop,
        ),
        migrations.AddConstraint(
            model_name='branch',
            constraint=models.CheckConstraint(condition=models.Q(('base_seq__gte', models.F('fork_seq'))), name='branch_base_not_before_fork'),
        ),
    ]
