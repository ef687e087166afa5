"""Re-chain an existing log from v1 to v2 (``changesets.rechain``), once, recorded.

Bounded memory (chunks by seq), a progress bar on stderr, the v1 chain checked
as it is walked (a log that does not verify is not re-chained: the migration
fails and says where), and a ``ChainUpgrade`` row with the v1 head at the cut.
An empty log has nothing to re-chain and records nothing.
"""

import sys

from django.db import migrations


def forward(apps, schema_editor):
    from changesets import rechain

    with schema_editor.connection.cursor() as cursor:
        record = rechain.rechain_to_v2(cursor, progress=sys.stderr.isatty())
    if record is not None:
        sys.stderr.write(
            f"\n  re-chained {record['seq']} changeset(s), {record['revisions']} revision(s):"
            f" v1 head {record['v1_hash']} is v2 {record['v2_hash']}\n"
        )


def backward(apps, schema_editor):
    from changesets import rechain

    with schema_editor.connection.cursor() as cursor:
        rechain.rechain_to_v1(cursor, progress=sys.stderr.isatty())


class Migration(migrations.Migration):
    dependencies = [("changesets", "0017_erasure_chain_v2")]

    operations = [migrations.RunPython(forward, backward)]
