"""MCP's read tools carry the archive's marker and 410s as the API does (docs/mcp.md)."""

from __future__ import annotations

import pytest

from changesets.archive.models import ArchiveCut
from tests.atlas.test_mcp import Agent
from tests.changesets.archive.conftest import NS_A, cut

pytestmark = pytest.mark.django_db


def test_history_and_changeset_lists_end_at_the_cut_through_mcp(seed, archive_dir):
    seeded = seed()
    cut(seeded.seq_of(4))
    row = ArchiveCut.objects.order_by("-seq").first()
    marker = {"seq": row.seq, "checkpoint": row.hash}
    agent = Agent(seeded.root)
    history = agent.call("get_entity_history", namespace=NS_A, kind="doc", slug="a")
    assert history["archived_before"] == marker
    assert all(r["seq"] > row.seq for r in history["results"])
    listed = agent.call("list_changesets", page_size=500)
    assert listed["archived_before"] == marker


def test_an_archived_changeset_is_410_through_mcp(seed, archive_dir):
    seeded = seed()
    cut(seeded.seq_of(4))
    problem = Agent(seeded.root).problem("get_changeset", changeset_id=str(seeded.ids[0]))
    assert problem["status"] == 410 and problem["checkpoint"]
