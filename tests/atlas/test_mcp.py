"""The MCP server's tools and resources, driven by the SDK's own client (in memory).

Every tool runs against the real database through ``ClientSession``
(``mcp.shared.memory``), as an API token's user. The transports (streamable
HTTP at ``/mcp``, stdio through ``manage.py mcp``) are in
``test_mcp_transports``. Sessions run under ``async_to_sync`` so the tools'
ORM work comes back to the test's thread and sees its transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from mcp import types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session

from atlas.mcp.caller import Caller
from atlas.mcp.server import build_server
from atlas.services import api_token_create, api_token_revoke
from changesets.models import Changeset, Revision
from entities.store import EntityKey, baseline
from tests.changesets.helpers import assert_nothing_written, log_snapshot

NS = "acme.orders"
HIDDEN = "acme.secret"
CLIENT = "test-agent"
TOOLS = {
    "list_changesets",
    "get_changeset",
    "get_entity",
    "list_entities",
    "get_entity_history",
    "blame_entity",
    "diff_entity",
    "revert_changeset",
    "restore_entity",
    "write_entities",
}


class Agent:
    """An MCP client session as ``user``: ``agent.call("get_entity", namespace=...)``."""

    def __init__(self, user: Any, *, client: str = CLIENT) -> None:
        self.token, key = api_token_create(user=user, name="mcp")
        self.server = build_server(caller=Caller(user, self.token, key))
        self.client = client

    def session(self, work: Callable[[ClientSession], Awaitable[Any]]) -> Any:
        async def run() -> Any:
            async with create_connected_server_and_client_session(
                self.server, client_info=types.Implementation(name=self.client, version="1")
            ) as session:
                return await work(session)

        return async_to_sync(run)()

    def result(self, tool: str, **arguments: Any) -> types.CallToolResult:
        return self.session(lambda s: s.call_tool(tool, arguments))

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = self.result(tool, **arguments)
        assert not result.isError, result.content
        assert result.structuredContent is not None
        return result.structuredContent

    def problem(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """The problem+json a failing call reports (its text, after the SDK's prefix)."""
        result = self.result(tool, **arguments)
        assert result.isError, result.structuredContent
        text = result.content[0].text  # type: ignore[union-attr]
        return json.loads(text[text.index("{") :])


def put(ns: str, slug: str, content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "op": "put",
        "namespace": ns,
        "kind": "order",
        "slug": slug,
        "content": content,
        **extra,
    }


@pytest.fixture
def world(make_user, write):
    """alice writes acme.orders and reads nothing else; acme.secret holds a hidden entity;
    rita only reads acme.orders."""
    alice = make_user("alice", writer=[NS])
    rita = make_user("rita", reader=[NS])
    root = make_user("root", superuser=True, writer=[HIDDEN])
    first = write(alice, f"{NS}/order/a", {"total": 10, "lines": {"sku": "x"}})
    second = write(alice, f"{NS}/order/a", {"total": 99, "lines": {"sku": "x"}})
    hidden = write(root, f"{HIDDEN}/order/s", {"pin": 1234})
    return {
        "alice": alice,
        "rita": rita,
        "root": root,
        "first": str(first.changeset.id),
        "second": str(second.changeset.id),
        "hidden": str(hidden.changeset.id),
    }


def content_of(ns: str, slug: str) -> dict[str, Any] | None:
    entity = baseline.get(EntityKey(ns, "order", slug))
    return entity.content if entity is not None else None


# --- discovery ---------------------------------------------------------------------


@pytest.mark.django_db
def test_the_tools_are_listed_with_input_and_output_schemas(world):
    agent = Agent(world["alice"])
    tools = {t.name: t for t in agent.session(lambda s: s.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.inputSchema["type"] == "object"
        assert tool.outputSchema is not None and tool.outputSchema["type"] == "object"
    assert "plan_token" in tools["write_entities"].inputSchema["properties"]
    assert tools["get_entity"].annotations.readOnlyHint is True
    assert tools["revert_changeset"].annotations.readOnlyHint is False


# --- read tools --------------------------------------------------------------------


@pytest.mark.django_db
def test_get_entity_now_and_as_of(world):
    agent = Agent(world["alice"])
    now = agent.call("get_entity", namespace=NS, kind="order", slug="a")
    assert now["content"]["total"] == 99 and now["version"] == 2
    then = agent.call("get_entity", namespace=NS, kind="order", slug="a", as_of=world["first"])
    assert then["content"]["total"] == 10 and then["version"] == 1
    assert then["as_of"]["changeset_id"] == world["first"]


@pytest.mark.django_db
def test_list_entities_now_and_as_of_with_paging(world, write):
    write(world["alice"], f"{NS}/order/b", {"total": 1})
    agent = Agent(world["alice"])
    page = agent.call("list_entities", namespace=NS, page_size=1)
    assert [e["slug"] for e in page["results"]] == ["a"]
    rest = agent.call(
        "list_entities", namespace=NS, page_size=1, page_token=page["next_page_token"]
    )
    assert [e["slug"] for e in rest["results"]] == ["b"] and rest["next_page_token"] is None
    past = agent.call("list_entities", namespace=NS, as_of=world["first"])
    assert [(e["slug"], e["version"]) for e in past["results"]] == [("a", 1)]


@pytest.mark.django_db
def test_list_changesets_filters_as_the_api(world):
    agent = Agent(world["alice"])
    page = agent.call("list_changesets", namespace=NS)
    assert [c["id"] for c in page["results"]] == [world["second"], world["first"]]
    assert agent.call("list_changesets", author="nobody")["results"] == []
    problem = agent.problem("list_changesets", since="yesterday")
    assert problem["status"] == 422


@pytest.mark.django_db
def test_get_changeset_pages_its_revisions_with_images(world, write):
    cs = write(
        world["alice"], f"{NS}/order/c", {"n": 1}
    )  # one more changeset for a single-revision view
    agent = Agent(world["alice"])
    got = agent.call("get_changeset", changeset_id=world["second"])
    assert got["id"] == world["second"] and got["rpc"] == "PutEntity"
    [revision] = got["revisions"]
    assert revision["before"]["total"] == 10 and revision["after"]["total"] == 99
    assert revision["changed"] == ["/total"]
    assert got["next_page_token"] is None
    assert agent.call("get_changeset", changeset_id=str(cs.changeset.id))["op_count_visible"] == 1


@pytest.mark.django_db
def test_get_changeset_pages(make_user):
    alice = make_user("alice", writer=[NS])
    agent = Agent(alice)
    ops = [put(NS, f"k{i}", {"i": i}) for i in range(3)]
    token = agent.call("write_entities", ops=ops)["plan_token"]
    cs = agent.call("write_entities", ops=ops, plan_token=token)["changeset"]["id"]
    first = agent.call("get_changeset", changeset_id=cs, page_size=2)
    assert [r["slug"] for r in first["revisions"]] == ["k0", "k1"]
    rest = agent.call(
        "get_changeset", changeset_id=cs, page_size=2, page_token=first["next_page_token"]
    )
    assert [r["slug"] for r in rest["revisions"]] == ["k2"] and rest["next_page_token"] is None


@pytest.mark.django_db
def test_get_entity_history_whole_and_by_key(world, write):
    write(world["alice"], f"{NS}/order/a", {"total": 99, "lines": {"sku": "y"}})
    agent = Agent(world["alice"])
    history = agent.call("get_entity_history", namespace=NS, kind="order", slug="a")
    assert [r["after_version"] for r in history["results"]] == [3, 2, 1]
    by_key = agent.call("get_entity_history", namespace=NS, kind="order", slug="a", key="/total")
    assert [r["after_version"] for r in by_key["results"]] == [2, 1]


@pytest.mark.django_db
def test_blame_entity_names_the_changeset_of_each_leaf(world):
    agent = Agent(world["alice"])
    blame = agent.call("blame_entity", namespace=NS, kind="order", slug="a")
    by_pointer = {k["pointer"]: k["changeset_id"] for k in blame["keys"]}
    assert by_pointer == {"/lines/sku": world["first"], "/total": world["second"]}
    past = agent.call("blame_entity", namespace=NS, kind="order", slug="a", as_of=world["first"])
    assert {k["changeset_id"] for k in past["keys"]} == {world["first"]}


@pytest.mark.django_db
def test_diff_entity_between_two_changesets(world):
    agent = Agent(world["alice"])
    diff = agent.call(
        "diff_entity",
        namespace=NS,
        kind="order",
        slug="a",
        from_changeset=world["first"],
        to_changeset=world["second"],
    )
    assert diff["before"]["total"] == 10 and diff["after"]["total"] == 99
    assert diff["patch"] == [{"op": "replace", "path": "/total", "value": 99}]
    assert diff["from"]["changeset_id"] == world["first"]


# --- resources ---------------------------------------------------------------------


@pytest.mark.django_db
def test_resources_read_entities_now_and_as_of_and_changesets(world):
    agent = Agent(world["alice"])

    def read(uri: str) -> dict[str, Any]:
        result = agent.session(lambda s: s.read_resource(uri))
        return json.loads(result.contents[0].text)

    assert read(f"atlas://{NS}/order/a")["content"]["total"] == 99
    assert read(f"atlas://{NS}/order/a?as_of={world['first']}")["content"]["total"] == 10
    assert read(f"atlas://changesets/{world['second']}")["id"] == world["second"]
    templates = agent.session(lambda s: s.list_resource_templates()).resourceTemplates
    assert {t.name for t in templates} == {"entity", "changeset"}


@pytest.mark.django_db
def test_resource_listing_pages_with_a_cursor(world, write):
    write(world["alice"], f"{NS}/order/b", {"total": 1})
    agent = Agent(world["alice"])
    listed = agent.session(lambda s: s.list_resources())
    assert [str(r.uri) for r in listed.resources] == [
        f"atlas://{NS}/order/a",
        f"atlas://{NS}/order/b",
    ]
    assert listed.nextCursor is None


# --- visibility: invisible is "not found", and never listed ------------------------


@pytest.mark.django_db
def test_invisible_namespaces_never_appear_in_any_output(world):
    agent = Agent(world["alice"])
    outputs = [
        agent.call("list_changesets"),
        agent.call("list_entities"),
        agent.call("list_entities", namespace=HIDDEN),
        agent.call("list_changesets", namespace=HIDDEN),
    ]
    listed = agent.session(lambda s: s.list_resources())
    text = json.dumps(outputs) + listed.model_dump_json()
    assert HIDDEN not in text and world["hidden"] not in text
    assert "1234" not in text


@pytest.mark.django_db
@pytest.mark.parametrize(
    "tool,arguments",
    [
        ("get_entity", {"namespace": HIDDEN, "kind": "order", "slug": "s"}),
        ("get_entity_history", {"namespace": HIDDEN, "kind": "order", "slug": "s"}),
        ("blame_entity", {"namespace": HIDDEN, "kind": "order", "slug": "s"}),
        ("diff_entity", {"namespace": HIDDEN, "kind": "order", "slug": "s", "from_changeset": "H"}),
        ("get_changeset", {"changeset_id": "H"}),
        ("revert_changeset", {"changeset_id": "H"}),
        ("restore_entity", {"namespace": HIDDEN, "kind": "order", "slug": "s", "version": 1}),
    ],
)
def test_an_invisible_entity_or_changeset_is_not_found(world, tool, arguments):
    arguments = {k: world["hidden"] if v == "H" else v for k, v in arguments.items()}
    problem = Agent(world["alice"]).problem(tool, **arguments)
    assert problem["status"] == 404, problem
    assert "1234" not in json.dumps(problem)


@pytest.mark.django_db
def test_an_invisible_resource_is_not_found(world):
    agent = Agent(world["alice"])

    async def refused(session: ClientSession, uri: str) -> str:
        with pytest.raises(McpError) as caught:
            await session.read_resource(uri)
        return caught.value.error.message

    for uri in (f"atlas://{HIDDEN}/order/s", f"atlas://changesets/{world['hidden']}"):
        message = agent.session(lambda s, uri=uri: refused(s, uri))
        assert '"status": 404' in message and "1234" not in message


# --- mutating tools: dry run, plan_token, confirm ----------------------------------


@pytest.mark.django_db
def test_write_entities_dry_run_writes_nothing_and_returns_a_plan(world):
    agent = Agent(world["alice"])
    before = log_snapshot()
    plan = agent.call("write_entities", ops=[put(NS, "new", {"total": 5})], comment="add one")
    assert_nothing_written(before)
    assert plan["dry_run"] is True and plan["changeset"] is None and plan["plan_token"]
    assert plan["changes"] == [
        {
            "namespace": NS,
            "kind": "order",
            "slug": "new",
            "op": "create",
            "before_version": None,
            "after_version": 1,
            "before": None,
            "after": {"total": 5},
        }
    ]
    assert plan["results"] == [{"pointer": "/ops/0", "status": "created", "version": 1}]


@pytest.mark.django_db
def test_confirm_writes_exactly_the_previewed_changes_as_the_tokens_user(world):
    agent = Agent(world["alice"])
    ops = [put(NS, "a", {"total": 100, "lines": {"sku": "x"}}), put(NS, "new", {"total": 5})]
    plan = agent.call("write_entities", ops=ops, comment="fix totals", metadata={"ticket": 7})
    done = agent.call(
        "write_entities",
        ops=ops,
        comment="fix totals",
        metadata={"ticket": 7},
        plan_token=plan["plan_token"],
    )
    assert done["dry_run"] is False and done["changes"] == plan["changes"]
    changeset = Changeset.objects.get(pk=done["changeset"]["id"])
    assert changeset.author.username == "alice" and changeset.comment == "fix totals"
    assert changeset.metadata == {"ticket": 7}
    assert changeset.context["auth"] == "mcp"
    assert changeset.context["client"] == CLIENT
    assert changeset.context["token_id"] == agent.token.pk
    written = [
        [r.namespace, r.kind, r.slug, r.op, r.before, r.after, r.before_version, r.after_version]
        for r in Revision.objects.filter(changeset=changeset).order_by("id")
    ]
    previewed = [
        [c["namespace"], c["kind"], c["slug"], c["op"], c["before"], c["after"]]
        + [c["before_version"], c["after_version"]]
        for c in plan["changes"]
    ]
    assert written == previewed
    assert content_of(NS, "new") == {"total": 5}


@pytest.mark.django_db
def test_a_stale_plan_token_is_refused_and_nothing_is_written(world, write):
    agent = Agent(world["alice"])
    ops = [put(NS, "a", {"total": 1})]
    plan = agent.call("write_entities", ops=ops)
    write(world["alice"], f"{NS}/order/a", {"total": 42})  # someone else moved it on
    before = log_snapshot()
    problem = agent.problem("write_entities", ops=ops, plan_token=plan["plan_token"])
    assert problem["status"] == 409 and problem["type"].endswith("/plan-changed")
    assert_nothing_written(before)
    assert content_of(NS, "a") == {"total": 42}


@pytest.mark.django_db
def test_a_plan_token_confirms_only_its_own_call_and_caller(world, make_user):
    agent = Agent(world["alice"])
    plan = agent.call("write_entities", ops=[put(NS, "a", {"total": 1})])
    token = plan["plan_token"]
    before = log_snapshot()
    other_ops = agent.problem("write_entities", ops=[put(NS, "a", {"total": 2})], plan_token=token)
    other_tool = agent.problem("revert_changeset", changeset_id=world["first"], plan_token=token)
    bob = make_user("bob", writer=[NS])
    other_user = Agent(bob).problem(
        "write_entities", ops=[put(NS, "a", {"total": 1})], plan_token=token
    )
    forged = agent.problem("write_entities", ops=[put(NS, "a", {"total": 1})], plan_token="x:y")
    for problem in (other_ops, other_tool, other_user, forged):
        assert problem["status"] == 400 and problem["type"].endswith("/plan-token-invalid")
    assert_nothing_written(before)


@pytest.mark.django_db
def test_a_batch_that_changes_nothing_has_no_plan_token(world):
    plan = Agent(world["alice"]).call(
        "write_entities", ops=[put(NS, "a", {"total": 99, "lines": {"sku": "x"}})]
    )
    assert plan["plan_token"] is None and plan["changes"] == []
    assert plan["results"][0]["status"] == "unchanged"


@pytest.mark.django_db
def test_write_entities_validates_ops_as_the_batch_api(world):
    problem = Agent(world["alice"]).problem(
        "write_entities", ops=[put(NS, "a", {"total": 1}), {"op": "put", "namespace": NS}]
    )
    assert problem["status"] == 422
    assert {e["pointer"] for e in problem["errors"]} >= {"/ops/1/kind", "/ops/1/slug"}


@pytest.mark.django_db
def test_revert_changeset_dry_run_then_confirm(world):
    agent = Agent(world["alice"])
    before = log_snapshot()
    plan = agent.call("revert_changeset", changeset_id=world["second"], comment="bad total")
    assert_nothing_written(before)
    assert plan["ops"] == [
        {
            "op": "put",
            "namespace": NS,
            "kind": "order",
            "slug": "a",
            "content": plan["changes"][0]["after"],
        }
    ]
    assert plan["changes"][0]["after"]["total"] == 10
    done = agent.call(
        "revert_changeset",
        changeset_id=world["second"],
        comment="bad total",
        plan_token=plan["plan_token"],
    )
    assert done["changeset"]["rpc"] == "RevertChangeset"
    assert done["changeset"]["context"]["auth"] == "mcp"
    assert content_of(NS, "a") == {"total": 10, "lines": {"sku": "x"}}


@pytest.mark.django_db
def test_a_revert_whose_entities_moved_since_the_dry_run_is_refused(world, write):
    agent = Agent(world["alice"])
    plan = agent.call("revert_changeset", changeset_id=world["second"])
    write(world["alice"], f"{NS}/order/a", {"total": 10, "lines": {"sku": "x"}})  # undone by hand
    before = log_snapshot()
    problem = agent.problem(
        "revert_changeset", changeset_id=world["second"], plan_token=plan["plan_token"]
    )
    assert problem["status"] == 409 and problem["type"].endswith("/plan-changed")
    assert_nothing_written(before)


@pytest.mark.django_db
def test_restore_entity_dry_run_then_confirm(world):
    agent = Agent(world["alice"])
    before = log_snapshot()
    plan = agent.call("restore_entity", namespace=NS, kind="order", slug="a", version=1)
    assert_nothing_written(before)
    assert plan["restored_version"] == 1 and plan["changeset"] is None
    assert [c["after"] for c in plan["changes"]] == [{"total": 10, "lines": {"sku": "x"}}]
    done = agent.call(
        "restore_entity",
        namespace=NS,
        kind="order",
        slug="a",
        version=1,
        plan_token=plan["plan_token"],
    )
    assert done["changeset"]["rpc"] == "RestoreEntity"
    assert done["changeset"]["context"]["auth"] == "mcp"
    assert done["changeset"]["context"]["client"] == CLIENT
    assert content_of(NS, "a") == {"total": 10, "lines": {"sku": "x"}}


@pytest.mark.django_db
def test_restore_entity_as_of_and_a_stale_plan_is_refused(world, write):
    agent = Agent(world["alice"])
    plan = agent.call("restore_entity", namespace=NS, kind="order", slug="a", as_of=world["first"])
    write(world["alice"], f"{NS}/order/a", {"total": 11, "lines": {"sku": "x"}})
    before = log_snapshot()
    problem = agent.problem(
        "restore_entity",
        namespace=NS,
        kind="order",
        slug="a",
        as_of=world["first"],
        plan_token=plan["plan_token"],
    )
    assert problem["status"] == 409 and problem["type"].endswith("/plan-changed")
    assert_nothing_written(before)
    both = agent.problem("restore_entity", namespace=NS, kind="order", slug="a")
    assert both["status"] == 422, both


# --- roles -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_reader_can_read_but_not_mutate(world):
    rita = Agent(world["rita"])
    assert rita.call("get_entity", namespace=NS, kind="order", slug="a")["version"] == 2
    before = log_snapshot()
    for tool, arguments in (
        ("write_entities", {"ops": [put(NS, "a", {"total": 0})]}),
        ("revert_changeset", {"changeset_id": world["second"]}),
        ("restore_entity", {"namespace": NS, "kind": "order", "slug": "a", "version": 1}),
    ):
        problem = rita.problem(tool, **arguments)
        assert problem["status"] == 403, problem
    assert_nothing_written(before)


@pytest.mark.django_db
def test_a_revoked_token_stops_reads_mid_session(world):
    agent = Agent(world["alice"])
    assert agent.call("get_entity", namespace=NS, kind="order", slug="a")
    api_token_revoke(token=agent.token)
    problem = agent.problem("get_entity", namespace=NS, kind="order", slug="a")
    assert problem["status"] == 401
