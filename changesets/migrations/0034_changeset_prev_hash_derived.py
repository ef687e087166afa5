"""A changeset's ``prev_hash`` is no longer stored: it is the previous changeset's ``hash``.

Seq is contiguous and the chain is walked in seq order, so every reader of the
chain has the previous hash in hand (``chain.verify``, the archive's
``reader.pairs``), and one changeset's is one seek away
(``changesets.selectors.log.previous_hash``). Stored, it cost 33 bytes a
changeset (issue 16, "half the bytes"). The column was nullable already, so
this migration changes nothing forward: from it on the log statement leaves the
column NULL, and the rows written before keep theirs (``verify_log`` still
checks those chain). ``hash`` covers the previous hash either way, so a
changeset moved, removed or edited still breaks the walk.

Backwards, the NULLs are filled from the previous row's hash (or the archive
cut's at that seq, or the genesis before seq 1), which is what the code before
this migration reads.
"""

from django.db import migrations

GENESIS = "0" * 64

FILL = f"""
ALTER TABLE changesets_changeset DISABLE TRIGGER changeset_append_only;
UPDATE changesets_changeset c SET prev_hash = COALESCE(
    (SELECT p.hash FROM changesets_changeset p WHERE p.seq = c.seq - 1),
    (SELECT decode(a.hash, 'hex') FROM changesets_archivecut a WHERE a.seq = c.seq - 1),
    CASE WHEN c.seq = 1 THEN decode('{GENESIS}', 'hex') END
)
WHERE c.prev_hash IS NULL;
ALTER TABLE changesets_changeset ENABLE TRIGGER changeset_append_only;
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0033_changeset_message_derived")]

    operations = [migrations.RunSQL(migrations.RunSQL.noop, FILL)]
