"""As-of reads (API.md "Entities", As-of reads) against a brute-force replay.

A seeded generator writes hundreds of changesets (creates, updates,
unchanged puts, deletes, re-creates, multi-op batches that fold) through the
write service, and replays them in Python to know the full state after every
changeset. The API's ``as_of`` / ``as_of_time`` reads must match that replay
exactly, page by page.
"""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from atlas.api.render import rfc3339
from changesets.models import Changeset, Rpc
from changesets.ops import DeleteOp, PutOp, canonical
from changesets.selectors import asof
from changesets.services.apply import changeset_apply
from entities.store import NO_WRITES, EntityKey, Locked, baseline, namespaces_of
from tests.atlas.test_errors import assert_problem
from tests.entities.factories import NamespaceFactory, UserFactory

API = "/api/v1"
NAMESPACES = ("acme.billing", "acme.orders")
KINDS = ("event", "order")
SLUGS = ("a1", "a2", "a3", "ab1", "ab2", "b1", "b2", "c1")
ALL_KEYS = [EntityKey(ns, kind, slug) for ns in NAMESPACES for kind in KINDS for slug in SLUGS]
AS_OF_KEYS = {"changeset_id", "seq", "at"}


# --- the generator and its replay --------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    content: str  # canonical JSON
    version: int
    changeset_id: str  # last writer
    created_at: str
    updated_at: str


@dataclass
class History:
    changesets: list[Changeset] = field(default_factory=list)
    # states[i]: the whole store right after changesets[i]
    states: list[dict[EntityKey, Expected]] = field(default_factory=list)
    has_delete: list[bool] = field(default_factory=list)

    def index_of(self, changeset_id: str) -> int:
        return next(i for i, c in enumerate(self.changesets) if str(c.id) == changeset_id)


def _random_content(rng: random.Random) -> dict[str, Any]:
    """Low entropy on purpose: re-puts of equal content and returns to old content happen."""
    body: dict[str, Any] = {"n": rng.randint(0, 3)}
    if rng.random() < 0.5:
        body["tag"] = rng.choice(["x", "y", "ü"])
    if rng.random() < 0.3:
        body["nested"] = {"list": [rng.randint(0, 1), None], "flag": rng.random() < 0.5}
    return body


def build_history(actor: Any, seed: int, changesets: int) -> History:
    """Write ``changesets`` changesets at random through the service; replay them in Python."""
    rng = random.Random(seed)
    history = History()
    live: dict[EntityKey, Expected] = {}
    last_version: dict[EntityKey, int] = {}
    attempts = 0
    while len(history.changesets) < changesets:
        attempts += 1
        assert attempts < changesets * 3, "the generator keeps producing no-op batches"
        # 1. Plan an op list against a working copy (ops see earlier ones).
        working = {k: e.content for k, e in live.items()}
        ops: list[PutOp | DeleteOp] = []
        size = 1 if rng.random() < 0.6 else rng.randint(2, 6)
        for _ in range(size):
            k = rng.choice(ALL_KEYS)
            exists = k in working
            roll = rng.random()
            if exists and roll < 0.3:
                ops.append(DeleteOp(k))
                del working[k]
            elif exists and roll < 0.4:
                ops.append(PutOp(k, json.loads(working[k])))  # unchanged put
            else:
                body = _random_content(rng)
                ops.append(PutOp(k, body))
                working[k] = canonical(body)
        # 2. Apply.
        result = changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
        # 3. Fold per key (first before, last after) to predict what was written.
        touched = list(dict.fromkeys(op.key for op in ops))
        moved = [
            k
            for k in touched
            if (k in live) != (k in working) or (k in live and live[k].content != working[k])
        ]
        if not moved:
            assert result.changeset is None, "a batch that moved nothing wrote a changeset"
            continue
        cs = result.changeset
        assert cs is not None
        assert cs.op_count == len(moved)
        at = rfc3339(cs.at)
        deleted = False
        for k in moved:
            if k not in working:
                last_version[k] = live[k].version
                del live[k]
                deleted = True
                continue
            if k in live:
                version, created_at = live[k].version + 1, live[k].created_at
            else:
                version, created_at = last_version.get(k, 0) + 1, at
            last_version[k] = version
            live[k] = Expected(working[k], version, str(cs.id), created_at, at)
        history.changesets.append(cs)
        history.states.append(dict(live))
        history.has_delete.append(deleted)
    return history


def sample_indexes(history: History, rng: random.Random, count: int = 40) -> list[int]:
    """First, last, changesets with a delete and the ones right after, then random others."""
    last = len(history.changesets) - 1
    chosen = {0, last}
    deletes = [i for i, d in enumerate(history.has_delete) if d]
    for i in rng.sample(deletes, min(8, len(deletes))):
        chosen.add(i)
        chosen.add(min(i + 1, last))
    others = [i for i in range(last + 1) if i not in chosen]
    chosen.update(rng.sample(others, max(0, count - len(chosen))))
    return sorted(chosen)


# --- reading through the API ---------------------------------------------------------------


def list_all(client: Any, **params: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Walk every page; return the rows and the (identical on every page) as_of block."""
    rows: list[dict[str, Any]] = []
    as_of_blocks = []
    token = None
    for _ in range(100):
        query = {**params, **({"page_token": token} if token else {})}
        response = client.get(f"{API}/entities", query)
        assert response.status_code == 200, response.content
        body = response.json()
        rows.extend(body["results"])
        as_of_blocks.append(body.get("as_of"))
        token = body["next_page_token"]
        if token is None:
            break
    else:  # pragma: no cover
        raise AssertionError("paging did not end")
    assert all(b == as_of_blocks[0] for b in as_of_blocks), "as_of changed between pages"
    return rows, as_of_blocks[0]


def row_key(row: dict[str, Any]) -> EntityKey:
    return EntityKey(row["namespace"], row["kind"], row["slug"])


def assert_rows_match(rows: list[dict[str, Any]], expected: dict[EntityKey, Expected]) -> None:
    keys = [row_key(r) for r in rows]
    assert len(keys) == len(set(keys)), "a key appeared twice across pages"
    assert keys == sorted(expected), (
        f"keys differ: missing {sorted(set(expected) - set(keys))}, "
        f"extra {sorted(set(keys) - set(expected))}"
    )
    for row in rows:
        want = expected[row_key(row)]
        got = (
            canonical(row["content"]),
            row["version"],
            row["changeset_id"],
            row["created_at"],
            row["updated_at"],
        )
        assert got == (
            want.content,
            want.version,
            want.changeset_id,
            want.created_at,
            want.updated_at,
        ), row_key(row)


def as_of_block(changeset: Changeset) -> dict[str, Any]:
    return {"changeset_id": str(changeset.id), "seq": changeset.seq, "at": rfc3339(changeset.at)}


def entity_url(k: EntityKey) -> str:
    return f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}"


def stamp(at: datetime, tz: timezone = UTC) -> str:
    """Full-precision RFC 3339 (microseconds) of a stored ``at``."""
    return at.astimezone(tz).isoformat().replace("+00:00", "Z")


@pytest.fixture
def namespaces(db):
    return [NamespaceFactory(name=name) for name in NAMESPACES]


@pytest.fixture
def api(staff, client_for):
    return client_for(staff)


# --- correctness against the replay ------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2024, 90210])
def test_as_of_matches_brute_force_replay(seed, staff, namespaces, api):
    history = build_history(staff, seed, changesets=220)
    assert len(history.changesets) == 220
    assert sum(history.has_delete) >= 20, "the generator must exercise deletes"
    recreated = {
        k
        for i in range(1, len(history.states))
        for k in history.states[i]
        if k not in history.states[i - 1] and any(k in s for s in history.states[: i - 1])
    }
    assert recreated, "the generator must exercise re-creates"
    rng = random.Random(seed * 7 + 1)

    for i in sample_indexes(history, rng):
        cs, expected = history.changesets[i], history.states[i]
        rows, block = list_all(api, as_of=str(cs.id), page_size=7)
        assert block == as_of_block(cs)
        assert_rows_match(rows, expected)

        for k in rng.sample(ALL_KEYS, 4):
            response = api.get(entity_url(k), {"as_of": str(cs.id)})
            if k not in expected:
                assert_problem(response, 404)
                continue
            assert response.status_code == 200, response.content
            body = response.json()
            assert body["as_of"] == as_of_block(cs)
            assert_rows_match([body], {k: expected[k]})
            assert response["ETag"] == f'"{expected[k].version}"'

    # The newest as-of state is the live store.
    live, _ = list_all(api, page_size=500)
    as_of_last, _ = list_all(api, as_of=str(history.changesets[-1].id), page_size=500)
    assert as_of_last == live


def test_as_of_is_right_when_keys_share_a_hash(staff, namespaces, api, monkeypatch):
    """The seek runs on a hash of the key; when another key with the same hash has a
    newer revision at or before X, the comparison of the real key must drop it.
    Real 64-bit collisions are too rare to test, so hash only the namespace: every
    key of a namespace collides with every other."""
    monkeypatch.setattr(asof, "_AS_OF_SQL", asof._as_of_sql("hashtextextended({t}.namespace, 0)"))
    history = build_history(staff, 77, changesets=120)
    rng = random.Random(77)
    for i in sample_indexes(history, rng):
        cs, expected = history.changesets[i], history.states[i]
        rows, _ = list_all(api, as_of=str(cs.id), page_size=5)
        assert_rows_match(rows, expected)
        for k in rng.sample(ALL_KEYS, 4):
            response = api.get(entity_url(k), {"as_of": str(cs.id)})
            if k not in expected:
                assert_problem(response, 404)
            else:
                assert_rows_match([response.json()], {k: expected[k]})


def test_as_of_filters_match_the_replay(staff, namespaces, api):
    history = build_history(staff, 7, changesets=80)
    rng = random.Random(8)
    filters = [
        {"namespace": "acme.orders"},
        {"namespace": "acme.billing", "kind": "order"},
        {"kind": "event"},
        {"slug_prefix": "a"},
        {"slug_prefix": "ab"},
        {"namespace": "acme.orders", "kind": "order", "slug_prefix": "b"},
        {"slug_prefix": "zz"},
    ]
    for i in [0, *rng.sample(range(1, 79), 6), 79]:
        cs, state = history.changesets[i], history.states[i]
        for params in filters:
            expected = {
                k: e
                for k, e in state.items()
                if k.namespace == params.get("namespace", k.namespace)
                and k.kind == params.get("kind", k.kind)
                and k.slug.startswith(params.get("slug_prefix", ""))
            }
            rows, block = list_all(api, as_of=str(cs.id), page_size=3, **params)
            assert block == as_of_block(cs)
            assert_rows_match(rows, expected)


# --- as_of_time ------------------------------------------------------------------------------


def newest_at_or_before(history: History, at: datetime) -> int | None:
    hits = [i for i, c in enumerate(history.changesets) if c.at <= at]
    return max(hits, key=lambda i: history.changesets[i].seq) if hits else None


def test_as_of_time_picks_the_newest_changeset_at_or_before(staff, namespaces, api):
    history = build_history(staff, 11, changesets=40)
    rng = random.Random(12)
    for i in [0, *rng.sample(range(1, 39), 8), 39]:
        cs = history.changesets[i]
        for moment, tz in (
            (cs.at, UTC),
            (cs.at, timezone(timedelta(hours=2))),
            (cs.at - timedelta(microseconds=1), timezone(timedelta(hours=-5, minutes=-30))),
            (cs.at + timedelta(microseconds=1), UTC),
        ):
            want = newest_at_or_before(history, moment)
            if want is None:
                assert_problem(api.get(f"{API}/entities", {"as_of_time": stamp(moment, tz)}), 404)
                continue
            rows, block = list_all(api, as_of_time=stamp(moment, tz), page_size=50)
            assert block == as_of_block(history.changesets[want]), (i, moment)
            assert_rows_match(rows, history.states[want])
        # Same on entity get.
        k = next(iter(history.states[i]))
        response = api.get(entity_url(k), {"as_of_time": stamp(cs.at)})
        assert response.status_code == 200, response.content
        assert response.json()["as_of"]["seq"] >= cs.seq


def test_as_of_time_names_its_whole_millisecond(namespaces, client_for):
    """Times have millisecond precision (API.md): every instant inside a changeset's
    millisecond, its displayed ``at`` first, includes it; the instant before does not."""
    root = UserFactory(username="root-ms", is_superuser=True, is_staff=True)
    api = client_for(root)
    history = build_history(root, 4, changesets=1)
    [cs], k = history.changesets, next(iter(history.states[0]))
    assert cs.at.microsecond % 1000 == 0
    for moment in (cs.at, cs.at + timedelta(microseconds=1), cs.at + timedelta(microseconds=999)):
        response = api.get(entity_url(k), {"as_of_time": stamp(moment)})
        assert response.status_code == 200, (moment, response.content)
        assert response.json()["as_of"]["changeset_id"] == str(cs.id)
    assert response.json()["as_of"]["at"] == rfc3339(cs.at)
    earlier = stamp(cs.at - timedelta(microseconds=1))
    assert_problem(api.get(entity_url(k), {"as_of_time": earlier}), 404)


def test_as_of_time_before_the_first_changeset_is_404(staff, namespaces, api):
    history = build_history(staff, 3, changesets=3)
    before = history.changesets[0].at - timedelta(seconds=1)
    assert_problem(api.get(f"{API}/entities", {"as_of_time": stamp(before)}), 404)
    k = next(iter(history.states[0]))
    assert_problem(api.get(entity_url(k), {"as_of_time": stamp(before)}), 404)


def test_as_of_time_in_the_future_is_the_newest_state(staff, namespaces, api):
    history = build_history(staff, 5, changesets=10)
    future = history.changesets[-1].at + timedelta(days=365)
    rows, block = list_all(api, as_of_time=stamp(future))
    assert block == as_of_block(history.changesets[-1])
    assert_rows_match(rows, history.states[-1])


# --- visibility --------------------------------------------------------------------------------


def write_one(actor: Any, path: str, content: dict[str, Any] | None) -> Changeset:
    k = EntityKey(*path.split("/"))
    op = DeleteOp(k) if content is None else PutOp(k, content)
    result = changeset_apply(store=baseline, actor=actor, ops=[op], rpc=Rpc.BATCH_MUTATE)
    return result.changeset


def test_as_of_shows_only_readable_namespaces(staff, namespaces, make_user, client_for):
    user = make_user("rita", reader=["acme.orders"])
    mine = write_one(staff, "acme.orders/order/a1", {"v": 1})
    theirs = write_one(staff, "acme.billing/order/a1", {"v": 1})
    both = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[
            PutOp(EntityKey("acme.orders", "order", "a2"), {"v": 2}),
            PutOp(EntityKey("acme.billing", "order", "a2"), {"v": 2}),
        ],
        rpc=Rpc.BATCH_MUTATE,
    ).changeset
    client = client_for(user)

    rows, block = list_all(client, as_of=str(both.id))
    assert block == as_of_block(both)
    assert [row_key(r) for r in rows] == [
        EntityKey("acme.orders", "order", "a1"),
        EntityKey("acme.orders", "order", "a2"),
    ]
    rows, _ = list_all(client, as_of=str(mine.id), namespace="acme.billing")
    assert rows == []

    # A changeset that touched only an unreadable namespace: not found.
    assert_problem(client.get(f"{API}/entities", {"as_of": str(theirs.id)}), 404)
    assert_problem(
        client.get(f"{API}/entities/acme.orders/order/a1", {"as_of": str(theirs.id)}), 404
    )
    # An entity in an unreadable namespace, even at a visible changeset: not found.
    assert_problem(
        client.get(f"{API}/entities/acme.billing/order/a2", {"as_of": str(both.id)}), 404
    )
    # A user with no role anywhere sees no changeset at all.
    nobody = client_for(make_user("nobody"))
    assert_problem(nobody.get(f"{API}/entities", {"as_of": str(mine.id)}), 404)


def test_as_of_time_skips_changesets_the_caller_cannot_see(
    staff, namespaces, make_user, client_for
):
    user = make_user("rita", reader=["acme.orders"])
    mine = write_one(staff, "acme.orders/order/a1", {"v": 1})
    theirs = write_one(staff, "acme.billing/order/a1", {"v": 1})
    rows, block = list_all(client_for(user), as_of_time=stamp(theirs.at))
    assert block == as_of_block(mine)
    assert [row_key(r) for r in rows] == [EntityKey("acme.orders", "order", "a1")]


# --- errors ------------------------------------------------------------------------------------


@pytest.fixture
def one(staff, namespaces) -> Changeset:
    return write_one(staff, "acme.orders/order/a1", {"v": 1})


LIST = f"{API}/entities"
GET = f"{API}/entities/acme.orders/order/a1"


@pytest.mark.parametrize("url", [LIST, GET])
def test_both_params_is_422(api, one, url):
    response = api.get(url, {"as_of": str(one.id), "as_of_time": stamp(one.at)})
    assert_problem(response, 422)


@pytest.mark.parametrize("url", [LIST, GET])
@pytest.mark.parametrize("raw", ["nope", "123", "01a2", "5d0a8b4e-3f1c-4b7a-9e26-8c1d2f0a7b13x"])
def test_malformed_as_of_is_422(api, one, url, raw):
    assert_problem(api.get(url, {"as_of": raw}), 422, error_pointers=["/as_of"])


@pytest.mark.parametrize("url", [LIST, GET])
def test_unknown_as_of_is_404(api, one, url):
    assert_problem(api.get(url, {"as_of": str(uuid.uuid4())}), 404)


@pytest.mark.parametrize("url", [LIST, GET])
@pytest.mark.parametrize(
    "raw",
    [
        "yesterday",
        "2024-01-01",
        "2024-01-01T00:00:00",  # no offset
        "2024-13-01T00:00:00Z",
        "2024-01-01T25:00:00Z",
        "1700000000",
    ],
)
def test_bad_as_of_time_is_422(api, one, url, raw):
    assert_problem(api.get(url, {"as_of_time": raw}), 422, error_pointers=["/as_of_time"])


@pytest.mark.parametrize("url", [LIST, GET])
def test_branch_header_with_as_of_is_a_4xx_problem(api, one, url):
    response = api.get(url, {"as_of": str(one.id)}, HTTP_X_ATLAS_BRANCH="nope")
    assert response.status_code in (400, 404), response.content
    assert_problem(response, response.status_code)


class _BranchStore:
    """A stand-in overlay so the write service records a changeset on a branch."""

    branch = "feature"

    def get(self, key):
        return None

    def list(self, **kwargs):
        return []

    def lock(self, keys, **kwargs):
        return Locked({}, namespaces_of(k.namespace for k in keys))

    def write_sql(self, **kwargs):
        return NO_WRITES


@pytest.mark.parametrize("url", [LIST, GET])
def test_as_of_a_branch_changeset_is_400(api, staff, one, url):
    on_branch = changeset_apply(
        store=_BranchStore(),
        actor=staff,
        ops=[PutOp(EntityKey("acme.orders", "order", "a1"), {"v": "branch"})],
        rpc=Rpc.PUT_ENTITY,
    ).changeset
    assert on_branch.branch == "feature"
    assert_problem(api.get(url, {"as_of": str(on_branch.id)}), 400)


def test_absent_entity_as_of_is_404_and_present_later(api, staff, namespaces):
    first = write_one(staff, "acme.orders/order/a1", {"v": 1})
    write_one(staff, "acme.orders/order/a2", {"v": 1})
    deleted = write_one(staff, "acme.orders/order/a1", None)
    assert_problem(api.get(f"{API}/entities/acme.orders/order/a2", {"as_of": str(first.id)}), 404)
    assert_problem(api.get(GET, {"as_of": str(deleted.id)}), 404)
    assert api.get(GET, {"as_of": str(first.id)}).json()["content"] == {"v": 1}
    assert_problem(api.get(GET), 404)


def test_a_page_token_does_not_cross_as_of_points(api, staff, namespaces):
    history = build_history(staff, 9, changesets=30)
    first = api.get(LIST, {"as_of": str(history.changesets[-1].id), "page_size": 2}).json()
    token = first["next_page_token"]
    assert token
    other = str(history.changesets[-2].id)
    assert_problem(api.get(LIST, {"as_of": other, "page_size": 2, "page_token": token}), 400)
    assert_problem(api.get(LIST, {"page_size": 2, "page_token": token}), 400)


def test_as_of_response_block(api, staff, namespaces):
    cs = write_one(staff, "acme.orders/order/a1", {"v": 1})
    body = api.get(LIST, {"as_of": str(cs.id)}).json()
    assert set(body) == {"results", "next_page_token", "as_of"}
    assert set(body["as_of"]) == AS_OF_KEYS
    assert body["as_of"] == as_of_block(cs)
    live = api.get(LIST).json()
    assert "as_of" not in live
    assert "as_of" not in api.get(GET).json()


# --- cost ----------------------------------------------------------------------------------------


def test_as_of_page_costs_constant_queries_whatever_the_depth(
    staff, namespaces, client_for, django_assert_max_num_queries
):
    client = client_for(staff)
    keys = [EntityKey("acme.orders", "order", f"e{i:03d}") for i in range(30)]
    first = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(k, {"round": 0}) for k in keys],
        rpc=Rpc.BATCH_MUTATE,
    ).changeset
    params = {"as_of": str(first.id), "page_size": 10}
    client.get(LIST, params)  # warm caches (content types etc.)
    with CaptureQueriesContext(connection) as shallow:
        assert client.get(LIST, params).status_code == 200
    budget = len(shallow.captured_queries)

    middle = None
    for round_ in range(1, 121):
        chunk = keys[round_ % 3 :: 3]
        if round_ % 10 == 5:  # deletes and re-creates deepen the history too
            ops = [DeleteOp(k) for k in chunk[:3]]
        else:
            ops = [PutOp(k, {"round": round_}) for k in chunk]
        cs = changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE).changeset
        if round_ == 65:
            middle = cs
    last = Changeset.objects.order_by("-seq").first()

    for point in (first, middle, last):
        with django_assert_max_num_queries(budget):
            response = client.get(LIST, {"as_of": str(point.id), "page_size": 10})
        assert response.status_code == 200
        assert len(response.json()["results"]) == 10
        with django_assert_max_num_queries(budget):
            page2 = client.get(
                LIST,
                {
                    "as_of": str(point.id),
                    "page_size": 10,
                    "page_token": response.json()["next_page_token"],
                },
            )
        assert page2.status_code == 200
        with django_assert_max_num_queries(budget):
            assert client.get(entity_url(keys[0]), {"as_of": str(point.id)}).status_code == 200


def test_as_of_page_cost_grows_only_logarithmically_with_keys_deleted_before_it(
    staff, namespaces, client_for, django_assert_max_num_queries
):
    client = client_for(staff)
    dead = [EntityKey("acme.orders", "order", f"a{i:04d}") for i in range(400)]
    live = [EntityKey("acme.orders", "order", f"b{i:04d}") for i in range(20)]
    everything = changeset_apply(
        store=baseline,
        actor=staff,
        ops=[PutOp(k, {"x": 1}) for k in dead + live],
        rpc=Rpc.BATCH_MUTATE,
    ).changeset
    client.get(LIST, {"as_of": str(everything.id), "page_size": 10})
    with CaptureQueriesContext(connection) as all_live:
        client.get(LIST, {"as_of": str(everything.id), "page_size": 10})
    budget = len(all_live.captured_queries)

    deleted = changeset_apply(
        store=baseline, actor=staff, ops=[DeleteOp(k) for k in dead], rpc=Rpc.BATCH_MUTATE
    ).changeset
    # The key walk grows its batch fourfold each round (42, 168, 672 keys): 400
    # deleted keys cost two extra round trips, not one per batch of 42.
    with django_assert_max_num_queries(budget + 2):
        response = client.get(LIST, {"as_of": str(deleted.id), "page_size": 10})
    assert [r["slug"] for r in response.json()["results"]] == [k.slug for k in live[:10]]
