"""Item 13: nothing leaks across namespaces, and no token or cursor can be forged.

**The matrix.** A world of namespaces, each with a random tag that is part of
its name, of every slug in it and of every content value written there, is
read by users holding random roles (none, reader, writer, maintainer; direct,
through a group, as a global permission, or staff). Random checks then call
every read surface — entities (live, under a branch header, as-of a
changeset, as-of a time), one entity, history, changesets (list, one,
revisions, NDJSON export), the change feed, branches (list, one, diff) and
namespaces — as a random user, and assert

* **nothing unreadable in the body**: no tag of a namespace the user cannot
  read (its name, slugs, contents) and no id of a changeset the user cannot
  see, anywhere in the response (the ``instance`` member, which echoes the
  request, and values the request itself carried are not held against it);
* **exactly the readable part**: listings hold every readable item and only
  those; single reads answer 200 exactly when the user may read the thing and
  404 otherwise (never 403: not visible = not found).

``ATLAS_STRESS=1``: 5 worlds x 2,200 checks (11,000); CI: 1 world x 1,000.
The seed is printed (CI uses a fixed one); ``ATLAS_LEAK_SEED=<n>`` replays a run.

**Tokens and cursors.** Page tokens forged, bit-flipped, carried to another
user, another listing, other filters or another branch answer 400 (never a
page, never a 500); so do forged and bit-flipped feed cursors, and page tokens
and cursors swapped for each other. A branch header naming an invisible
branch answers the same 404 as one naming no branch, on every endpoint that
takes the header.
"""

from __future__ import annotations

import json
import os
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from atlas.api.render import rfc3339
from branches.services import branch_create, branch_merge
from branches.store import BranchStore
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PutOp
from changesets.selectors import feed
from changesets.services.apply import changeset_apply
from changesets.services.revert import changeset_revert
from entities.models import Namespace
from entities.services import role_grant
from entities.store import EntityKey, baseline
from tests.entities.factories import GroupFactory, SuperuserFactory, UserFactory

pytestmark = pytest.mark.usefixtures("no_network")
STRESS = os.environ.get("ATLAS_STRESS") == "1"
WORLDS = 5 if STRESS else 1
CHECKS_PER_WORLD = 2200 if STRESS else 1000
API = "/api/v1"
KIND = "doc"
ROLES = ["reader", "writer", "maintainer"]
BRANCH = "X-Atlas-Branch"

FIGURES: Counter[str] = Counter()


# --- the world -------------------------------------------------------------------------------


@dataclass
class Reader:
    user: Any
    client: APIClient
    readable: set[str]  # namespaces of this world the user can read
    how: str
    writable: set[str] = field(default_factory=set)  # by a direct grant of writer or more


@dataclass
class World:
    rng: random.Random
    namespaces: list[str]
    tags: dict[str, str]  # namespace -> its tag
    readers: list[Reader]
    keys: list[EntityKey] = field(default_factory=list)
    changesets: dict[str, tuple[set[str], str]] = field(default_factory=dict)  # id -> (ns, branch)
    branches: dict[str, tuple[int | None, set[str]]] = field(default_factory=dict)
    times: list[Any] = field(default_factory=list)

    def visible(self, changeset_id: str, reader: Reader) -> bool:
        if changeset_id not in self.changesets:
            # Another world's (a stress run builds several): only readers of everything
            # (staff, a global permission) can see it.
            return reader.how in ("staff", "global")
        return bool(self.changesets[changeset_id][0] & reader.readable)

    def branch_visible(self, name: str, reader: Reader) -> bool:
        """Its creator, readers of every namespace (staff, a global permission), and
        readers of a namespace it has written (docs/branches.md)."""
        creator, namespaces = self.branches[name]
        if reader.how in ("staff", "global"):
            return True
        return creator == reader.user.pk or bool(namespaces & reader.readable)


def _tag(rng: random.Random) -> str:
    return "t" + "".join(rng.choice("0123456789abcdefghijklmnopqrstuvwxyz") for _ in range(10))


def build_world(seed: int, client_for: Callable[[Any], APIClient]) -> World:
    rng = random.Random(seed)
    tags = [_tag(rng) for _ in range(5)]
    wid = "w" + _tag(rng)  # names users, groups and branches: no namespace's tag in them
    namespaces = [f"leak.{t}" for t in tags]
    for index, name in enumerate(namespaces):
        Namespace.objects.create(name=name, protected=index % 3 == 0)
    staff = SuperuserFactory(username=f"staff-{wid}")
    world = World(rng, namespaces, dict(zip(namespaces, tags, strict=True)), [])

    # Users with random roles: direct grants, a group, a global permission, staff, nobody.
    group = GroupFactory(name=f"group-{wid}")
    group_namespaces = set(rng.sample(namespaces, 2))
    for name in group_namespaces:
        role_grant(
            namespace=Namespace.objects.get(name=name), principal=group, role=rng.choice(ROLES)
        )
    for index in range(8):
        user = UserFactory(username=f"u{index}-{wid}")
        readable: set[str] = set()
        writable: set[str] = set()
        for name in namespaces:
            role = rng.choice([None, None, *ROLES])
            if role:
                role_grant(namespace=Namespace.objects.get(name=name), principal=user, role=role)
                readable.add(name)
                if role != "reader":
                    writable.add(name)
        how = "direct"
        if index % 4 == 1:
            user.groups.add(group)
            readable |= group_namespaces
            how = "direct+group"
        world.readers.append(Reader(user, client_for(user), readable, how, writable))
    global_reader = UserFactory(username=f"global-{wid}")
    global_reader.user_permissions.add(
        Permission.objects.get(content_type__app_label="entities", codename="read_namespace")
    )
    world.readers.append(
        Reader(global_reader, client_for(global_reader), set(namespaces), "global")
    )
    world.readers.append(Reader(staff, client_for(staff), set(namespaces), "staff"))
    nobody = UserFactory(username=f"nobody-{wid}")
    world.readers.append(Reader(nobody, client_for(nobody), set(), "none"))

    def land(result: Any) -> Any:
        changeset = result.changeset
        if changeset is not None:
            world.changesets[str(changeset.id)] = (set(changeset.namespaces), changeset.branch)
            world.times.append(changeset.at)
        return changeset

    def key(name: str, index: int) -> EntityKey:
        return EntityKey(name, KIND, f"{world.tags[name]}-e{index}")

    # Entities: created, updated, some deleted (their history outlives them).
    for name in namespaces:
        for index in range(3):
            k = key(name, index)
            world.keys.append(k)
            for version in range(1, 3):
                content = {"secret": f"{world.tags[name]}-v{version}", "n": version}
                land(
                    changeset_apply(
                        store=baseline, actor=staff, ops=[PutOp(k, content)], rpc=Rpc.PUT_ENTITY
                    )
                )
        land(
            changeset_apply(
                store=baseline, actor=staff, ops=[DeleteOp(key(name, 2))], rpc=Rpc.DELETE_ENTITY
            )
        )
    # Mixed changesets: one batch across two or three namespaces.
    for _ in range(4):
        chosen = rng.sample(namespaces, rng.choice([2, 3]))
        ops = [
            PutOp(key(n, 0), {"secret": f"{world.tags[n]}-mixed", "r": rng.random()})
            for n in chosen
        ]
        land(changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE))
    # A revert (a changeset of its own), of the last single-namespace write of namespace 1.
    target = (
        Changeset.objects.filter(namespaces=[namespaces[1]], branch="").order_by("-seq").first()
    )
    land(changeset_revert(store=baseline, actor=staff, changeset_id=str(target.id)).applied)
    # Branches: a user's branch written in one of its namespaces, then by staff in a random
    # one (so readers of either see it); one of them merged; one cut and never written.
    writers = [r for r in world.readers if r.writable]
    for index in range(4):
        creator = writers[index % len(writers)].user if writers else staff
        own = sorted(writers[index % len(writers)].writable) if writers else namespaces
        name = f"lb-{wid}-{index}"
        branch = branch_create(name=name, actor=creator)
        written: set[str] = set()
        if index < 3:
            for writer, n in ((creator, rng.choice(own)), (staff, rng.choice(namespaces))):
                land(
                    changeset_apply(
                        store=BranchStore(branch),
                        actor=writer,
                        ops=[PutOp(key(n, 1), {"secret": f"{world.tags[n]}-branch{index}"})],
                        rpc=Rpc.PUT_ENTITY,
                    )
                )
                written.add(n)
        world.branches[name] = (branch.created_by_id, written)
        if index == 2:
            land(branch_merge(branch=branch, actor=staff))
    return world


# --- checking a response ---------------------------------------------------------------------


def _body(response: Any) -> str:
    if response["Content-Type"].startswith("application/x-ndjson"):
        return b"".join(response.streaming_content).decode()
    text = response.content.decode()
    if response["Content-Type"] in ("application/json", "application/problem+json") and text:
        data = json.loads(text)
        if isinstance(data, dict):
            data.pop("instance", None)  # echoes the request
        return json.dumps(data)
    return text


def assert_nothing_unreadable(world: World, reader: Reader, request: str, text: str) -> None:
    """No tag of an unreadable namespace and no invisible changeset id in ``text``."""
    for name in world.namespaces:
        tag = world.tags[name]
        if name not in reader.readable and tag not in request:
            assert tag not in text, f"{reader.how} user sees {name}: {request} -> {text[:400]}"
    for changeset_id, (namespaces, _branch) in world.changesets.items():
        if not namespaces & reader.readable and changeset_id not in request:
            assert changeset_id not in text, (
                f"{reader.how} user sees changeset {changeset_id} of {namespaces}: {request}"
                f" -> {text[:400]}"
            )


def get(world: World, reader: Reader, path: str, params: dict | None = None, **headers: str) -> Any:
    response = reader.client.get(path, params or {}, headers=headers)
    request = path + "?" + json.dumps(params or {}) + json.dumps(headers)
    text = _body(response)
    assert response.status_code < 500, (request, text[:300])
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.status_code != 403, f"403 reveals existence: {request}"
    assert_nothing_unreadable(world, reader, request, text)
    FIGURES["checks"] += 1
    is_json = response["Content-Type"] in ("application/json", "application/problem+json")
    return response, (json.loads(text) if text and is_json else text)


def pages(
    world: World,
    reader: Reader,
    path: str,
    params: dict,
    results: str = "results",
    token: str = "page_token",
    nxt: str = "next_page_token",
    **headers: str,
) -> list[Any]:
    """Every page of a listing, each page checked."""
    items: list[Any] = []
    params = dict(params)
    for _ in range(20_000):  # a stress run's feed of five worlds, a changeset a page
        response, body = get(world, reader, path, params, **headers)
        assert response.status_code == 200, body
        items.extend(body[results])
        following = body.get(nxt)
        if not following or (token == "since" and not body[results]):
            return items
        params[token] = following
    raise AssertionError("listing did not end")


# --- the checks (each returns nothing; assertions inside) ------------------------------------


def check_entity_list(world: World, reader: Reader) -> None:
    size = world.rng.randint(1, 9)
    items = pages(world, reader, f"{API}/entities", {"page_size": size, "kind": KIND})
    got = {(e["namespace"], e["slug"]) for e in items if e["namespace"] in world.tags}
    live = {(k.namespace, k.slug) for k in world.keys if baseline.get(k) is not None}
    assert got == {x for x in live if x[0] in reader.readable}


def check_entity_get(world: World, reader: Reader) -> None:
    k = world.rng.choice(world.keys)
    response, _ = get(world, reader, f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}")
    exists = baseline.get(k) is not None
    assert response.status_code == (200 if exists and k.namespace in reader.readable else 404)


def check_history(world: World, reader: Reader) -> None:
    k = world.rng.choice(world.keys)
    path = f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}/history"
    if k.namespace not in reader.readable:
        response, _ = get(world, reader, path)
        assert response.status_code == 404
        return
    rows = pages(world, reader, path, {"page_size": world.rng.randint(1, 4)})
    assert rows and all(r["namespace"] == k.namespace for r in rows)


def check_changeset_list(world: World, reader: Reader) -> None:
    params: dict[str, Any] = {"page_size": world.rng.randint(1, 25)}
    if world.rng.random() < 0.3:
        params["namespace"] = world.rng.choice(world.namespaces)
    items = pages(world, reader, f"{API}/changesets", params)
    got = {c["id"] for c in items if c["id"] in world.changesets}
    # Filtering on a namespace the user cannot read finds nothing: it must not reveal
    # which visible changesets also touched it.
    wanted = {
        i
        for i, (ns, _b) in world.changesets.items()
        if ns & reader.readable
        and ("namespace" not in params or params["namespace"] in ns & reader.readable)
    }
    assert got == wanted
    for changeset in items:
        assert {op["namespace"] for op in changeset["ops"]} <= reader.readable | _foreign(world)


def _foreign(world: World) -> set[str]:
    """Namespaces outside this world (other worlds of a stress run): not checked here."""
    return set(Namespace.objects.exclude(name__in=world.namespaces).values_list("name", flat=True))


def check_changeset_get(world: World, reader: Reader) -> None:
    changeset_id = world.rng.choice(list(world.changesets))
    suffix = world.rng.choice(["", "/revisions", "/export"])
    response, body = get(world, reader, f"{API}/changesets/{changeset_id}{suffix}")
    if not world.visible(changeset_id, reader):
        assert response.status_code == 404
        return
    assert response.status_code == 200
    if suffix == "":
        namespaces = {op["namespace"] for op in body["ops"]}
    elif suffix == "/revisions":
        namespaces = {r["namespace"] for r in body["results"]}
    else:
        namespaces = {json.loads(line)["namespace"] for line in body.splitlines()[1:]}
    assert namespaces and namespaces <= reader.readable


def check_feed(world: World, reader: Reader) -> None:
    params: dict[str, Any] = {"limit": world.rng.randint(1, 30)}
    if world.rng.random() < 0.3:
        params["namespace"] = world.rng.sample(world.namespaces, 2)
    records = pages(world, reader, f"{API}/changes", params, "records", "since", "next_cursor")
    got = {r["event_id"] for r in records if r["namespace"] in world.tags}
    allowed = reader.readable & set(params.get("namespace", world.namespaces))
    wanted = {
        f"{r.changeset_id}:{r.namespace}/{r.kind}/{r.slug}"
        for r in Revision.objects.filter(branch="", namespace__in=allowed)
    }
    assert got == wanted


def check_branch_list(world: World, reader: Reader) -> None:
    items = pages(world, reader, f"{API}/branches", {"page_size": world.rng.randint(1, 3)})
    got = {b["name"] for b in items if b["name"] in world.branches}
    assert got == {n for n in world.branches if world.branch_visible(n, reader)}
    for branch in items:
        assert set(branch["namespaces"]) <= reader.readable | _foreign(world)


def check_branch_get(world: World, reader: Reader) -> None:
    name = world.rng.choice(list(world.branches))
    suffix = world.rng.choice(["", "/diff"])
    response, body = get(world, reader, f"{API}/branches/{name}{suffix}")
    if not world.branch_visible(name, reader):
        assert response.status_code == 404
        return
    assert response.status_code == 200
    namespaces = (
        set(body["namespaces"]) if suffix == "" else {c["namespace"] for c in body["changes"]}
    )
    assert namespaces <= reader.readable


def check_branch_reads(world: World, reader: Reader) -> None:
    """Entity list and single reads under a branch header."""
    name = world.rng.choice(list(world.branches))
    if world.rng.random() < 0.5:
        response, _ = get(world, reader, f"{API}/entities", {"kind": KIND}, **{BRANCH: name})
    else:
        k = world.rng.choice(world.keys)
        response, _ = get(
            world, reader, f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}", **{BRANCH: name}
        )
        if world.branch_visible(name, reader) and k.namespace not in reader.readable:
            assert response.status_code == 404
            return
    if not world.branch_visible(name, reader):
        assert response.status_code == 404
        assert response.json()["pointer"] == f"/headers/{BRANCH}"


def check_as_of(world: World, reader: Reader) -> None:
    changeset_id = world.rng.choice(list(world.changesets))
    visible = world.visible(changeset_id, reader)
    on_branch = world.changesets[changeset_id][1] != ""
    if world.rng.random() < 0.5:
        response, body = get(
            world, reader, f"{API}/entities", {"as_of": changeset_id, "page_size": 500}
        )
        if response.status_code == 200:
            assert {e["namespace"] for e in body["results"]} <= reader.readable | _foreign(world)
    else:
        k = world.rng.choice(world.keys)
        response, _ = get(
            world,
            reader,
            f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}",
            {"as_of": changeset_id},
        )
        if visible and not on_branch and k.namespace not in reader.readable:
            assert response.status_code == 404
    if not visible:
        assert response.status_code == 404
    elif on_branch:
        assert response.status_code == 400
    else:
        assert response.status_code in (200, 404)


def check_as_of_time(world: World, reader: Reader) -> None:
    at = world.rng.choice(world.times) + timedelta(microseconds=world.rng.choice([0, 1, -1]))
    response, body = get(world, reader, f"{API}/entities", {"as_of_time": rfc3339(at)})
    if response.status_code == 200:
        assert world.visible(body["as_of"]["changeset_id"], reader)
    else:
        assert response.status_code == 404


def check_namespaces(world: World, reader: Reader) -> None:
    if world.rng.random() < 0.5:
        items = pages(world, reader, f"{API}/namespaces", {"page_size": world.rng.randint(1, 4)})
        assert {n["name"] for n in items} & set(world.namespaces) == reader.readable
    else:
        name = world.rng.choice(world.namespaces)
        response, _ = get(world, reader, f"{API}/namespaces/{name}")
        assert response.status_code == (200 if name in reader.readable else 404)


CHECKS: list[Callable[[World, Reader], None]] = [
    check_entity_list,
    check_entity_get,
    check_history,
    check_changeset_list,
    check_changeset_get,
    check_feed,
    check_branch_list,
    check_branch_get,
    check_branch_reads,
    check_as_of,
    check_as_of_time,
    check_namespaces,
]


def test_permission_matrix_never_leaks(db, client_for):
    # CI replays one seed; full runs draw a new one (printed, replay with ATLAS_LEAK_SEED).
    fresh = random.SystemRandom().randrange(2**32) if STRESS else 20261129
    seed = int(os.environ.get("ATLAS_LEAK_SEED") or fresh)
    FIGURES.clear()
    kinds: Counter[str] = Counter()
    for world_index in range(WORLDS):
        world = build_world(seed + world_index, client_for)
        start = FIGURES["checks"]
        while FIGURES["checks"] - start < CHECKS_PER_WORLD:
            check = world.rng.choice(CHECKS)
            reader = world.rng.choice(world.readers)
            check(world, reader)
            kinds[check.__name__] += 1
            kinds[f"as:{reader.how}"] += 1
    print(
        f"\nleak matrix: seed {seed}, {WORLDS} world(s), {FIGURES['checks']} responses checked,"
        f" {sum(v for k, v in kinds.items() if k.startswith('check_'))} scenarios: {dict(kinds)}"
    )
    assert FIGURES["checks"] >= WORLDS * CHECKS_PER_WORLD


# --- tokens, cursors and branch headers ------------------------------------------------------


@pytest.fixture
def small(db, client_for, request):
    world = build_world(random.SystemRandom().randrange(2**32) if STRESS else 7, client_for)
    staff = next(r for r in world.readers if r.how == "staff")
    other = next(r for r in world.readers if r.how == "global")
    before = FIGURES["token_checks"] + FIGURES["header_checks"]
    yield world, staff, other
    done = FIGURES["token_checks"] + FIGURES["header_checks"] - before
    print(f"\n{request.node.name}: {done} refused tokens, cursors or headers checked")


def _token(reader: Reader, path: str, params: dict, name: str = "next_page_token", **h: str) -> str:
    body = reader.client.get(path, params, headers=h).json()
    assert body[name], body
    return body[name]


def _flips(token: str, rng: random.Random, count: int) -> list[str]:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_:."
    out = []
    for _ in range(count):
        i = rng.randrange(len(token))
        c = rng.choice([a for a in alphabet if a != token[i]])
        out.append(token[:i] + c + token[i + 1 :])
    out += [token[:-1], token + "A", token[1:], token.swapcase()]
    return [t for t in out if t != token]


LISTINGS = {
    "entities": (f"{API}/entities", {"page_size": 1}),
    "changesets": (f"{API}/changesets", {"page_size": 1}),
    "branches": (f"{API}/branches", {"page_size": 1}),
    "namespaces": (f"{API}/namespaces", {"page_size": 1}),
}


def _is_400(response: Any, pointer: str) -> None:
    assert response.status_code == 400, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["pointer"] == pointer
    FIGURES["token_checks"] += 1


def test_forged_and_bit_flipped_page_tokens_are_400(small):
    world, staff, _ = small
    rng = world.rng
    flips = 60 if STRESS else 15
    for path, params in LISTINGS.values():
        token = _token(staff, path, params)
        for bad in [*_flips(token, rng, flips), "x", "e30:abc", uuid.uuid4().hex, "..", " ", ""]:
            response = staff.client.get(path, {**params, "page_token": bad})
            if bad == "":
                assert response.status_code == 200  # an empty token is no token
                continue
            _is_400(response, "/page_token")
        k = world.keys[0]
        history = f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}/history"
        token = _token(staff, history, {"page_size": 1})
        for bad in _flips(token, rng, flips):
            _is_400(staff.client.get(history, {"page_size": 1, "page_token": bad}), "/page_token")


def test_page_tokens_are_bound_to_user_listing_filters_and_branch(small):
    world, staff, other = small
    k0, k1 = world.keys[0], world.keys[1]
    history0 = f"{API}/entities/{k0.namespace}/{k0.kind}/{k0.slug}/history"
    history1 = f"{API}/entities/{k1.namespace}/{k1.kind}/{k1.slug}/history"
    tokens = {name: _token(staff, path, params) for name, (path, params) in LISTINGS.items()}
    tokens["history"] = _token(staff, history0, {"page_size": 1})
    # Another user (who reads everything too): 400, not a page.
    for name, (path, params) in LISTINGS.items():
        _is_400(other.client.get(path, {**params, "page_token": tokens[name]}), "/page_token")
    _is_400(
        other.client.get(history0, {"page_size": 1, "page_token": tokens["history"]}), "/page_token"
    )
    # Another listing: every token on every other listing.
    targets = {**LISTINGS, "history": (history0, {"page_size": 1})}
    for source, token in tokens.items():
        for target, (path, params) in targets.items():
            if source != target:
                _is_400(staff.client.get(path, {**params, "page_token": token}), "/page_token")
    # Another entity's history.
    _is_400(
        staff.client.get(history1, {"page_size": 1, "page_token": tokens["history"]}), "/page_token"
    )
    # Other filters on the same listing.
    changesets = f"{API}/changesets"
    filtered = _token(staff, changesets, {"page_size": 1, "namespace": world.namespaces[0]})
    _is_400(staff.client.get(changesets, {"page_size": 1, "page_token": filtered}), "/page_token")
    _is_400(
        staff.client.get(
            changesets, {"page_size": 1, "namespace": world.namespaces[1], "page_token": filtered}
        ),
        "/page_token",
    )
    entities = f"{API}/entities"
    by_kind = _token(staff, entities, {"page_size": 1, "kind": KIND})
    _is_400(staff.client.get(entities, {"page_size": 1, "page_token": by_kind}), "/page_token")
    # Another branch: a baseline listing's token under a branch header, and across branches.
    branches = [n for n in world.branches]
    on_a = _token(staff, entities, {"page_size": 1}, **{BRANCH: branches[0]})
    _is_400(staff.client.get(entities, {"page_size": 1, "page_token": on_a}), "/page_token")
    _is_400(
        staff.client.get(
            entities, {"page_size": 1, "page_token": on_a}, headers={BRANCH: branches[1]}
        ),
        "/page_token",
    )
    _is_400(
        staff.client.get(
            entities,
            {"page_size": 1, "page_token": tokens["entities"]},
            headers={BRANCH: branches[0]},
        ),
        "/page_token",
    )
    # A branch listing's token with another status filter.
    open_token = _token(staff, f"{API}/branches", {"page_size": 1, "status": "open"})
    _is_400(
        staff.client.get(f"{API}/branches", {"page_size": 1, "page_token": open_token}),
        "/page_token",
    )
    # An as-of listing's token at another changeset.
    pinned = [i for i, (_ns, b) in world.changesets.items() if b == ""][-1]
    as_of = _token(staff, entities, {"page_size": 1, "as_of": pinned})
    _is_400(staff.client.get(entities, {"page_size": 1, "page_token": as_of}), "/page_token")


def test_forged_and_bit_flipped_feed_cursors_are_400(small, client_for):
    world, staff, other = small
    rng = world.rng
    cursor = _token(staff, f"{API}/changes", {"limit": 2}, name="next_cursor")
    flips = 60 if STRESS else 20
    forged = [*_flips(cursor, rng, flips), "x", "0", "e30", feed.cursor_encode(1) + "x"]
    # A signed cursor for a negative position, and a page token, are not cursors either.
    forged.append(feed._signer.sign_object({"s": -1}))
    forged.append(feed._signer.sign_object({"s": "1"}))
    forged.append(_token(staff, f"{API}/changesets", {"page_size": 1}))
    for bad in forged:
        _is_400(staff.client.get(f"{API}/changes", {"since": bad}), "/since")
    # A feed cursor is not a page token.
    for path, params in LISTINGS.values():
        _is_400(staff.client.get(path, {**params, "page_token": cursor}), "/page_token")
    # A subscription's cursor takes the same checks (subscriptions are superuser-only).
    root = client_for(SuperuserFactory(username="leak-root"))
    sub = root.post(
        f"{API}/subscriptions", {"name": "s", "url": "http://hooks.test/"}, format="json"
    ).json()
    for bad in forged[:10]:
        response = root.patch(f"{API}/subscriptions/{sub['id']}", {"cursor": bad}, format="json")
        _is_400(response, "/cursor")


def test_a_feed_cursor_carried_to_another_user_reveals_only_a_position(small):
    """Feed cursors are positions in the one log (docs/feed.md), not bound to a user: carried
    to a reader of fewer namespaces, they resume there and show only what that reader reads."""
    world, staff, _ = small
    cursor = _token(staff, f"{API}/changes", {"limit": 3}, name="next_cursor")
    seq = feed.cursor_decode(cursor)
    for reader in world.readers:
        response, body = get(world, reader, f"{API}/changes", {"since": cursor})
        assert response.status_code == 200
        assert all(r["seq"] > seq and r["namespace"] in reader.readable for r in body["records"])


HEADER_ENDPOINTS: dict[str, Callable[[APIClient, EntityKey, str, dict], Any]] = {
    "list": lambda c, k, cs, h: c.get(f"{API}/entities", headers=h),
    "get": lambda c, k, cs, h: c.get(f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}", headers=h),
    "history": lambda c, k, cs, h: c.get(
        f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}/history", headers=h
    ),
    "put": lambda c, k, cs, h: c.put(
        f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}", {"content": {}}, format="json", headers=h
    ),
    "patch": lambda c, k, cs, h: c.patch(
        f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}", {"patch": {}}, format="json", headers=h
    ),
    "delete": lambda c, k, cs, h: c.delete(
        f"{API}/entities/{k.namespace}/{k.kind}/{k.slug}", headers=h
    ),
    "batch": lambda c, k, cs, h: c.post(
        f"{API}/batch",
        {"ops": [{"op": "delete", "namespace": k.namespace, "kind": k.kind, "slug": k.slug}]},
        format="json",
        headers=h,
    ),
    "delete_by_query": lambda c, k, cs, h: c.post(
        f"{API}/delete-by-query", {"namespace": k.namespace}, format="json", headers=h
    ),
    "revert": lambda c, k, cs, h: c.post(
        f"{API}/changesets/{cs}/revert", {}, format="json", headers=h
    ),
}


def test_a_branch_header_naming_an_invisible_branch_is_404_like_a_missing_one(small):
    world, staff, _ = small
    changesets_before = Changeset.objects.count()
    for name in world.branches:
        for reader in world.readers:
            if world.branch_visible(name, reader) or not reader.readable:
                continue
            namespace = world.rng.choice(sorted(reader.readable))
            k = next(k for k in world.keys if k.namespace == namespace)
            cs = next(i for i, (ns, b) in world.changesets.items() if namespace in ns and not b)
            for endpoint, call in HEADER_ENDPOINTS.items():
                hidden = call(reader.client, k, cs, {BRANCH: name})
                missing_name = f"no-such-{uuid.uuid4().hex[:8]}"
                missing = call(reader.client, k, cs, {BRANCH: missing_name})
                for response in (hidden, missing):
                    assert response.status_code == 404, (endpoint, response.content[:200])
                    assert response.json()["pointer"] == f"/headers/{BRANCH}"
                    FIGURES["header_checks"] += 1
                # The same answer, but for the name each one asked about.
                a, b = hidden.json(), missing.json()
                a["instance"] = b["instance"] = None
                a["detail"] = a["detail"].replace(name, "?")
                b["detail"] = b["detail"].replace(missing_name, "?")
                assert a == b
    assert Changeset.objects.count() == changesets_before
    assert FIGURES["header_checks"] > 0


def test_invisible_changeset_ids_stay_out_of_the_watermark_and_branches(
    db, make_user, client_for, write, staff
):
    """Found by the matrix: the feed watermark and a branch's fork named changesets the
    reader cannot see. Positions (seq, at) stay; the ids are null for such readers."""
    Namespace.objects.create(name="acme.a")
    Namespace.objects.create(name="acme.b")
    write(staff, "acme.a/doc/x", {"n": 1})
    hidden = write(staff, "acme.b/doc/y", {"secret": 1}).changeset
    alice = make_user("alice", writer=["acme.a"])
    reader, admin = client_for(alice), client_for(staff)

    mark = reader.get(f"{API}/changes").json()["watermark"]
    assert (mark["seq"], mark["changeset_id"]) == (hidden.seq, None)
    assert admin.get(f"{API}/changes").json()["watermark"]["changeset_id"] == str(hidden.id)

    created = reader.post(f"{API}/branches", {"name": "mine"}, format="json").json()
    assert (created["fork_seq"], created["fork_changeset_id"]) == (hidden.seq, None)
    for body in (
        reader.get(f"{API}/branches/mine").json(),
        reader.get(f"{API}/branches").json()["results"][0],
    ):
        assert (body["fork_seq"], body["fork_changeset_id"]) == (hidden.seq, None)
    assert admin.get(f"{API}/branches/mine").json()["fork_changeset_id"] == str(hidden.id)
    assert str(hidden.id) not in json.dumps(reader.get(f"{API}/branches/mine/diff").json())
