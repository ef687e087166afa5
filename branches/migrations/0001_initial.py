# Branches and their overlay rows.

import django.contrib.postgres.fields
import django.contrib.postgres.indexes
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('changesets', '0001_initial'),
        ('entities', '0002_content_is_object'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Branch',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=63, unique=True)),
                ('status', models.CharField(choices=[('open', 'Open'), ('merged', 'Merged'), ('abandoned', 'Abandoned')], default='open', max_length=10)),
                ('comment', models.TextField(blank=True, default='')),
                ('created_by_name', models.CharField(max_length=150)),
                ('created_at', models.DateTimeField()),
                ('fork_seq', models.BigIntegerField(default=0)),
                ('closed_at', models.DateTimeField(blank=True, null=True)),
                ('namespaces', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=200), default=list, size=None)),
                ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('fork_changeset', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='changesets.changeset')),
                ('merged_changeset', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='changesets.changeset')),
            ],
            options={
                'verbose_name_plural': 'branches',
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='BranchEntity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(max_length=100)),
                ('slug', models.CharField(max_length=200)),
                ('content', models.JSONField(null=True)),
                ('deleted', models.BooleanField(default=False)),
                ('version', models.PositiveIntegerField(null=True)),
                ('base_version', models.PositiveIntegerField(null=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('changeset_id', models.UUIDField()),
                ('branch', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='overlay', to='branches.branch')),
                ('namespace', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='entities.namespace')),
            ],
            options={
                'verbose_name_plural': 'branch entities',
                'ordering': ['branch', 'namespace', 'kind', 'slug'],
            },
        ),
        migrations.AddIndex(
            model_name='branch',
            index=django.contrib.postgres.indexes.GinIndex(fields=['namespaces'], name='branch_namespaces'),
        ),
        migrations.AddConstraint(
            model_name='branch',
            constraint=models.CheckConstraint(condition=models.Q(('name__regex', '^[a-z0-9][a-z0-9._-]{0,62}$')), name='branch_name_valid'),
        ),
        migrations.AddConstraint(
            model_name='branch',
            constraint=models.CheckConstraint(condition=models.Q(('fork_seq__gte', 0)), name='branch_fork_seq_nonneg'),
        ),
        migrations.AddConstraint(
            model_name='branch',
            constraint=models.CheckConstraint(condition=models.Q(('merged_changeset__isnull', True), ('status', 'merged'), _connector='OR'), name='branch_merged_changeset_only_when_merged'),
        ),
        migrations.AddConstraint(
            model_name='branch',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('closed_at__isnull', True), ('status', 'open')), models.Q(models.Q(('status', 'open'), _negated=True), ('closed_at__isnull', False)), _connector='OR'), name='branch_closed_at_iff_closed'),
        ),
        migrations.AddConstraint(
            model_name='branchentity',
            constraint=models.UniqueConstraint(fields=('branch', 'namespace', 'kind', 'slug'), name='branch_entity_key_unique'),
        ),
        migrations.AddConstraint(
            model_name='branchentity',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('content__isnull', True), ('deleted', True), ('version__isnull', True)), models.Q(('content__isnull', False), ('deleted', False), ('version__gte', 1)), _connector='OR'), name='branch_entity_tombstone_or_live'),
        ),
    ]
