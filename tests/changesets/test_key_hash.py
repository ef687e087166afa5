"""Every seek of one key's revisions is right when keys share its hash.

History, blame, as-of, diff, restore's versions, the write path's version
lookup and the admin's search find a key's revisions on ``revision_key``, a
64-bit hash of branch and key (migration 0041), and compare the real key after.
Real collisions are too rare to meet in a test, so these tests swap in a hash of
the namespace alone: every key of a namespace collides with every other, on
baseline and on every branch. The swap is DDL inside the test's transaction,
rolled back with it, and made before anything is written, so the index holds
the swapped hash throughout.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from changesets.admin import search
from changesets.models import Revision
from changesets.selectors import asof, blame, diff, log, restore
from changesets.services.lock import last_versions
from entities.store import EntityKey

NS = "acme.orders"
A, B, C = (EntityKey(NS, "item", slug) for slug in ("a", "b", "c"))

COLLIDING = """
CREATE OR REPLACE FUNCTION atlas_key_hash(branch text, namespace text, kind text, slug text)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE COST 1000 AS $$
BEGIN
    RETURN hashtextextended(namespace, 0);
END
$$;
"""


@pytest.fixture
def colliding(db: Any, namespace: Any) -> None:
    with connection.cursor() as cursor:
        cursor.execute(COLLIDING)
        cursor.execute(
            "SELECT atlas_key_hash('', %s, 'item', 'a') = atlas_key_hash('x', %s, 'k', 'b')",
            [NS, NS],
        )
        assert cursor.fetchone() == (True,)


@pytest.fixture
def interleaved(colliding: None, staff: Any, write: Any) -> dict[EntityKey, list[int]]:
    """Three keys written in turn, ``b`` deleted midway: each key's seqs, oldest first."""
    seqs: dict[EntityKey, list[int]] = {A: [], B: [], C: []}
    for step in range(6):
        for key in (A, B, C):
            if key == B and step == 3:
                result = write(staff, f"{NS}/item/b", None)
            elif key == B and step > 3:
                continue
            else:
                content = {"slug": key.slug, "step": step, f"only_{key.slug}": step}
                result = write(staff, f"{NS}/item/{key.slug}", content)
            seqs[key].append(result.changeset.seq)
    return seqs


def own_seqs(key: EntityKey) -> list[int]:
    """The key's seqs, read without the index (a plain filter on the real key)."""
    rows = Revision.objects.filter(namespace=key.namespace, kind=key.kind, slug=key.slug)
    return sorted(rows.values_list("seq", flat=True))


def test_entity_history_holds_the_keys_own_revisions(interleaved):
    for key, seqs in interleaved.items():
        assert seqs == own_seqs(key)
        rows = log.entity_history(key=key, limit=50)
        assert [r.seq for r in rows] == seqs[::-1]
        assert {EntityKey(r.namespace, r.kind, r.slug) for r in rows} == {key}
        assert [r.seq for r in log.entity_history(key=key, before_seq=seqs[-1], limit=2)] == (
            seqs[-2:-4:-1]
        )
        assert log.entity_has_history(key=key)
    assert not log.entity_has_history(key=EntityKey(NS, "item", "never"))


def test_blame_names_only_the_keys_own_changesets(interleaved):
    for key in (A, C):
        own = set(Revision.objects.filter(slug=key.slug).values_list("changeset_id", flat=True))
        content = {"slug": key.slug, "step": 5, f"only_{key.slug}": 5}
        found = blame.blame(content=content, key=key)
        assert {b.pointer for b in found} == {"/slug", "/step", f"/only_{key.slug}"}
        assert {b.changeset_id for b in found} <= own
        newest = max(interleaved[key])
        assert {b.seq for b in found if b.pointer == "/step"} == {newest}


def test_as_of_and_diff_read_each_key_at_the_point(interleaved):
    point = interleaved[B][2]  # b's third write, before its delete
    for key, expected_step in ((A, 2), (B, 2), (C, 1)):
        entity = asof.entity_as_of(seq=point, key=key)
        assert entity is not None and entity.content["slug"] == key.slug
        assert entity.content["step"] == expected_step
    assert asof.entity_as_of(seq=interleaved[B][-1], key=B) is None  # deleted then
    listing = diff.Listing(namespaces=None, namespace=NS)
    changed = diff.namespace_diff(
        listing=listing, from_seq=point, to_seq=max(interleaved[C]), after=None, limit=10
    )
    by_slug = {d.key.slug: d for d in changed}
    assert by_slug["b"].op == "delete" and by_slug["b"].before["slug"] == "b"
    assert by_slug["a"].after == {"slug": "a", "step": 5, "only_a": 5}


def test_versions_and_the_write_paths_lookup_stay_per_key(interleaved, staff, write):
    # a and c are at version 6; b was deleted at its version 3.
    assert last_versions("", [A, B, C]) == {A: 6, B: 3, C: 6}
    image = restore.version_content(key=B, version=2)
    assert image is not None and image.content == {"slug": "b", "step": 1, "only_b": 1}
    assert restore.version_content(key=B, version=6) is None
    again = write(staff, f"{NS}/item/b", {"slug": "b", "again": True})
    assert again.results[0].version == 4  # versions continue b's own line, not a's


def test_admin_search_finds_the_slugs_revisions_only(interleaved):
    slug, combos = search.entity_prefixes("b", readable=None)
    found = search.candidates(slug, combos, direction="before", after=None, limit=100)
    assert sorted(c.seq for c in found) == interleaved[B]
