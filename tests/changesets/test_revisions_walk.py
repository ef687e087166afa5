"""``GET /revisions`` filtered by kind or author (no key) walks the namespace's own
changesets, walk after walk, and pages like a brute-force read of the log."""

from __future__ import annotations

from typing import Any

import pytest

from changesets.models import Revision
from changesets.selectors import by_namespace
from changesets.selectors.keys import RevisionFilter, namespace_revisions
from tests.entities.factories import NamespaceFactory

NS = "acme.orders"


@pytest.fixture
def log(staff: Any, writer: Any, write: Any) -> None:
    """30 changesets in the namespace, two authors and two kinds in turn, each after
    a write to another namespace."""
    NamespaceFactory(name="acme.other")
    for n in range(30):
        write(staff, f"acme.other/item/x{n % 4}", {"n": n})
        actor = writer if n % 3 == 0 else staff
        kind = "item" if n % 2 else "note"
        write(actor, f"{NS}/{kind}/k{n % 5}", {"n": n})


def brute(**filters: Any) -> list[int]:
    rows = Revision.objects.filter(namespace=NS, branch="")
    if "kind" in filters:
        rows = rows.filter(kind=filters["kind"])
    if "author" in filters:
        rows = rows.filter(changeset__author_name=filters["author"])
    return sorted(rows.values_list("seq", flat=True), reverse=True)


@pytest.mark.parametrize("filters", [{"kind": "item"}, {"author": "wendy"}])
def test_pages_walk_after_walk_to_the_namespaces_start(log, monkeypatch, filters):
    # Walks of 3 changesets and 5 revisions: every page takes several.
    monkeypatch.setattr(by_namespace, "WALK_CHANGESETS", 3)
    monkeypatch.setattr(by_namespace, "WALK_REVISIONS", 5)
    where = RevisionFilter(namespace=NS, **filters)
    seen: list[int] = []
    after = None
    for _ in range(20):
        page = namespace_revisions(where=where, after=after, limit=4)
        seen += [r.seq for r in page]
        if len(page) < 4:
            break
        after = (page[-1].seq, page[-1].id)
    assert seen == brute(**filters)
    assert len(seen) >= 10
