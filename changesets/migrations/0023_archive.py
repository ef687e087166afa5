"""The archive's own tables (issue 21): cuts, segments, the state at the cut, retention,
rewrites. No log table changes here; 0024 adds the archive's delete guard.

``archivebase_asof`` is ``revision_asof`` (migration 0007) on the state at the cut,
same expression, so the as-of statement's seek by key hash runs on both tables.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('changesets', '0022_changeset_rare_rpc'),
        ('entities', '0004_entity_write_guard'),
    ]

    operations = [
        migrations.CreateModel(
            name='ArchiveBase',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('revision_id', models.BigIntegerField()),
                ('valid_from', models.BigIntegerField()),
                ('valid_to', models.BigIntegerField(blank=True, null=True)),
                ('changeset_id', models.UUIDField()),
                ('seq', models.BigIntegerField()),
                ('branch', models.CharField(blank=True, default='', max_length=63)),
                ('at', models.DateTimeField()),
                ('namespace', models.CharField(max_length=200)),
                ('kind', models.CharField(max_length=100)),
                ('slug', models.CharField(max_length=200)),
                ('op', models.CharField(max_length=6)),
                ('before', models.JSONField(null=True)),
                ('after', models.JSONField(null=True)),
                ('before_version', models.PositiveIntegerField(null=True)),
                ('after_version', models.PositiveIntegerField(null=True)),
                ('changed', django.contrib.postgres.fields.ArrayField(base_field=models.TextField(), default=list, size=None)),
                ('salt', models.BinaryField(null=True)),
                ('sealed', models.JSONField(editable=False, null=True)),
            ],
            options={
                'indexes': [models.Index(fields=['namespace', 'kind', 'slug', '-seq'], name='archivebase_history'), models.Index(condition=models.Q(('op', 'create')), fields=['namespace', 'kind', 'slug', '-seq'], name='archivebase_creates'), models.Index(condition=models.Q(('valid_to__isnull', False)), fields=['valid_to'], name='archivebase_retired')],
                'constraints': [models.UniqueConstraint(fields=('valid_from', 'namespace', 'kind', 'slug', 'seq'), name='archivebase_one_row')],
            },
        ),
        migrations.CreateModel(
            name='ArchiveCut',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.BigIntegerField(unique=True)),
                ('from_seq', models.BigIntegerField()),
                ('prev_hash', models.CharField(max_length=64)),
                ('hash', models.CharField(max_length=64)),
                ('v1_hash', models.CharField(blank=True, default='', max_length=64)),
                ('at', models.DateTimeField()),
                ('max_changeset_id', models.UUIDField()),
                ('changesets', models.BigIntegerField()),
                ('revisions', models.BigIntegerField()),
                ('state', models.CharField(choices=[('planned', 'Planned'), ('written', 'Written'), ('verified', 'Verified'), ('signed', 'Signed'), ('switched', 'Switched'), ('removed', 'Removed')], default='planned', max_length=16)),
                ('checkpoint', models.JSONField(blank=True, null=True)),
                ('signature', models.TextField(blank=True, default='')),
                ('state_digest', models.CharField(blank=True, default='', max_length=64)),
                ('erasure_watermark', models.UUIDField(blank=True, null=True)),
                ('rewrites', models.PositiveIntegerField(default=0)),
                ('location', models.TextField()),
                ('requested_by', models.CharField(max_length=150)),
                ('created_at', models.DateTimeField()),
                ('signed_at', models.DateTimeField(blank=True, null=True)),
                ('switched_at', models.DateTimeField(blank=True, null=True)),
                ('removed_at', models.DateTimeField(blank=True, null=True)),
                ('removed_through', models.BigIntegerField(default=0)),
            ],
            options={
                'ordering': ['-seq'],
                'constraints': [models.CheckConstraint(condition=models.Q(('from_seq__gte', 1), ('seq__gte', models.F('from_seq'))), name='archivecut_range_valid')],
            },
        ),
        migrations.CreateModel(
            name='NamespaceRetention',
            fields=[
                ('namespace', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='retention', serialize=False, to='entities.namespace')),
                ('days', models.PositiveIntegerField(help_text='Keep at least this many days of history hot.')),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name': 'namespace retention',
                'constraints': [models.CheckConstraint(condition=models.Q(('days__gte', 1)), name='retention_days_positive')],
            },
        ),
        migrations.CreateModel(
            name='ArchiveRewrite',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('erasure_id', models.UUIDField()),
                ('state', models.CharField(choices=[('pending', 'Pending'), ('signed', 'Signed'), ('done', 'Done')], default='pending', max_length=10)),
                ('created_at', models.DateTimeField()),
                ('done_at', models.DateTimeField(blank=True, null=True)),
                ('segments', models.JSONField(blank=True, default=list)),
                ('error', models.TextField(blank=True, default='')),
                ('cut', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='rewrite_records', to='changesets.archivecut')),
            ],
            options={
                'ordering': ['created_at', 'id'],
                'constraints': [models.UniqueConstraint(fields=('erasure_id', 'cut'), name='archiverewrite_once')],
            },
        ),
        migrations.CreateModel(
            name='ArchiveSegment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=300, unique=True)),
                ('first_seq', models.BigIntegerField()),
                ('last_seq', models.BigIntegerField()),
                ('changesets', models.BigIntegerField()),
                ('revisions', models.BigIntegerField()),
                ('state', models.CharField(choices=[('planned', 'Planned'), ('written', 'Written'), ('verified', 'Verified')], default='planned', max_length=10)),
                ('bytes', models.BigIntegerField(blank=True, null=True)),
                ('digest', models.CharField(blank=True, default='', max_length=64)),
                ('namespaces', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=200), blank=True, default=list, size=None)),
                ('written_at', models.DateTimeField(blank=True, null=True)),
                ('verified_at', models.DateTimeField(blank=True, null=True)),
                ('cut', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='segments', to='changesets.archivecut')),
            ],
            options={
                'ordering': ['first_seq'],
                'constraints': [models.UniqueConstraint(fields=('cut', 'first_seq'), name='archivesegment_one_start'), models.CheckConstraint(condition=models.Q(('last_seq__gte', models.F('first_seq'))), name='archivesegment_range')],
            },
        ),
        migrations.RunSQL(
            "CREATE INDEX archivebase_asof ON changesets_archivebase"
            " (hashtextextended(namespace || '/' || kind || '/' || slug, 0), seq DESC)",
            "DROP INDEX IF EXISTS archivebase_asof",
        ),
    ]
