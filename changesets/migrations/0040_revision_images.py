"""``revision_images``: a namespace's creates and deletes, newest first.

A create's and a delete's ``changed`` name every top-level member of the
image, so a key set when entities are created and seldom changed after
(``/name``) matches every create of its namespace. ``GET /revisions?namespace=
&key=`` found those through the key index, which cannot return them newest
first: in the scale bench's busy namespace the page read and counted the
namespace's creates until a rung of its ladder held them all (9 ms at 100k
changesets, 80 ms at 1M, 1.1 s at 10M). With this index the whole-image
revisions of a namespace are a backward seek, and such a key's page is among
the newest of them (``changesets.selectors.key_images``).

The key is the hash of branch and namespace, as the changeset table's position
indexes use a namespace's (migration 0037): int8s make a dense B-tree entry,
where two text columns made one twice as wide. Then ``seq`` and ``id``, the
page's order, so that the newest rows of every partition come off the index in
it, with no sort of the namespace's images. Partial: updates, most of the log,
are not in it.
"""

from django.db import migrations

CREATE = (
    "CREATE INDEX IF NOT EXISTS revision_images ON changesets_revision"
    " (hashtextextended(branch || chr(31) || namespace, 0), seq, id)"
    " WHERE op IN ('create', 'delete')"
)


class Migration(migrations.Migration):
    dependencies = [("changesets", "0039_key_terms_by_op")]

    operations = [migrations.RunSQL(CREATE, "DROP INDEX IF EXISTS revision_images")]
