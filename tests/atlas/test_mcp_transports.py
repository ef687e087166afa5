"""The MCP server's two transports, driven by the SDK's own clients.

Streamable HTTP: ``/mcp`` on a live server (pytest-django ``live_server``,
the same Django app gunicorn serves), through ``streamable_http_client``.
Stdio: ``manage.py mcp`` spawned by ``stdio_client`` against the test
database. Both need committed data (``transaction=True``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from atlas.services import api_token_create
from changesets.models import Changeset
from tests.atlas.test_gunicorn import CONFIG, free_port
from tests.changesets.worker_helpers import database_url_for_workers

NS = "acme.orders"
HIDDEN = "acme.secret"
ROOT = Path(__file__).resolve().parents[2]
PUT_A = {"op": "put", "namespace": NS, "kind": "order", "slug": "a", "content": {"total": 7}}


@pytest.fixture
def people(make_user, write):
    alice = make_user("alice", writer=[NS])
    rita = make_user("rita", reader=[NS])
    root = make_user("root", superuser=True, writer=[HIDDEN])
    write(alice, f"{NS}/order/a", {"total": 1})
    write(root, f"{HIDDEN}/order/s", {"pin": 1234})
    return {
        "alice": api_token_create(user=alice, name="mcp")[1],
        "rita": api_token_create(user=rita, name="mcp")[1],
    }


async def _agent_run(session: ClientSession) -> dict[str, Any]:
    """What every transport test does: read, look for the hidden, dry-run, confirm."""
    await session.initialize()
    tools = {t.name for t in (await session.list_tools()).tools}
    entity = await session.call_tool("get_entity", {"namespace": NS, "kind": "order", "slug": "a"})
    listed = await session.call_tool("list_entities", {})
    hidden = await session.call_tool(
        "get_entity", {"namespace": HIDDEN, "kind": "order", "slug": "s"}
    )
    resources = await session.list_resources()
    plan = await session.call_tool("write_entities", {"ops": [PUT_A]})
    token = (plan.structuredContent or {}).get("plan_token")
    done = await session.call_tool("write_entities", {"ops": [PUT_A], "plan_token": token})
    return {
        "tools": tools,
        "entity": entity,
        "listed": listed,
        "hidden": hidden,
        "resources": resources,
        "plan": plan,
        "done": done,
    }


def _assert_agent_run(run: dict[str, Any], client: str) -> None:
    assert "write_entities" in run["tools"] and len(run["tools"]) == 10
    assert run["entity"].structuredContent["content"] == {"total": 1}
    visible = json.dumps(run["listed"].structuredContent) + run["resources"].model_dump_json()
    assert HIDDEN not in visible and "1234" not in visible
    assert run["hidden"].isError and '"status": 404' in run["hidden"].content[0].text
    assert run["plan"].structuredContent["dry_run"] is True
    done = run["done"].structuredContent
    assert not run["done"].isError and done["dry_run"] is False
    changeset = Changeset.objects.get(pk=done["changeset"]["id"])
    assert changeset.author.username == "alice"
    assert changeset.context["auth"] == "mcp" and changeset.context["client"] == client


# --- streamable HTTP at /mcp ---------------------------------------------------------


def _http(live_server: Any, key: str, client: str, work: Any) -> Any:
    return _http_at(f"{live_server.url}/mcp", key, client, work)


def _http_at(url: str, key: str, client: str, work: Any) -> Any:
    async def go() -> Any:
        headers = {"Authorization": f"Token {key}"}
        async with (
            httpx.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(
                read, write, client_info=types.Implementation(name=client, version="1")
            ) as session,
        ):
            return await work(session)

    return anyio.run(go)


@pytest.mark.django_db(transaction=True)
def test_streamable_http_serves_every_step_as_the_tokens_user(live_server, people):
    run = _http(live_server, people["alice"], "http-agent", _agent_run)
    _assert_agent_run(run, "http-agent")
    # The request's provenance rides along: the request id the middleware gave it.
    changeset = Changeset.objects.get(pk=run["done"].structuredContent["changeset"]["id"])
    assert changeset.context["request_id"] and changeset.context["ip"] == "127.0.0.1"


@pytest.mark.django_db(transaction=True)
def test_streamable_http_reader_cannot_mutate(live_server, people):
    async def work(session: ClientSession) -> types.CallToolResult:
        await session.initialize()
        return await session.call_tool("write_entities", {"ops": [PUT_A]})

    result = _http(live_server, people["rita"], "reader", work)
    assert result.isError and '"status": 403' in result.content[0].text


@pytest.mark.django_db(transaction=True)
def test_streamable_http_refuses_without_a_token_or_a_session(live_server, people):
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": types.LATEST_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "curl", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    url = f"{live_server.url}/mcp"
    anonymous = httpx.post(url, json=init, headers=accept)
    assert anonymous.status_code == 401
    assert anonymous.headers["Content-Type"] == "application/problem+json"
    assert anonymous.headers["WWW-Authenticate"] == "Token"
    bad = httpx.post(url, json=init, headers={**accept, "Authorization": "Token nope"})
    assert bad.status_code == 401

    auth = {**accept, "Authorization": f"Token {people['alice']}"}
    ok = httpx.post(url, json=init, headers=auth)
    assert ok.status_code == 200 and ok.json()["result"]["serverInfo"]["name"] == "atlas"
    session = ok.headers["Mcp-Session-Id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    headers = {**auth, "MCP-Protocol-Version": ok.json()["result"]["protocolVersion"]}
    assert httpx.post(url, json=call, headers=headers).status_code == 400  # no session id
    forged = httpx.post(url, json=call, headers={**headers, "Mcp-Session-Id": session + "x"})
    assert forged.status_code == 404
    rita = {**headers, "Authorization": f"Token {people['rita']}", "Mcp-Session-Id": session}
    assert httpx.post(url, json=call, headers=rita).status_code == 404  # alice's session
    listed = httpx.post(url, json=call, headers={**headers, "Mcp-Session-Id": session})
    assert listed.status_code == 200 and len(listed.json()["result"]["tools"]) == 10


@pytest.mark.django_db(transaction=True)
def test_streamable_http_under_gunicorn_as_deployed(people):
    """The production server (atlas/deploy/gunicorn.conf.py, atlas.wsgi, two workers):
    stateless, so any worker answers any request of a session."""
    port = free_port()
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "atlas-mcp-gunicorn-test-secret",
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": _database_url(),
    }
    argv = [sys.executable, "-m", "gunicorn", "-c", CONFIG, "atlas.wsgi"]
    argv += ["--bind", f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning"]
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        run = _http_at(
            f"http://127.0.0.1:{port}/mcp", people["alice"], "gunicorn-agent", _agent_run
        )
        _assert_agent_run(run, "gunicorn-agent")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


# --- stdio: manage.py mcp ------------------------------------------------------------


def _database_url() -> str:
    """The test database, as the spawned command must reach it (TCP or the embedded
    server's socket folder)."""
    return database_url_for_workers()


def _stdio(key: str | None, work: Any) -> Any:
    env = {**os.environ, "DATABASE_URL": _database_url()}
    env.pop("ATLAS_MCP_TOKEN", None)
    if key is not None:
        env["AGENT_KEY"] = key
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "mcp", "--token-env", "AGENT_KEY"],
        env=env,
        cwd=str(ROOT),
    )

    async def go() -> Any:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(
                read, write, client_info=types.Implementation(name="stdio-agent", version="1")
            ) as session,
        ):
            return await work(session)

    return anyio.run(go)


@pytest.mark.django_db(transaction=True)
def test_stdio_serves_every_step_as_the_tokens_user(people):
    run = _stdio(people["alice"], _agent_run)
    _assert_agent_run(run, "stdio-agent")


@pytest.mark.django_db(transaction=True)
def test_stdio_refuses_to_start_without_a_valid_token(people):

    env = {**os.environ, "DATABASE_URL": _database_url(), "AGENT_KEY": "atlas_wrong"}
    done = subprocess.run(
        [sys.executable, "manage.py", "mcp", "--token-env", "AGENT_KEY"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0 and "Invalid token" in done.stderr
    assert done.stdout == ""
