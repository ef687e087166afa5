"""``GET /revisions?namespace=&key=``: the creates and deletes of a page.

A create's ``changed`` names every top-level member of its image, so a key every
entity has (``/payload`` here, ``/name`` in the scale bench) matches every create
of its namespace, and those are old: the key index held 172,055 of them for one
key in one partition of the scale bench's 10M log, and the ladder counted them
until a rung held them all (1.1 s a page). ``keys._key_revisions`` now reads a
page's updates by the ladder (on an update's terms alone) and its creates and
deletes off ``revision_images``, newest first (``key_images``), and merges the
two. EXPLAIN ANALYZE bounds what each reads; every page is checked against a
brute force over the rule's definition.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from changesets import pointers
from changesets.selectors import key_images, key_ladder, keys
from tests.changesets.partition_helpers import parent_index
from tests.changesets.test_key_ladder import brute, every_page, page, write
from tests.changesets.test_time_seek import analyze, nodes

pytestmark = pytest.mark.django_db

OLD, BUSY = "images.old", "images.busy"


@pytest.fixture
def log() -> None:
    """OLD: 2,000 creates (``/payload``, ``/v``), 400 deletes of them (every
    member), 10,000 writes to BUSY, then 300 updates of OLD's ``/v`` (every third
    also ``/w``), 60 creates with ``/w`` only, 2,000 more writes to BUSY."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1")
        seq = cursor.fetchone()[0] + 1
        seq = write(cursor, OLD, seq, 2000, "ARRAY['/payload', '/v']", op="create")
        seq = write(cursor, OLD, seq, 400, "ARRAY['/payload', '/v']", op="delete")
        seq = write(cursor, BUSY, seq, 10_000, "ARRAY['/v']")
        every_third = "CASE WHEN r %% 3 = 0 THEN ARRAY['/v', '/w'] ELSE ARRAY['/v'] END"
        seq = write(cursor, OLD, seq, 300, every_third)
        seq = write(cursor, OLD, seq, 20, "ARRAY['/w']", per=3, op="create")
        seq = write(cursor, BUSY, seq, 2000, "ARRAY['/v']")
        cursor.execute("UPDATE changesets_loghead SET seq = %s WHERE id = 1", [seq - 1])
        cursor.execute("ANALYZE changesets_revision")


def image_statements(call: Any) -> tuple[Any, list[str]]:
    """The result of ``call()`` and the statements it sent, the images' walk
    (``key_images``) first."""
    with CaptureQueriesContext(connection) as queries:
        result = call()
    sqls = [q["sql"] for q in queries.captured_queries]
    walks = [sql for sql in sqls if sql.startswith("WITH win AS")]
    assert len(walks) == 1, [sql[:60] for sql in sqls]
    return result, [walks[0], *(sql for sql in sqls if sql != walks[0])]


def read_off(plan: dict[str, Any], index: str) -> int:
    """Rows the plan's executed scans of ``index`` returned."""
    return sum(
        n["Actual Rows"] * n.get("Actual Loops", 1)
        for n in nodes(plan)
        if "Index Name" in n and parent_index(n["Index Name"]) == index
    )


def test_a_key_set_by_creates_is_read_off_the_newest_creates(log):
    # /payload: 2,400 matches (creates and deletes), all under 12,000 newer
    # revisions. The page is OLD's 51 newest deletes: the images' walk reads the
    # 60 newer creates (of /w), then them, and stops; the key index is not read
    # for the images, and for the updates it finds none (only creates and
    # deletes set /payload).
    rows, (walk, *others) = image_statements(lambda: page(OLD, "/payload"))
    assert [r.id for r in rows] == brute(OLD, "/payload") and len(rows) == 51
    assert {r.op for r in rows} == {"delete"}
    assert read_off(analyze(walk), "revision_images") <= 60 + 51
    # No probe of the images' terms; the updates' probe finds nothing.
    assert not [sql for sql in others if sql.startswith("WITH cand")], others
    probes = [sql for sql in others if "atlas_update_key_query" in sql]
    assert probes and all(read_off(analyze(sql), "revision_changed_keys") == 0 for sql in probes)


def test_updates_and_creates_merge_newest_first(log):
    # /w: 100 updates, then 60 creates (newer), then nothing.
    rows = page(OLD, "/w")
    assert [r.id for r in rows] == brute(OLD, "/w")
    assert [r.op for r in rows][:51] == ["create"] * 51


@pytest.mark.parametrize(
    "window, probe",
    [(256, 20_000), (7, 20_000), (7, 30), (1, 1), (100, 3)],
    ids=["as-shipped", "probe-holds", "walk-on", "tiny", "window-then-walk-on"],
)
def test_every_page_in_order(log, monkeypatch, window, probe):
    monkeypatch.setattr(key_images, "IMAGE_WINDOW", window)
    monkeypatch.setattr(key_images, "IMAGE_PROBE", probe)
    monkeypatch.setattr(key_ladder, "KEY_WINDOW", 100)
    monkeypatch.setattr(key_ladder, "KEY_PROBE", 200)
    for key in ["/payload", "/v", "/w", "/nothing"]:
        seen = every_page(OLD, key)
        assert len(seen) == {"/payload": 2400, "/v": 2700, "/w": 160, "/nothing": 0}[key]


def test_a_batch_of_creates_wider_than_the_window_pages_without_repeats(monkeypatch):
    # One changeset of 150 creates: the window ends inside it, and the probe (or
    # the walk on) goes on from the window's last row, not its seq.
    monkeypatch.setattr(key_images, "IMAGE_WINDOW", 40)
    with connection.cursor() as cursor:
        cursor.execute("SELECT seq FROM changesets_loghead WHERE id = 1")
        seq = write(cursor, OLD, cursor.fetchone()[0] + 1, 1, "ARRAY['/a']", per=150, op="create")
        cursor.execute("UPDATE changesets_loghead SET seq = %s WHERE id = 1", [seq - 1])
    for probe in [20_000, 5]:
        monkeypatch.setattr(key_images, "IMAGE_PROBE", probe)
        ids = every_page(OLD, "/a")
        assert len(ids) == len(set(ids)) == 150


def test_every_filter_on_baseline_and_a_branch_pages_as_the_rule_says(staff, make_user, namespace):
    """Creates, updates and deletes by two authors, of two kinds, on baseline and on
    a branch, written through the service; every key, with each other filter, paged
    by 3 through ``namespace_revisions``, against the rule applied to every row."""
    import random

    from branches.services import branch_create
    from branches.store import BranchStore
    from changesets.models import Revision, Rpc
    from changesets.ops import DeleteOp, PutOp
    from changesets.selectors.bounds import end_of_millisecond
    from changesets.services.apply import changeset_apply
    from entities.store import baseline
    from tests.changesets.helpers import key as entity_key

    ns = "acme.orders"
    rng = random.Random(16)
    alice = make_user("alice", writer=[ns])
    feature = BranchStore(branch_create(name="feature", actor=staff))
    live: dict[tuple[Any, str], dict[str, Any]] = {}
    for i in range(160):
        store = feature if i % 4 == 3 else baseline
        actor = alice if i % 3 else staff
        kind = rng.choice(["order", "event"])
        slug = f"{kind}/x-{rng.randrange(12)}"
        path = (id(store), slug)
        if path in live and rng.random() < 0.15:
            op: Any = DeleteOp(entity_key(f"{ns}/{slug}"))
            del live[path]
        else:
            content = dict(live.get(path) or {"name": slug, "a": {"b": 0}})
            member = rng.choice(["/a/b", "/c", "/name"])
            if member == "/a/b":
                content["a"] = {"b": i}
            else:
                content[member[1:]] = i
            live[path] = content
            op = PutOp(entity_key(f"{ns}/{slug}"), content)
        changeset_apply(store=store, actor=actor, ops=[op], rpc=Rpc.BATCH_MUTATE)
    times = sorted(Revision.objects.filter(namespace=ns).values_list("at", flat=True))
    middle = times[len(times) // 2]
    filters: list[dict[str, Any]] = [
        {},
        {"kind": "event"},
        {"author": "alice"},
        {"since": middle},
        {"until": middle},
    ]
    longest = 0
    for branch in ["", "feature"]:
        ops = set(Revision.objects.filter(branch=branch, namespace=ns).values_list("op", flat=True))
        assert ops == {"create", "update", "delete"}, (branch, ops)
        for pointer in ["/a", "/a/b", "/c", "/name", "/nothing"]:
            for extra in filters:
                where = keys.RevisionFilter(namespace=ns, key=pointer, **extra)
                rows = Revision.objects.filter(branch=branch, namespace=ns)
                if "kind" in extra:
                    rows = rows.filter(kind=extra["kind"])
                if "author" in extra:
                    rows = rows.filter(changeset__author_name=extra["author"])
                if "since" in extra:
                    rows = rows.filter(at__gte=extra["since"])
                if "until" in extra:
                    rows = rows.filter(at__lte=end_of_millisecond(extra["until"]))
                expected = [
                    r.id
                    for r in rows.order_by("-seq", "-id")
                    if any(pointers.relates(p, pointer) for p in r.changed)
                ]
                got, after = [], None
                while True:
                    page_rows = keys.namespace_revisions(
                        where=where, branch=branch, after=after, limit=3
                    )
                    got += [r.id for r in page_rows]
                    if len(page_rows) < 3:
                        break
                    after = (page_rows[-1].seq, page_rows[-1].id)
                assert got == expected, (branch, pointer, extra)
                longest = max(longest, len(got))
        assert longest > 9, longest  # pages of 3 were read across several pages
