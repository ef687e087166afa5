"""Item 12: nobody can write as someone else (DESIGN invariant 5).

The author of every write is the authenticated principal. Hypothesis fuzzes
every mutating endpoint with would-be author claims:

* body fields (``author``, ``user``, ``author_name``, ``created_by``, ...):
  endpoints that read a body refuse them as unknown fields (422) and write
  nothing; an NDJSON file's envelope ``author`` is the exporter's name, and
  importing it still records the importer;
* headers (``X-User``, ``X-Atlas-Author`` with the development setting off,
  ``X-Forwarded-User``, ``Remote-User`` and a list of other proxy/identity
  headers) and the WSGI ``REMOTE_USER`` variable: ignored. The request does
  exactly what it does without them, as the token's user.

After every request: any changeset, branch or subscription written names the
token's user (``author``/``author_name``, ``created_by``), nothing names the
claimed one, and a claim to a staff name never unlocks a staff-only endpoint.

Commands and tasks write as the documented system principal
(``changesets.principals.SYSTEM_USERNAME``): ``import_changesets`` without
``--user`` authors as ``atlas-system`` whatever the file's envelope says; the
journal task, the sweeps and ``recover_batches`` write no changeset at all.

``ATLAS_STRESS=1``: 100 examples per endpoint; CI: 8.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from branches.models import Branch
from branches.services import branch_create
from branches.store import BranchStore
from changesets import tasks
from changesets.models import Changeset, Rpc, Subscription
from changesets.ops import PutOp
from changesets.outbox import journal, pumps
from changesets.outbox.subscriptions import subscription_create
from changesets.principals import SYSTEM_USERNAME, system_user
from changesets.services.apply import changeset_apply
from entities.models import Namespace
from entities.services import role_grant
from entities.store import EntityKey
from tests.entities.factories import NamespaceFactory, SuperuserFactory, UserFactory

pytestmark = pytest.mark.usefixtures("no_network")
STRESS = os.environ.get("ATLAS_STRESS") == "1"
EXAMPLES = 100 if STRESS else 8
FIGURES: Counter[str] = Counter()

API = "/api/v1"
NS = "acme.orders"

# Names a spoofer would like to borrow: staff, the system principal, a writer, and junk.
CLAIMED_NAMES = ["root", SYSTEM_USERNAME, "mallory", "admin", "wendy", "demo"]
BODY_FIELDS = [
    "author",
    "user",
    "author_name",
    "created_by",
    "created_by_name",
    "actor",
    "principal",
    "username",
    "on_behalf_of",
    "owner",
]
# Identity headers proxies, SSO gateways and other APIs use, plus Atlas's own dev header.
SPOOF_HEADERS = [
    "X-User",
    "X-Atlas-Author",
    "X-Forwarded-User",
    "Remote-User",
    "X-Remote-User",
    "X-Auth-User",
    "X-Authenticated-User",
    "X-Auth-Request-User",
    "X-Forwarded-Preferred-Username",
    "X-Forwarded-Email",
    "X-Webauth-User",
    "X-Proxy-User",
    "X-Author",
    "Author",
    "From",
    "X-On-Behalf-Of",
    "Impersonate-User",
    "X-Impersonate-User",
    "X-Actor",
    "X-Principal",
    "X-Username",
    "X-Changeset-Author",
]

names = st.one_of(
    st.sampled_from(CLAIMED_NAMES),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20),
)
# A claim: ("body", field, value) — one unknown field, refused — or ("headers", {name:
# value}, remote_user): every identity header at once, each naming someone, plus the WSGI
# REMOTE_USER variable a front server would set.
claims = st.one_of(
    st.tuples(st.just("body"), st.sampled_from(BODY_FIELDS), names),
    st.tuples(
        st.just("headers"),
        st.fixed_dictionaries({header: names for header in SPOOF_HEADERS}),
        names,
    ),
)


@dataclass
class World:
    staff: Any
    writer: Any
    clients: dict[str, APIClient]


@dataclass
class Call:
    """One mutating endpoint: how to call it, and what a clean call answers."""

    method: str
    path: Callable[[Any, dict[str, Any]], str]
    body: Callable[[Any, dict[str, Any]], Any]  # None: no body
    ok: int | tuple[int, ...]
    staff_only: bool = False
    on_branch: bool = False  # sends X-Atlas-Branch: the prepared branch
    reads_body: bool = True
    prepare: Callable[[World, Any], dict[str, Any]] | None = None
    content_type: str = "application/json"


def _entity(world: World, actor: Any) -> dict[str, Any]:
    slug = f"e-{uuid.uuid4().hex[:12]}"
    result = changeset_apply(
        store=_baseline(),
        actor=world.staff,
        ops=[PutOp(EntityKey(NS, "event", slug), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    )
    return {"slug": slug, "changeset_id": str(result.changeset.id)}


def _baseline() -> Any:
    from entities.store import baseline

    return baseline


def _branch(world: World, actor: Any) -> dict[str, Any]:
    name = f"b-{uuid.uuid4().hex[:12]}"
    branch = branch_create(name=name, actor=actor)
    changeset_apply(
        store=BranchStore(branch),
        actor=actor,
        ops=[PutOp(EntityKey(NS, "event", f"{name}-x"), {"n": 1})],
        rpc=Rpc.PUT_ENTITY,
    )
    return {"name": name, "slug": f"{name}-x"}


def _subscription(world: World, actor: Any) -> dict[str, Any]:
    subscription = subscription_create(actor=world.staff, name="s", url="http://hooks.test/")
    return {"id": str(subscription.id)}


def _export(world: World, actor: Any) -> dict[str, Any]:
    """An exported file of a changeset by staff, to import into a fresh key."""
    slug = f"i-{uuid.uuid4().hex[:12]}"
    envelope = {
        "schema_version": 1,
        "changeset_id": str(uuid.uuid4()),
        "author": "root",  # the exporter; an import must never record it
        "at": "2026-01-01T00:00:00.000Z",
        "rpc": "PutEntity",
        "branch": "",
        "comment": "",
    }
    line = {"op": "create", "namespace": NS, "kind": "event", "slug": slug}
    return {"envelope": envelope, "op": {**line, "before": None, "after": {"n": 1}}}


def _ndjson(state: dict[str, Any], extra: dict[str, Any]) -> bytes:
    envelope = {**state["envelope"], **extra}
    return (json.dumps(envelope) + "\n" + json.dumps(state["op"]) + "\n").encode()


def _op(slug: str) -> dict[str, Any]:
    return {"op": "put", "namespace": NS, "kind": "event", "slug": slug, "content": {"n": 2}}


CALLS: dict[str, Call] = {
    "put": Call(
        "put",
        lambda w, s: f"{API}/entities/{NS}/event/{s['slug']}",
        lambda w, s: {"content": {"n": 2}},
        200,
        prepare=_entity,
    ),
    "put_on_branch": Call(
        "put",
        lambda w, s: f"{API}/entities/{NS}/event/{s['slug']}",
        lambda w, s: {"content": {"n": 3}},
        200,
        prepare=_branch,
        on_branch=True,
    ),
    "patch": Call(
        "patch",
        lambda w, s: f"{API}/entities/{NS}/event/{s['slug']}",
        lambda w, s: {"patch": {"m": 1}},
        200,
        prepare=_entity,
    ),
    "delete": Call(
        "delete",
        lambda w, s: f"{API}/entities/{NS}/event/{s['slug']}",
        lambda w, s: {"comment": "bye"},
        200,
        prepare=_entity,
    ),
    "batch": Call(
        "post",
        lambda w, s: f"{API}/batch",
        lambda w, s: {"ops": [_op(s["slug"])]},
        200,
        prepare=_entity,
    ),
    "delete_by_query": Call(
        "post",
        lambda w, s: f"{API}/delete-by-query",
        lambda w, s: {"namespace": NS, "slug_prefix": s["slug"]},
        200,
        prepare=_entity,
    ),
    "revert": Call(
        "post",
        lambda w, s: f"{API}/changesets/{s['changeset_id']}/revert",
        lambda w, s: {"comment": "undo"},
        200,
        prepare=_entity,
    ),
    "import": Call(
        "post",
        lambda w, s: f"{API}/changesets/import",
        lambda w, s: None,  # built from the claim below
        200,
        prepare=_export,
        content_type="application/x-ndjson",
    ),
    "branch_create": Call(
        "post",
        lambda w, s: f"{API}/branches",
        lambda w, s: {"name": s["name"]},
        201,
        prepare=lambda w, a: {"name": f"c-{uuid.uuid4().hex[:12]}"},
    ),
    "branch_merge": Call(
        "post",
        lambda w, s: f"{API}/branches/{s['name']}/merge",
        lambda w, s: {"comment": "land"},
        200,
        prepare=_branch,
    ),
    "branch_abandon": Call(
        "delete",
        lambda w, s: f"{API}/branches/{s['name']}",
        lambda w, s: None,
        200,
        reads_body=False,
        prepare=_branch,
    ),
    "namespace_create": Call(
        "post",
        lambda w, s: f"{API}/namespaces",
        lambda w, s: {"name": f"spoof.n{uuid.uuid4().hex[:10]}"},
        201,
        staff_only=True,
    ),
    "namespace_update": Call(
        "patch",
        lambda w, s: f"{API}/namespaces/{NS}",
        lambda w, s: {"protected": False},
        200,
        staff_only=True,
    ),
    "grant": Call(
        "put",
        lambda w, s: f"{API}/namespaces/{NS}/grants/user/gina",
        lambda w, s: {"role": "reader"},
        (200, 201),  # 201 for a new grant, 200 when it replaces one
        staff_only=True,
    ),
    "revoke": Call(
        "delete",
        lambda w, s: f"{API}/namespaces/{NS}/grants/user/gina",
        lambda w, s: None,
        204,
        staff_only=True,
        reads_body=False,
    ),
    "subscription_create": Call(
        "post",
        lambda w, s: f"{API}/subscriptions",
        lambda w, s: {"name": "hook", "url": "http://hooks.test/in"},
        201,
        staff_only=True,
    ),
    "subscription_update": Call(
        "patch",
        lambda w, s: f"{API}/subscriptions/{s['id']}",
        lambda w, s: {"active": False},
        200,
        staff_only=True,
        prepare=_subscription,
    ),
    "subscription_delete": Call(
        "delete",
        lambda w, s: f"{API}/subscriptions/{s['id']}",
        lambda w, s: None,
        204,
        staff_only=True,
        reads_body=False,
        prepare=_subscription,
    ),
}


@pytest.fixture
def world(db, client_for):
    staff = SuperuserFactory(username="root-real")
    writer = UserFactory(username="wendy-real")
    NamespaceFactory(name=NS)
    role_grant(namespace=Namespace.objects.get(name=NS), principal=writer, role="writer")
    UserFactory(username="gina")
    # Real users whose names a spoofer claims (staff "root", a writer "mallory").
    SuperuserFactory(username="root")
    mallory = UserFactory(username="mallory")
    role_grant(namespace=Namespace.objects.get(name=NS), principal=mallory, role="writer")
    return World(
        staff=staff,
        writer=writer,
        clients={"staff": client_for(staff), "writer": client_for(writer)},
    )


def _snapshot() -> dict[str, Any]:
    return {
        "changesets": set(Changeset.objects.values_list("id", flat=True)),
        "branches": set(Branch.objects.values_list("id", flat=True)),
        "subscriptions": set(Subscription.objects.values_list("id", flat=True)),
    }


def _send(world: World, who: str, call: Call, state: dict[str, Any], claim: tuple) -> Any:
    where, name, value = claim
    client = world.clients[who]
    headers: dict[str, str] = {}
    extra: dict[str, str] = {}
    body = call.body(world, state)
    if where == "headers":
        headers.update(name)
        extra["REMOTE_USER"] = value
    if call.content_type == "application/x-ndjson":
        data: Any = _ndjson(state, {name: value} if where == "body" else {})
    elif where == "body":
        data = json.dumps({**(body or {}), name: value})
    else:
        data = json.dumps(body) if body is not None else None
    if call.on_branch:
        headers["X-Atlas-Branch"] = state["name"]
    kwargs: dict[str, Any] = {"headers": headers, **extra}
    if data is not None:
        kwargs.update(data=data, content_type=call.content_type)
    return getattr(client, call.method)(call.path(world, state), **kwargs)


def _expected_status(call: Call, who: str, claim: tuple) -> tuple[int, ...]:
    where, name, _ = claim
    ok = call.ok if isinstance(call.ok, tuple) else (call.ok,)
    if call.staff_only and who != "staff":
        return (403,)  # a claimed staff name never unlocks a staff-only endpoint
    if where == "body" and call.reads_body:
        if call.content_type == "application/x-ndjson":
            # The envelope's author is the exporter's name: allowed, and not recorded.
            return ok if name == "author" else (400,)
        return (422,)  # an unknown field
    return ok


@pytest.mark.parametrize("endpoint", list(CALLS))
def test_author_claims_never_change_the_stored_author(endpoint, world):
    call = CALLS[endpoint]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
        derandomize=not STRESS,  # CI: the same examples every run; full runs: new ones
    )
    @given(claim=claims, who=st.sampled_from(["staff", "writer"]))
    def check(claim: tuple, who: str) -> None:
        actor = world.staff if who == "staff" else world.writer
        state = call.prepare(world, actor) if call.prepare else {}
        before = _snapshot()
        response = _send(world, who, call, state, claim)
        FIGURES[f"{endpoint}:{claim[0]}:{response.status_code}"] += 1
        expected = _expected_status(call, who, claim)
        assert response.status_code in expected, (claim, who, response.content[:300])
        after = _snapshot()
        new_changesets = Changeset.objects.filter(id__in=after["changesets"] - before["changesets"])
        new_branches = Branch.objects.filter(id__in=after["branches"] - before["branches"])
        new_subs = Subscription.objects.filter(
            id__in=after["subscriptions"] - before["subscriptions"]
        )
        if response.status_code >= 400:
            assert not new_changesets and not new_branches and not new_subs, claim
            return
        for changeset in new_changesets:
            assert (changeset.author_id, changeset.author_name) == (actor.pk, actor.username)
        for branch in new_branches:
            assert (branch.created_by_id, branch.created_by_name) == (actor.pk, actor.username)
        for subscription in new_subs:
            assert subscription.created_by_id == actor.pk
        if response.status_code != 204 and response.content:
            body = response.json()
            author = (body.get("changeset") or {}).get("author") if isinstance(body, dict) else None
            if author is not None:
                assert author == actor.username
        if endpoint in (
            "put",
            "put_on_branch",
            "patch",
            "delete",
            "batch",
            "delete_by_query",
            "revert",
            "import",
            "branch_merge",
        ):
            assert len(new_changesets) == 1, (endpoint, claim)

    check()
    # Nothing anywhere was ever written in a claimed name by these requests.
    spoofed = Changeset.objects.exclude(author_name__in=["root-real", "wendy-real"])
    assert not spoofed.exists(), list(spoofed.values_list("author_name", flat=True)[:5])
    mine = {k: v for k, v in FIGURES.items() if k.startswith(f"{endpoint}:")}
    print(f"\nspoofing {endpoint}: {sum(mine.values())} requests {dict(sorted(mine.items()))}")


def test_dev_author_header_is_only_consulted_when_nobody_is_authenticated(
    world, settings, client_for
):
    """With ``ATLAS_DEV_AUTHOR_HEADER`` on, a token still wins over the header; only an
    unauthenticated request is attributed to the header's name (the documented exception)."""
    settings.ATLAS_DEV_AUTHOR_HEADER = True
    state = _entity(world, world.writer)
    url = f"{API}/entities/{NS}/event/{state['slug']}"
    response = world.clients["writer"].put(
        url, {"content": {"n": 5}}, format="json", headers={"X-Atlas-Author": "root"}
    )
    assert response.status_code == 200
    assert response.json()["changeset"]["author"] == "wendy-real"

    # Anonymous + header: the named user (created without roles) is the principal.
    anonymous = APIClient()
    response = anonymous.put(
        url, {"content": {"n": 6}}, format="json", headers={"X-Atlas-Author": "devuser"}
    )
    assert response.status_code == 404  # devuser has no roles: cannot even see acme.orders
    role_grant(namespace=Namespace.objects.get(name=NS), principal=_user("devuser"), role="writer")
    response = anonymous.put(
        url, {"content": {"n": 7}}, format="json", headers={"X-Atlas-Author": "devuser"}
    )
    assert response.status_code == 200
    assert response.json()["changeset"]["author"] == "devuser"
    # The system principal cannot be borrowed even then, whether or not it exists yet
    # (the header creates the users it names; it must never create this one, active).
    for _ in range(2):
        response = anonymous.put(
            url, {"content": {"n": 8}}, format="json", headers={"X-Atlas-Author": SYSTEM_USERNAME}
        )
        assert response.status_code == 401
        assert not get_user_model().objects.filter(username=SYSTEM_USERNAME, is_active=True)
        system_user()

    settings.ATLAS_DEV_AUTHOR_HEADER = False
    response = anonymous.put(
        url, {"content": {"n": 9}}, format="json", headers={"X-Atlas-Author": "devuser"}
    )
    assert response.status_code == 401


def _user(name: str) -> Any:
    return get_user_model().objects.get(username=name)


# --- commands and tasks ----------------------------------------------------------------------


def _write_file(tmp_path: Any, author: str, slug: str) -> Any:
    path = tmp_path / f"{slug}.ndjson"
    envelope = {
        "schema_version": 1,
        "changeset_id": str(uuid.uuid4()),
        "author": author,
        "at": "2026-01-01T00:00:00.000Z",
        "rpc": "PutEntity",
        "branch": "",
        "comment": "from a file",
    }
    op = {
        "op": "create",
        "namespace": NS,
        "kind": "event",
        "slug": slug,
        "before": None,
        "after": {"n": 1},
    }
    path.write_text(json.dumps(envelope) + "\n" + json.dumps(op) + "\n")
    return path


@pytest.mark.parametrize("claimed", ["root", "mallory", "wendy-real", SYSTEM_USERNAME])
def test_import_command_authors_as_the_system_principal(world, tmp_path, claimed):
    path = _write_file(tmp_path, claimed, f"cmd-{uuid.uuid4().hex[:8]}")
    call_command("import_changesets", str(path), "--no-progress", stdout=io.StringIO())
    changeset = Changeset.objects.order_by("-seq").first()
    assert changeset.rpc == Rpc.IMPORT_CHANGESET
    assert changeset.author_name == SYSTEM_USERNAME == "atlas-system"
    assert changeset.author.username == SYSTEM_USERNAME
    assert not changeset.author.is_active  # it can never log in or hold a working token


def test_import_command_with_user_authors_as_that_user(world, tmp_path):
    path = _write_file(tmp_path, "root", f"cmd-{uuid.uuid4().hex[:8]}")
    call_command(
        "import_changesets",
        str(path),
        "--user",
        "wendy-real",
        "--no-progress",
        stdout=io.StringIO(),
    )
    changeset = Changeset.objects.order_by("-seq").first()
    assert (changeset.author_id, changeset.author_name) == (world.writer.pk, "wendy-real")


def test_tasks_and_operator_commands_write_no_changeset(world, tmp_path):
    """The journal task, both beat sweeps, recover_batches, verify_log and export write
    nothing to the log: only the write service does, for a principal."""
    state = _entity(world, world.staff)
    subscription_create(actor=world.staff, name="s", url="http://hooks.test/")
    count = Changeset.objects.count()
    tasks.journal_publish(state["changeset_id"])
    tasks.journal_sweep()
    pumps.subscriptions_wake()
    journal.journal_sweep(older_than_seconds=0)
    call_command(
        "recover_batches",
        "--no-progress",
        "--wait",
        "0",
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    call_command("verify_log", "--no-progress", stdout=io.StringIO(), stderr=io.StringIO())
    call_command(
        "export_changesets",
        "--out",
        str(tmp_path),
        "--no-progress",
        stdout=io.StringIO(),
        stderr=io.StringIO(),
    )
    assert Changeset.objects.count() == count
    assert set(Changeset.objects.values_list("author_name", flat=True)) == {"root-real"}
