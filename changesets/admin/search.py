"""Admin search over the log by entity, served by index seeks (no scan of history).

Revisions are indexed by ``(branch, namespace, kind, slug, seq)``. A search
by slug alone does not know the leading columns, and PostgreSQL 16 cannot
skip-scan, so a plain ``slug = %s`` (or Django's ``icontains``) would read
every revision. Instead:

1. list the distinct ``(branch, namespace, kind)`` prefixes with a loose
   index scan (one seek per prefix; there are few);
2. seek ``(prefix, slug)`` for each of them, newest first, at most
   :data:`MAX_MATCHES` revisions.

The cost follows the number of prefixes and matches, not the log's size.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from atlas.admin_mixins import loose_index_scan
from atlas.replicas import read_connection

# The newest revisions of one entity that a search returns (a very busy key
# has more; the date hierarchy and filters narrow further).
MAX_MATCHES = 5000
_SLUG_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
_SEQ_RE = re.compile(r"^#(\d{1,18})$")

_MATCH_SQL = """
SELECT r.id, r.changeset_id
FROM unnest(%s::text[], %s::text[], %s::text[]) AS c(branch, namespace, kind)
JOIN changesets_revision r
  ON r.branch = c.branch AND r.namespace = c.namespace AND r.kind = c.kind AND r.slug = %s
ORDER BY r.seq DESC
LIMIT %s
"""


def parse_changeset_ref(term: str) -> dict[str, Any] | None:
    """``{"pk": UUID}`` for a changeset id, ``{"seq": n}`` for ``#n``, else None."""
    try:
        return {"pk": uuid.UUID(term)}
    except ValueError:
        pass
    match = _SEQ_RE.match(term)
    return {"seq": int(match.group(1))} if match else None


def matching_revisions(
    term: str, *, readable: list[str] | None
) -> list[tuple[int, uuid.UUID]] | None:
    """``(revision id, changeset id)`` of the revisions of the entity ``term`` names.

    ``term`` is a slug (any namespace and kind) or ``namespace/kind/slug``.
    Only namespaces in ``readable`` (``None`` = all) are searched, so a search
    never reveals a key in a namespace the user cannot read. Returns None
    when ``term`` cannot name an entity at all.
    """
    parts = term.split("/")
    if len(parts) == 3:
        namespace, kind, slug = parts
        if not _SLUG_RE.match(slug):
            return None
        branches = loose_index_scan(table="changesets_revision", columns=["branch"])
        combos = [(b, namespace, kind) for (b,) in branches]
    elif len(parts) == 1 and _SLUG_RE.match(term):
        slug = term
        combos = loose_index_scan(
            table="changesets_revision", columns=["branch", "namespace", "kind"]
        )
    else:
        return None
    if readable is not None:
        allowed = set(readable)
        combos = [c for c in combos if c[1] in allowed]
    if not combos:
        return []
    with read_connection().cursor() as cursor:
        cursor.execute(
            _MATCH_SQL,
            [
                [c[0] for c in combos],
                [c[1] for c in combos],
                [c[2] for c in combos],
                slug,
                MAX_MATCHES,
            ],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]
