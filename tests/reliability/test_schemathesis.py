"""Item 10: Schemathesis against the live OpenAPI document (``/api/schema/``).

The whole Schemathesis engine (what its CLI runs) drives the real WSGI app in
process, against the test database, with a staff token: the examples,
coverage, fuzzing and stateful phases, every built-in check (server errors,
status codes, content types, response schemas, response headers, positive
and negative data, use-after-free, resource availability, ignored auth,
missing required headers, unsupported methods) plus Atlas's own:

* ``problem_json``: every 4xx/5xx is ``application/problem+json`` whose body
  ``status`` equals the HTTP status (API.md Conventions, Errors).

Positive-data rejections are failures unless the problem names a rule JSON
Schema cannot state (``SEMANTIC_REJECTIONS``: an opaque token the server did
not sign, an Idempotency-Key already used for another request, ``as_of``
with ``as_of_time``, a webhook host that does not resolve, a namespace that
does not exist, U+0000 or nesting inside content). Those are dropped through
Schemathesis's ``filter_failure`` hook and counted, never silently; so are
"negative" cases whose negative value reaches the server as valid text
(``namespace=null``: the JSON null of an array parameter, sent as the valid
name ``null``), which no server could tell apart, and ``use_after_free`` on a
branch: ``DELETE /branches/{name}`` abandons it, and an abandoned branch stays
readable by design.

A second test walks the same document and puts hostile strings (U+0000, lone
surrogates, 5,000 characters, control characters) into every string input of
every operation, one at a time: 4xx, never a 5xx.

Sizes: ``ATLAS_STRESS=1`` runs ``STRESS_EXAMPLES`` (100) examples per
operation and phase with a new seed; the CI run uses ``CI_EXAMPLES`` and a fixed
seed (``ATLAS_FUZZ_SEED`` overrides either). Figures are printed (``pytest -s``)
and recorded in docs/reliability.md.
"""

from __future__ import annotations

import collections
import gzip
import json
import os
import random
import time
import uuid
from typing import Any

import jsonschema
import pytest
import requests
import schemathesis
from django.core.wsgi import get_wsgi_application
from django.db import connections
from django.test import Client
from schemathesis.engine import Status, events, from_schema

from atlas.services import api_token_create
from branches.services import branch_create
from changesets.models import Subscription
from changesets.selectors.feed import cursor_encode
from tests.entities.factories import NamespaceFactory, SuperuserFactory

pytestmark = pytest.mark.usefixtures("no_network")
STRESS = os.environ.get("ATLAS_STRESS") == "1"
STRESS_EXAMPLES = 100
CI_EXAMPLES = 4
EXAMPLES = STRESS_EXAMPLES if STRESS else CI_EXAMPLES
SEED = int(
    os.environ.get("ATLAS_FUZZ_SEED") or (random.SystemRandom().getrandbits(64) if STRESS else 7)
)

PROBLEM_JSON = "application/problem+json"

# POST /changesets/import takes an NDJSON file, described as a string: send it as text.
schemathesis.serializer.alias("application/x-ndjson", "text/plain")


def _header(response: Any, name: str) -> str:
    value = response.headers.get(name.lower()) or response.headers.get(name) or ""
    return value[0] if isinstance(value, list) else value


@schemathesis.check
def problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx is problem+json and its ``status`` is the HTTP status."""
    if response.status_code < 400:
        return None
    media_type = _header(response, "Content-Type").split(";")[0].strip()
    assert media_type == PROBLEM_JSON, (
        f"{response.status_code} answered {media_type!r}, not {PROBLEM_JSON}"
    )
    body = json.loads(response.content)
    assert isinstance(body, dict), body
    assert body.get("status") == response.status_code, (
        f"problem status {body.get('status')!r} != HTTP {response.status_code}"
    )
    for member in ("type", "title", "detail", "instance"):
        assert isinstance(body.get(member), str) and body[member], f"no {member!r}: {body}"
    return True


# (status, pointer prefix, text the detail contains or None): schema-valid input the
# contract refuses for a reason no JSON Schema can state.
SEMANTIC_REJECTIONS: list[tuple[int, str, str | None]] = [
    # Opaque, signed positions: a string the server did not sign is 400 (API.md Paging).
    (400, "/page_token", None),
    (400, "/since", None),
    (400, "/cursor", None),
    # Same principal + key with another request is 422 (API.md Idempotency).
    (422, "/headers/Idempotency-Key", "Key reused"),
    # as_of and as_of_time exclude each other (docs/changesets.md); so do a diff's from and
    # from_time, to and to_time, and one of from and from_time is needed (docs/history.md).
    (422, "/as_of_time", "Conflicts with as_of"),
    (422, "/from_time", "Conflicts with from"),
    (422, "/to_time", "Conflicts with to"),
    (422, "/from", "required"),
    # Timestamps must be instants PostgreSQL and Python hold: "0001-01-01T00:00:00+01:00"
    # is a valid RFC 3339 date-time before year 1 in UTC (422).
    (422, "/since", "RFC 3339"),
    (422, "/until", "RFC 3339"),
    (422, "/as_of_time", "RFC 3339"),
    (422, "/from_time", "RFC 3339"),
    (422, "/to_time", "RFC 3339"),
    # A restore names exactly one point: version, as_of or as_of_time (docs/history.md,
    # "Restore"); the trash lists the present, so not beside as_of (422 each).
    (422, "/version", "Give exactly one of"),
    (422, "/as_of", "Give exactly one of"),
    (422, "/as_of_time", "Give exactly one of"),
    (422, "/as_of", "deleted=true lists the trash"),
    (422, "/as_of_time", "deleted=true lists the trash"),
    # Resolutions settle key-level conflicts only (API.md "Decisions for the added sections").
    (422, "/resolutions", "Resolutions settle key-level conflicts"),
    # Webhook hosts must resolve (to a public address unless allowed): docs/feed.md.
    (422, "/url", None),
    # Subscription namespaces must exist.
    (422, "/namespaces/", "No such namespace"),
    # An NDJSON file's lines are JSON documents with a strict shape: a bad file is 400.
    (400, "/line/", None),
    # If-Match is "*" or a list of quoted entity tags (RFC 9110), described in words:
    # any other header value is 422 (docs/api.md, Input rules).
    (422, "/headers/If-Match", "Malformed If-Match"),
    # Content, patches and metadata: no U+0000 anywhere, nesting at most 64 levels (docs/api.md).
    (422, "/content", "U+0000"),
    (422, "/patch", "U+0000"),
    (422, "/ops/", "U+0000"),
    # A partial revert names entities of that changeset (docs/changesets.md).
    (422, "/only/", "did not touch that entity"),
    # Changeset metadata is client JSON under the same rule, member names included.
    (422, "/metadata", "U+0000"),
]


def _wire_text(value: Any) -> str:
    """What a query value becomes on the wire (``None`` is the text ``null``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def sent_query_is_valid(raw: dict[str, Any], case: Any) -> bool:
    """A "negative" case whose only negative part is a query value that serializes to
    text the parameter accepts: ``namespace=null`` for a null namespace is the valid
    name ``null``. Over HTTP the server cannot see the difference, so accepting it is
    right; Schemathesis's ``negative_data_rejection`` cannot know that."""
    meta = case.meta
    if meta is None:
        return False
    for location, info in meta.components.items():
        if location.value != "query" and not info.mode.is_positive:
            return False
    operation = raw["paths"][case.operation.path][case.method.lower()]
    params = {p["name"]: p for p in operation.get("parameters", []) if p["in"] == "query"}
    for name, value in (case.query or {}).items():
        if name not in params:
            return False
        schema = params[name].get("schema", {})
        items = value if isinstance(value, list) else [value]
        item_schema = schema.get("items", {}) if schema.get("type") == "array" else schema
        for item in items:
            text = _wire_text(item)
            if text == "" and params[name].get("allowEmptyValue"):
                continue
            candidate: Any = text
            if item_schema.get("type") == "integer":
                try:
                    candidate = int(text)
                except ValueError:
                    return False
            try:
                jsonschema.validate(candidate, item_schema)
            except jsonschema.ValidationError:
                return False
    return True


def _problem_pointers(content: bytes) -> list[tuple[str, str]]:
    try:
        body = json.loads(content)
    except ValueError:
        return []
    if not isinstance(body, dict):
        return []
    errors = body.get("errors") or []
    pairs = [(e.get("pointer", ""), e.get("detail", "")) for e in errors if isinstance(e, dict)]
    if not pairs and body.get("pointer") is not None:
        pairs = [(body["pointer"], body.get("detail", ""))]
    return pairs


def is_semantic_rejection(status: int, content: bytes) -> bool:
    pairs = _problem_pointers(content)
    if not pairs:
        return False
    return all(
        any(
            status == want_status
            and pointer.startswith(prefix)
            and (text is None or text in detail)
            for want_status, prefix, text in SEMANTIC_REJECTIONS
        )
        for pointer, detail in pairs
    )


@pytest.fixture
def in_process_transport(monkeypatch):
    """Make Schemathesis's in-process (WSGI) transport behave like its HTTP one.

    * A credential-less probe (``ignored_auth``) reaches it with socket-only
      settings (``max_redirects``, ``verify``, ...) that werkzeug's client
      rejects (Schemathesis 4.32); they mean nothing in process.
    * Requests go out with ``Accept-Encoding: gzip`` (a ``requests`` session's
      default) and Atlas compresses (``atlas.middleware.GZipMiddleware``), but
      only the HTTP transport decodes: decode here too, so every check reads the
      body a client reads.
    """
    from schemathesis.transport.wsgi import WSGITransport

    send = WSGITransport.send

    def send_in_process(self: Any, case: Any, **kwargs: Any) -> Any:
        if not isinstance(kwargs.get("session"), requests.Session):
            for name in ("max_redirects", "verify", "cert", "proxies"):
                kwargs.pop(name, None)
        response = send(self, case, **kwargs)
        encoding = {k.lower(): v for k, v in response.headers.items()}.get("content-encoding")
        if encoding and "gzip" in encoding:
            response.content = gzip.decompress(response.content)
            response.headers = {
                k: v for k, v in response.headers.items() if k.lower() != "content-encoding"
            }
            counters["gzip"] += 1
        return response

    counters: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(WSGITransport, "send", send_in_process)
    return counters


@pytest.fixture
def seeded(transactional_db, write):
    """A staff token and a small world whose names appear as parameter examples."""
    staff = SuperuserFactory(username="fuzz-staff")
    token_key = api_token_create(user=staff, name="schemathesis")[1]
    NamespaceFactory(name="acme.orders")
    NamespaceFactory(name="acme.core", protected=True)
    first = write(staff, "acme.orders/event/seed", {"title": "seed", "n": 1}).changeset
    write(staff, "acme.orders/event/seed", {"title": "seed", "n": 2})
    write(staff, "acme.core/event/core", {"title": "core"})
    branch_create(name="feature", actor=staff)
    return {
        "token": token_key,
        "namespace": "acme.orders",
        "kind": "event",
        "slug": "seed",
        "changeset_id": str(first.id),
        "name": "feature",
        "cursor": cursor_encode(first.seq),
    }


def _with_examples(raw: dict[str, Any], world: dict[str, str]) -> dict[str, Any]:
    """Give path parameters the seeded world's names as examples (the examples phase
    then reaches real entities, changesets and branches, not only 404s)."""
    examples = {
        "namespace": world["namespace"],
        "kind": world["kind"],
        "slug": world["slug"],
        "changeset_id": world["changeset_id"],
        "name": world["name"],
    }
    for path, item in raw["paths"].items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in examples:
                    value = examples[parameter["name"]]
                    if parameter["name"] == "name" and path.startswith("/api/v1/namespaces"):
                        value = world["namespace"]
                    parameter["example"] = value
    return raw


def build_schema(world: dict[str, str]) -> Any:
    app = get_wsgi_application()
    raw = json.loads(Client().get("/api/schema/", {"format": "json"}).content)
    schema = schemathesis.openapi.from_dict(
        _with_examples(raw, world), config=schemathesis.Config()
    )
    schema.app = app
    schema.location = "/api/schema/"
    schema.config.update(headers={"Authorization": f"Token {world['token']}"})
    schema.config.generation.update(max_examples=EXAMPLES)
    # CI replays one seed (no flakes in a shared pipeline); full runs draw a new one.
    schema.config.seed = SEED
    schema.config.output.sanitization.enabled = False  # test-database tokens only
    # A failed precondition (If-Match, If-None-Match: *) answers the entity's state, as
    # 404 and 409 do, which Schemathesis already accepts for schema-valid input.
    acceptance = schema.config.checks.positive_data_acceptance
    acceptance.expected_statuses = [*acceptance.expected_statuses, "412"]
    return schema


def test_schemathesis_finds_no_failures(seeded, in_process_transport):
    schema = build_schema(seeded)
    raw = schema.raw_schema
    filtered: collections.Counter[str] = collections.Counter()

    @schema.hook
    def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
        """Keep every failure except positive-data rejections of semantic rules."""
        if type(failure).__name__ == "RejectedPositiveData" and is_semantic_rejection(
            response.status_code, response.content
        ):
            filtered[case.operation.label] += 1
            return False
        if type(failure).__name__ == "AcceptedNegativeData" and sent_query_is_valid(raw, case):
            filtered[f"serialized-valid {case.operation.label}"] += 1
            return False
        if type(failure).__name__ == "UseAfterFree" and " /api/v1/branches/" in str(
            getattr(failure, "free", "")
        ):
            # DELETE /branches/{name} abandons the branch; it stays readable with status
            # "abandoned" (API.md Branches; names are never reused, the log names it).
            filtered["abandoned branch still readable"] += 1
            return False
        return True

    @schema.hook
    def after_call(context: Any, case: Any, response: Any) -> None:
        # The engine calls the app from worker threads; give their connections back.
        connections.close_all()

    calls: collections.Counter[str] = collections.Counter()
    checks_run: collections.Counter[str] = collections.Counter()
    statuses: collections.Counter[int] = collections.Counter()
    phases: dict[str, tuple[str, float]] = {}
    started: dict[str, float] = {}
    failures: list[str] = []
    errors: list[str] = []
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseStarted):
            started[event.phase.name.value] = time.monotonic()
        elif isinstance(event, events.PhaseFinished):
            name = event.phase.name.value
            elapsed = time.monotonic() - started.get(name, time.monotonic())
            phases[name] = (event.status.value, elapsed)
        elif isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {event.info.title}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            errors.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            for case_id, interaction in recorder.interactions.items():
                calls[recorder.label] += 1
                if interaction.response is not None:
                    statuses[interaction.response.status_code] += 1
                for check in recorder.checks.get(case_id, []):
                    checks_run[check.name] += 1
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        response = interaction.response
                        failures.append(
                            f"[{recorder.label}] {check.name}: {check.failure_info.failure.title}\n"
                            f"  {check.failure_info.code_sample}\n"
                            f"  -> {response.status_code if response else None} "
                            f"{(response.content[:300] if response else b'')!r}"
                        )
    connections.close_all()

    total = sum(calls.values())
    print(
        f"\nschemathesis (seed {SEED}): {EXAMPLES} examples/operation, {len(calls)} labels,"
        f" {total} requests,"
        f" {len(failures)} failures, {sum(filtered.values())} semantic rejections filtered"
    )
    print(f"  phases: {phases}")
    print(f"  statuses: {dict(sorted(statuses.items()))}")
    print(f"  stateful requests: {calls.get('Stateful tests', 0)}")
    print(f"  checks run: {dict(sorted(checks_run.items()))}")
    print(f"  filtered: {dict(filtered)}")
    print(f"  gzip-encoded responses decoded: {in_process_transport['gzip']}")
    assert not errors, "\n".join(errors)
    assert not failures, "\n\n".join(sorted(set(failures))[:40])
    # Coverage, not just absence of failures: every phase that should run ran.
    for phase in ("examples", "coverage", "fuzzing", "stateful"):
        assert phases.get(phase, ("skipped",))[0] in ("success",), phases
    assert total > 20 * EXAMPLES
    assert checks_run["problem_json"] > 0 and checks_run["response_schema_conformance"] > 0


# --- hostile strings in every input ----------------------------------------------------------
#
# Schemathesis rarely draws the characters PostgreSQL cannot store. This walks the same
# OpenAPI document and puts each hostile string into every string input of every
# operation, one input at a time: each path, query and header parameter, and each string
# member of each request body (nested ones too). Every answer must be a 4xx problem (or a
# success), never a 5xx.

HOSTILE = ["\x00", "a\x00b", "\ud800", "x" * 5000, "\x7f\x1b[0m", "../..", "%00", "' OR 1=1 --"]
# What a URL or a header can carry of those (a lone surrogate cannot be encoded).
RAW_URL = ["%00", "a%00b", "%ED%A0%80", "%FF", "x" * 3000, "..%2F..", "%27%20OR%201%3D1"]
NOT_OBJECTS = [b'""', b"null", b"[]", b"0", b'"x"', b"true", b"[{}]"]
HEADER_VALUES = ["\x00", "a\x00b", "x" * 3000, "\x7f", "' OR 1=1 --"]


def _base_bodies(world: dict[str, str]) -> dict[str, Any]:
    ns, kind = world["namespace"], world["kind"]
    op = {"op": "put", "namespace": ns, "kind": kind, "slug": "h-UNIQ", "content": {"a": "UNIQ"}}
    return {
        "batch": {"ops": [op], "comment": "c", "dry_run": True},
        "branches_create": {"name": "hb-UNIQ", "comment": "c"},
        "branches_merge": {"dry_run": True, "comment": "c"},
        "changesets_revert": {"dry_run": True, "comment": "c"},
        "delete_by_query": {
            "namespace": ns,
            "kind": kind,
            "slug_prefix": "zz",
            "dry_run": True,
            "comment": "c",
        },
        "entities_put": {"content": {"a": "UNIQ"}, "comment": "c"},
        "entities_patch": {"patch": {"a": "UNIQ"}, "comment": "c"},
        "entities_delete": {"comment": "c"},
        "namespaces_create": {"name": "hostile.UNIQ", "protected": False},
        "namespaces_update": {"protected": False},
        "grants_put": {"role": "reader"},
        "subscriptions_create": {"name": "n", "url": "http://hooks.test/", "namespaces": [ns]},
        "subscriptions_update": {
            "name": "n",
            "url": "http://hooks.test/",
            "cursor": world["cursor"],
        },
        "changesets_import": {
            "envelope": {
                "schema_version": 1,
                "changeset_id": str(uuid.uuid4()),
                "author": "a",
                "at": "2026-01-01T00:00:00.000Z",
                "rpc": "PutEntity",
                "branch": "",
                "comment": "c",
            },
            "op": {
                "op": "create",
                "namespace": ns,
                "kind": kind,
                "slug": "imp-UNIQ",
                "before": None,
                "after": {"a": "b"},
            },
        },
    }


def _string_slots(value: Any, path: tuple = ()) -> list[tuple]:
    """Paths to every string (and every object key, as ``("<key>",)``) inside ``value``."""
    if isinstance(value, str):
        return [path]
    slots: list[tuple] = []
    if isinstance(value, dict):
        slots.append((*path, "<key>"))
        for name, item in value.items():
            slots += _string_slots(item, (*path, name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            slots += _string_slots(item, (*path, index))
    return slots


def _replace(value: Any, path: tuple, hostile: str) -> Any:
    value = json.loads(json.dumps(value))
    if path[-1] == "<key>":
        target = value
        for step in path[:-1]:
            target = target[step]
        target[hostile] = "v"
        return value
    target = value
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = hostile
    return value


def _hostile_requests(raw: dict[str, Any], world: dict[str, str]) -> list[tuple]:
    """(operation, method, path, query, headers, body bytes, content type) to send."""
    sub = str(Subscription.objects.values_list("id", flat=True).first())
    path_values = {
        "namespace": world["namespace"],
        "kind": world["kind"],
        "slug": world["slug"],
        "changeset_id": world["changeset_id"],
        "principal_type": "user",
        "principal": "fuzz-staff",
        "subscription_id": sub,
    }
    bodies = _base_bodies(world)
    out = []
    for template, item in raw["paths"].items():
        for method, operation in item.items():
            op_id = operation["operationId"]
            params = operation.get("parameters", [])

            def url(override: tuple | None = None, _template: str = template) -> str:
                values = dict(path_values)
                values["name"] = (
                    world["namespace"]
                    if _template.startswith("/api/v1/namespaces")
                    else world["name"]
                )
                path = _template
                for name, value in values.items():
                    raw_value = value if override is None or override[0] != name else override[1]
                    path = path.replace("{" + name + "}", raw_value)
                return path

            body = bodies.get(op_id) or (
                bodies["entities_delete"] if op_id == "entities_delete" else None
            )
            ctype = "application/json"

            def encode(value: Any, _op_id: str = op_id) -> bytes | None:
                if value is None:
                    return None
                if _op_id == "changesets_import":
                    text = json.dumps(value["envelope"]) + "\n" + json.dumps(value["op"])
                else:
                    text = json.dumps(value)
                # Every write changes something, so what it carries reaches the database.
                return text.replace("UNIQ", uuid.uuid4().hex[:12]).encode()

            if op_id == "changesets_import":
                ctype = "application/x-ndjson"
            for p in params:
                if p["in"] == "path":
                    for bad in RAW_URL:
                        out.append(
                            (op_id, method, url((p["name"], bad)), "", {}, encode(body), ctype)
                        )
                elif p["in"] == "query":
                    for bad in RAW_URL:
                        query = f"{p['name']}={bad}"
                        out.append((op_id, method, url(), query, {}, encode(body), ctype))
                elif p["in"] == "header":
                    for bad in HEADER_VALUES:
                        out.append(
                            (op_id, method, url(), "", {p["name"]: bad}, encode(body), ctype)
                        )
            if body is not None and op_id != "changesets_import":
                # A body that is JSON but not an object ("" and null included) is 422,
                # never taken for "no body".
                for whole in NOT_OBJECTS:
                    out.append((op_id, method, url(), "", {}, whole, ctype))
            for slot in _string_slots(body) if body is not None else []:
                for bad in HOSTILE:
                    out.append(
                        (op_id, method, url(), "", {}, encode(_replace(body, slot, bad)), ctype)
                    )
    return out


def test_hostile_strings_in_every_input_are_refused_never_a_500(seeded):
    from django.test import Client as DjangoClient

    from changesets.outbox.subscriptions import subscription_create

    subscription_create(actor=None, name="s", url="http://hooks.test/")
    raw = json.loads(DjangoClient().get("/api/schema/", {"format": "json"}).content)
    client = DjangoClient(HTTP_AUTHORIZATION=f"Token {seeded['token']}")
    statuses: collections.Counter[int] = collections.Counter()
    requests_ = _hostile_requests(raw, seeded)
    failures: list[str] = []
    for op_id, method, path, query, headers, body, ctype in requests_:
        kwargs: dict[str, Any] = {"headers": headers, "QUERY_STRING": query}
        if body is not None:
            kwargs.update(data=body, content_type=ctype)
        try:
            response = getattr(client, method)(path, **kwargs)
        except Exception as exc:  # the test client re-raises what the server would 500 on
            failures.append(
                f"{type(exc).__name__} {op_id}: {path}?{query} {headers} {body!r}"[:300]
            )
            continue
        statuses[response.status_code] += 1
        if body in NOT_OBJECTS and response.status_code < 400:
            failures.append(f"{response.status_code} for a non-object body {body!r}: {op_id}")
        if response.status_code >= 500:
            failures.append(f"{op_id}: {path}?{query} {headers} {body!r}"[:300])
        elif response.status_code >= 400:
            assert response["Content-Type"] == PROBLEM_JSON, (op_id, path)
            assert json.loads(response.content)["status"] == response.status_code
    print(
        f"\nhostile strings: {len(requests_)} requests, statuses {dict(sorted(statuses.items()))}"
    )
    assert not failures, "\n".join(failures)
    assert len(requests_) > 500
