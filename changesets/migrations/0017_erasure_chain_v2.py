"""Erasure (issue 16, item 4) and the v2 chain's columns (item 5).

Schema only; 0018 re-chains an existing log. The revision guard changes from
"no UPDATE, no DELETE" to "no UPDATE, no DELETE, except an erasure": an
UPDATE passes only inside a transaction that set ``atlas.erasing`` (the erase
service's ``SET LOCAL``), only when it changes nothing but the images, the
salt (to NULL) and the seal, and only when every change to an image turns a
value into ``"[erased]"`` (``atlas_only_erased``). Every other UPDATE and
every DELETE is refused as before. Erasure records are append-only too.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
import uuid6
from django.conf import settings
from django.db import migrations, models


ONLY_ERASED = r"""
CREATE OR REPLACE FUNCTION atlas_only_erased(old jsonb, new jsonb) RETURNS boolean AS $$
DECLARE
    k text;
    i int;
BEGIN
    IF old IS NULL OR new IS NULL THEN
        RETURN old IS NULL AND new IS NULL;
    END IF;
    IF old = new OR new = '"[erased]"'::jsonb THEN
        RETURN true;
    END IF;
    IF jsonb_typeof(old) = 'object' AND jsonb_typeof(new) = 'object' THEN
        IF (SELECT array_agg(x ORDER BY x) FROM jsonb_object_keys(old) x)
           IS DISTINCT FROM (SELECT array_agg(x ORDER BY x) FROM jsonb_object_keys(new) x) THEN
            RETURN false;
        END IF;
        FOR k IN SELECT jsonb_object_keys(old) LOOP
            IF NOT atlas_only_erased(old -> k, new -> k) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    END IF;
    IF jsonb_typeof(old) = 'array' AND jsonb_typeof(new) = 'array' THEN
        IF jsonb_array_length(old) <> jsonb_array_length(new) THEN
            RETURN false;
        END IF;
        FOR i IN 0 .. jsonb_array_length(old) - 1 LOOP
            IF NOT atlas_only_erased(old -> i, new -> i) THEN
                RETURN false;
            END IF;
        END LOOP;
        RETURN true;
    END IF;
    RETURN false;
END;
$$ LANGUAGE plpgsql IMMUTABLE;
"""

REVISION_GUARD = r"""
CREATE OR REPLACE FUNCTION atlas_revision_guard() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND current_setting('atlas.erasing', true) = 'on'
       AND NEW.salt IS NULL AND NEW.sealed IS NOT NULL
       AND (NEW.id, NEW.changeset_id, NEW.seq, NEW.branch, NEW.at, NEW.namespace, NEW.kind,
            NEW.slug, NEW.op, NEW.before_version, NEW.after_version, NEW.changed)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.changeset_id, OLD.seq, OLD.branch, OLD.at, OLD.namespace, OLD.kind,
            OLD.slug, OLD.op, OLD.before_version, OLD.after_version, OLD.changed)
       AND atlas_only_erased(OLD.before, NEW.before)
       AND atlas_only_erased(OLD.after, NEW.after) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the changeset log is append-only: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

FORWARD = [
    ONLY_ERASED,
    REVISION_GUARD,
    "DROP TRIGGER revision_append_only ON changesets_revision;",
    "CREATE TRIGGER revision_append_only BEFORE UPDATE OR DELETE ON changesets_revision"
    " FOR EACH ROW EXECUTE FUNCTION atlas_revision_guard();",
    "CREATE TRIGGER erasure_append_only BEFORE UPDATE OR DELETE ON changesets_erasure"
    " FOR EACH ROW EXECUTE FUNCTION atlas_log_append_only();",
]
REVERSE = [
    "DROP TRIGGER erasure_append_only ON changesets_erasure;",
    "DROP TRIGGER revision_append_only ON changesets_revision;",
    "CREATE TRIGGER revision_append_only BEFORE UPDATE OR DELETE ON changesets_revision"
    " FOR EACH ROW EXECUTE FUNCTION atlas_log_append_only();",
    "DROP FUNCTION atlas_revision_guard();",
    "DROP FUNCTION atlas_only_erased(jsonb, jsonb);",
]


class Migration(migrations.Migration):

    dependencies = [
        ('changesets', '0016_rpc_erase_restore_sync'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ChainUpgrade',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('at', models.DateTimeField()),
                ('from_version', models.CharField(max_length=32)),
                ('to_version', models.CharField(max_length=32)),
                ('seq', models.BigIntegerField()),
                ('v1_hash', models.CharField(max_length=64)),
                ('v2_hash', models.CharField(max_length=64)),
                ('revisions', models.BigIntegerField()),
            ],
        ),
        migrations.AddField(
            model_name='changeset',
            name='v1_hash',
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name='revision',
            name='salt',
            field=models.BinaryField(null=True),
        ),
        migrations.AddField(
            model_name='revision',
            name='sealed',
            field=models.JSONField(editable=False, null=True),
        ),
        migrations.CreateModel(
            name='Erasure',
            fields=[
                ('id', models.UUIDField(default=uuid6.uuid7, editable=False, primary_key=True, serialize=False)),
                ('author_name', models.CharField(max_length=150)),
                ('at', models.DateTimeField()),
                ('reason', models.TextField()),
                ('targets', models.JSONField()),
                ('namespaces', django.contrib.postgres.fields.ArrayField(base_field=models.CharField(max_length=200), default=list, size=None)),
                ('revisions_redacted', models.PositiveIntegerField(default=0)),
                ('changeset_ids', django.contrib.postgres.fields.ArrayField(base_field=models.UUIDField(), blank=True, default=list, size=None)),
                ('prev_hash', models.CharField(max_length=64)),
                ('hash', models.CharField(max_length=64)),
                ('author', models.ForeignKey(db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['-at', '-id'],
                'indexes': [models.Index(fields=['at', 'id'], name='erasure_at_id')],
            },
        ),
        migrations.RunSQL(FORWARD, reverse_sql=REVERSE),
    ]
