"""NDJSON changeset files: export format, strict import, round trips.

API.md "Changesets" (NDJSON export/import) and "Decisions that close open
points" (images are bare content objects; line numbers are 1-based, the
envelope is line 1). Every strict-parse failure is a 400 problem naming the
offending line, and nothing is written.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from atlas.api.render import rfc3339
from changesets import ndjson
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical
from changesets.services.apply import changeset_apply
from entities.store import baseline
from tests.atlas.test_errors import assert_problem
from tests.changesets.helpers import (
    assert_json_identical,
    assert_nothing_written,
    key,
    log_snapshot,
    only_revision,
)
from tests.entities.factories import NamespaceFactory

API = "/api/v1"
IMPORT = f"{API}/changesets/import"
NDJSON = "application/x-ndjson"
NS = "acme.orders"
NS2 = "acme.billing"
A = f"{NS}/order/a"
B = f"{NS}/order/b"
C = f"{NS}/order/c"
D = f"{NS}/order/d"
ENVELOPE_KEYS = ["schema_version", "changeset_id", "author", "at", "rpc", "branch", "comment"]
OP_KEYS = ["op", "namespace", "kind", "slug", "before", "after", "changed"]


# --- helpers --------------------------------------------------------------------------------


def batch(actor: Any, *ops: tuple, comment: str = "") -> Changeset:
    built = []
    for spec in ops:
        name, k = spec[0], key(spec[1])
        if name == "put":
            built.append(PutOp(k, spec[2]))
        elif name == "patch":
            built.append(PatchOp(k, spec[2]))
        else:
            built.append(DeleteOp(k))
    result = changeset_apply(
        store=baseline, actor=actor, ops=built, rpc=Rpc.BATCH_MUTATE, comment=comment
    )
    assert result.changeset is not None
    return result.changeset


def content(path: str) -> dict[str, Any] | None:
    entity = baseline.get(key(path))
    return entity.content if entity is not None else None


def envelope(**override: Any) -> dict[str, Any]:
    body = {
        "schema_version": 1,
        "changeset_id": str(uuid.uuid4()),
        "author": "someone",
        "at": "2026-01-02T03:04:05.678Z",
        "rpc": "BatchMutate",
        "branch": "",
        "comment": "from a file",
    }
    body.update(override)
    return body


def op_line(op: str, path: str, before: Any, after: Any, **override: Any) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    body = {"op": op, "namespace": ns, "kind": kind, "slug": slug, "before": before, "after": after}
    body.update(override)
    return body


def without(obj: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != name}


def lines(*items: Any) -> str:
    """NDJSON text; a ``str`` item is taken as a raw line."""
    return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items)


def post_import(client: Any, text: str | bytes, *, dry_run: bool | None = None, **extra: Any):
    url = IMPORT if dry_run is None else f"{IMPORT}?dry_run={'true' if dry_run else 'false'}"
    return client.post(url, data=text, content_type=NDJSON, **extra)


def export(client: Any, changeset: Changeset | str) -> Any:
    cs_id = changeset.id if isinstance(changeset, Changeset) else changeset
    return client.get(f"{API}/changesets/{cs_id}/export")


def export_text(response: Any) -> str:
    assert response.status_code == 200, getattr(response, "content", b"")
    return b"".join(response.streaming_content).decode("utf-8")


def parsed_lines(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text[:-1].split("\n")]


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


@pytest.fixture
def ns2(db):
    return NamespaceFactory(name=NS2)


@pytest.fixture
def seeded(staff, namespace, write):
    """``A`` = {"v": 1} exists; ``B`` does not."""
    write(staff, A, {"v": 1})


# --- export -----------------------------------------------------------------------------------


def test_export_format(api, staff, namespace, write):
    write(staff, B, {"b": 1})
    write(staff, C, {"c": 1})
    cs = batch(
        staff,
        ("put", A, {"a": "ü ☃ 😀", "n": [1, 2.5, None, True]}),
        ("put", B, {"b": 2}),
        ("delete", C),
        comment="export me",
    )

    response = export(api, cs)

    assert response.status_code == 200
    assert response["Content-Type"] == NDJSON
    assert str(cs.id) in response["Content-Disposition"]
    text = export_text(response)
    rows = parsed_lines(text)
    assert list(rows[0]) == [*ENVELOPE_KEYS, "metadata", "context"]
    assert rows[0] == {
        "schema_version": 2,
        "changeset_id": str(cs.id),
        "author": staff.username,
        "at": rfc3339(cs.at),
        "rpc": "BatchMutate",
        "branch": "",
        "comment": "export me",
        "metadata": {},
        "context": {"auth": "system"},
    }
    assert type(rows[0]["schema_version"]) is int
    assert rows[0]["at"] == api.get(f"{API}/changesets/{cs.id}").json()["at"]
    assert [list(r) for r in rows[1:]] == [OP_KEYS] * 3
    assert [canonical(r) for r in rows[1:]] == [
        canonical(
            op_line(
                "create", A, None, {"a": "ü ☃ 😀", "n": [1, 2.5, None, True]}, changed=["/a", "/n"]
            )
        ),
        canonical(op_line("update", B, {"b": 1}, {"b": 2}, changed=["/b"])),
        canonical(op_line("delete", C, {"c": 1}, None, changed=["/c"])),
    ]
    assert "ü ☃ 😀" in text, "export is UTF-8, not \\u-escaped"
    # The strict parser accepts what export produces.
    document = ndjson.parse(text)
    assert [op.line for op in document.ops] == [2, 3, 4]


def test_export_by_a_reader(make_user, client_for, staff, namespace, write):
    cs = write(staff, A, {"v": 1}).changeset
    reader = make_user("rita", reader=[NS])
    rows = parsed_lines(export_text(export(client_for(reader), cs)))
    assert len(rows) == 2


def test_export_only_includes_readable_namespaces(make_user, client_for, staff, namespace, ns2):
    cs = batch(
        staff,
        ("put", f"{NS2}/invoice/i1", {"i": 1}),
        ("put", A, {"a": 1}),
        ("put", f"{NS2}/invoice/i2", {"i": 2}),
        ("put", B, {"b": 1}),
    )
    reader = make_user("rita", reader=[NS])
    rows = parsed_lines(export_text(export(client_for(reader), cs)))
    assert [(r["namespace"], r["slug"]) for r in rows[1:]] == [(NS, "a"), (NS, "b")]
    everything = parsed_lines(export_text(export(client_for(staff), cs)))
    assert len(everything) == 5

    # A changeset with nothing readable is not found.
    hidden = batch(staff, ("put", f"{NS2}/invoice/i3", {"i": 3}))
    assert_problem(export(client_for(reader), hidden), 404)


@pytest.mark.parametrize("changeset_id", ["5d0a8b4e-3f1c-4b7a-9e26-8c1d2f0a7b13", "nope"])
def test_export_unknown_is_404(api, namespace, changeset_id):
    assert_problem(export(api, changeset_id), 404)


# --- the round trip -----------------------------------------------------------------------------


def test_export_revert_import_round_trip(api, writer, staff, namespace, write):
    write(staff, B, {"b": 1})
    write(staff, D, {"d": 1, "keep": {"x": [1]}})
    original = batch(
        staff,
        ("put", A, {"a": 1}),
        ("patch", B, {"b": 2, "added": "yes"}),
        ("delete", D),
        ("put", C, {"c": "é"}),
        comment="the original",
    )
    after_images = {
        A: {"a": 1},
        B: {"b": 2, "added": "yes"},
        C: {"c": "é"},
        D: None,
    }
    text = export_text(export(api, original))

    reverted = api.post(f"{API}/changesets/{original.id}/revert", {}, format="json")
    assert reverted.status_code == 200, reverted.content
    assert content(A) is None and content(C) is None
    assert_json_identical(content(B), {"b": 1})

    response = post_import(api, text)

    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"changeset", "ops", "dry_run"}
    assert body["dry_run"] is False
    cs = body["changeset"]
    assert cs["rpc"] == "ImportChangeset"
    assert cs["author"] == writer.username, "the importer is the author, not the file's"
    assert cs["comment"] == "the original"
    assert cs["message"] == "ImportChangeset: 4 change(s)"
    assert cs["op_count"] == 4
    for path, image in after_images.items():
        if image is None:
            assert content(path) is None, path
        else:
            assert_json_identical(content(path), image, what=path)
    assert [o["op"] for o in body["ops"]] == ["put", "put", "delete", "put"]
    # The imported changeset exports back to the same ops.
    again = parsed_lines(export_text(export(api, cs["id"])))
    assert [canonical(r) for r in again[1:]] == [canonical(r) for r in parsed_lines(text)[1:]]


def test_import_is_an_ordinary_changeset(api, staff, namespace, write):
    write(staff, A, {"v": 1})
    response = post_import(api, lines(envelope(), op_line("update", A, {"v": 1}, {"v": 2})))
    cs_id = response.json()["changeset"]["id"]
    rev = only_revision(Changeset.objects.get(pk=cs_id))
    assert (rev.op, rev.before_version, rev.after_version) == ("update", 1, 2)
    history = api.get(f"{API}/entities/{A}/history").json()["results"]
    assert history[0]["rpc"] == "ImportChangeset"


# --- import: dry run, conflicts -----------------------------------------------------------------


def test_import_dry_run_writes_nothing_and_reports_ops(api, seeded):
    text = lines(
        envelope(),
        op_line("update", A, {"v": 1}, {"v": 2}),
        op_line("create", B, None, {"b": 1}),
        op_line("delete", A, {"v": 2}, None),
    )
    snapshot = log_snapshot()

    response = post_import(api, text, dry_run=True)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["changeset"] is None
    assert body["dry_run"] is True
    assert body["ops"] == [
        {"op": "put", "namespace": NS, "kind": "order", "slug": "a", "content": {"v": 2}},
        {"op": "put", "namespace": NS, "kind": "order", "slug": "b", "content": {"b": 1}},
        {"op": "delete", "namespace": NS, "kind": "order", "slug": "a"},
    ]
    assert_nothing_written(snapshot)


def test_import_dry_run_false_writes(api, seeded):
    response = post_import(
        api, lines(envelope(), op_line("delete", A, {"v": 1}, None)), dry_run=False
    )
    assert response.status_code == 200, response.content
    assert response.json()["dry_run"] is False
    assert content(A) is None


def test_import_bad_dry_run_is_422(api, seeded):
    snapshot = log_snapshot()
    text = lines(envelope(), op_line("delete", A, {"v": 1}, None))
    response = api.post(f"{IMPORT}?dry_run=maybe", data=text, content_type=NDJSON)
    assert_problem(response, 422)
    assert_nothing_written(snapshot)


def mismatch(path: str, line: int) -> dict[str, Any]:
    ns, kind, slug = path.split("/")
    return {
        "namespace": ns,
        "kind": kind,
        "slug": slug,
        "reason": "preimage_mismatch",
        "line": line,
    }


@pytest.mark.parametrize(
    ("op", "before", "after", "path"),
    [
        ("update", {"v": 0}, {"v": 2}, A),  # content differs
        ("update", {"v": 1.0}, {"v": 2}, A),  # 1.0 is not 1 in JSON
        ("create", None, {"v": 2}, A),  # exists, file says it must not
        ("delete", {"v": 1}, None, B),  # absent, file says it exists
        ("update", {"v": 1}, {"v": 2}, B),
    ],
)
def test_preimage_mismatch_is_409_and_nothing_written(api, seeded, op, before, after, path):
    snapshot = log_snapshot()
    response = post_import(api, lines(envelope(), op_line(op, path, before, after)))
    body = assert_problem(response, 409)
    assert body["type"].endswith("/import-conflict")
    assert body["conflicts"] == [mismatch(path, 2)]
    assert_nothing_written(snapshot)


def test_preimage_compares_json_not_text(api, staff, namespace, write):
    """Key order and whitespace in the file do not matter; the JSON value does."""
    write(staff, A, {"x": 1, "y": {"b": [1, 2], "a": None}})
    line = (
        '{"op":"update","namespace":"acme.orders","kind":"order","slug":"a",'
        '"before":{ "y" : {"a":null,"b":[1,2]}, "x":1 },"after":{"x":2}}'
    )
    response = post_import(api, lines(envelope(), line))
    assert response.status_code == 200, response.content
    assert_json_identical(content(A), {"x": 2})


def test_a_later_mismatch_refuses_the_whole_file(api, seeded, staff, write):
    write(staff, C, {"c": 1})
    text = lines(
        envelope(),
        op_line("update", A, {"v": 1}, {"v": 2}),  # would apply
        op_line("create", B, None, {"b": 1}),  # would apply
        op_line("update", C, {"c": "stale"}, {"c": 2}),  # does not
    )
    snapshot = log_snapshot()
    body = assert_problem(post_import(api, text), 409)
    assert body["conflicts"] == [mismatch(C, 4)]
    assert_nothing_written(snapshot)
    # Nor on a dry run.
    assert_problem(post_import(api, text, dry_run=True), 409)
    assert_nothing_written(snapshot)


def test_every_mismatch_is_listed(api, seeded):
    text = lines(
        envelope(),
        op_line("update", A, {"v": 9}, {"v": 2}),
        op_line("delete", B, {"b": 1}, None),
    )
    body = assert_problem(post_import(api, text), 409)
    assert body["conflicts"] == [mismatch(A, 2), mismatch(B, 3)]


def test_reimporting_an_applied_file_conflicts(api, seeded):
    text = lines(envelope(), op_line("update", A, {"v": 1}, {"v": 2}))
    assert post_import(api, text).status_code == 200
    snapshot = log_snapshot()
    body = assert_problem(post_import(api, text), 409)
    assert body["conflicts"] == [mismatch(A, 2)]
    assert_nothing_written(snapshot)


# --- import: one key several times --------------------------------------------------------------


def test_key_twice_applies_in_order_update_then_delete(api, seeded):
    text = lines(
        envelope(),
        op_line("update", A, {"v": 1}, {"v": 2}),
        op_line("delete", A, {"v": 2}, None),
    )
    response = post_import(api, text)
    assert response.status_code == 200, response.content
    assert content(A) is None
    rev = only_revision(Changeset.objects.get(pk=response.json()["changeset"]["id"]))
    assert rev.op == "delete"
    assert_json_identical(rev.before, {"v": 1})
    assert [o["op"] for o in response.json()["ops"]] == ["put", "delete"]


def test_key_twice_applies_in_order_create_then_update(api, seeded):
    text = lines(
        envelope(),
        op_line("create", B, None, {"b": 1}),
        op_line("update", B, {"b": 1}, {"b": 2}),
    )
    response = post_import(api, text)
    assert response.status_code == 200, response.content
    assert_json_identical(content(B), {"b": 2})


def test_key_twice_in_the_wrong_order_conflicts(api, seeded):
    text = lines(
        envelope(),
        op_line("delete", A, {"v": 2}, None),
        op_line("update", A, {"v": 1}, {"v": 2}),
    )
    snapshot = log_snapshot()
    body = assert_problem(post_import(api, text), 409)
    assert body["conflicts"] == [mismatch(A, 2), mismatch(A, 3)]
    assert_nothing_written(snapshot)


def test_envelope_only_file_writes_nothing(api, seeded):
    snapshot = log_snapshot()
    response = post_import(api, lines(envelope()))
    assert response.status_code == 200, response.content
    assert response.json() == {"changeset": None, "ops": [], "dry_run": False}
    assert_nothing_written(snapshot)


def test_crlf_line_endings_are_accepted(api, seeded):
    text = lines(envelope(), op_line("update", A, {"v": 1}, {"v": 2})).replace("\n", "\r\n")
    response = post_import(api, text)
    assert response.status_code == 200, response.content
    assert_json_identical(content(A), {"v": 2})


def test_file_without_final_newline_is_accepted(api, seeded):
    text = lines(envelope(), op_line("update", A, {"v": 1}, {"v": 2})).rstrip("\n")
    assert post_import(api, text).status_code == 200
    assert_json_identical(content(A), {"v": 2})


# --- import: strict parsing, every failure names its line ---------------------------------------

GOOD_OP = op_line("update", A, {"v": 1}, {"v": 2})
GOOD_OP2 = op_line("create", B, None, {"b": 1})


def _bad_image_cases() -> list[Any]:
    cases = []
    for name in ("before", "after"):
        for value in ([1, 2], "text", 3, True, [{"v": 1}]):
            line = {**op_line("update", A, {"v": 1}, {"v": 2}), name: value}
            cases.append(pytest.param(lines(envelope(), line), 2, id=f"{name}-{value!r}"))
    return cases


STRICT_FAILURES = [
    # the file as a whole
    pytest.param("", 1, id="empty-body"),
    pytest.param("\n", 1, id="only-a-newline"),
    # bad JSON
    pytest.param(lines("{not json", GOOD_OP), 1, id="bad-json-line-1"),
    pytest.param(lines(envelope(), GOOD_OP2, '{"op": "update",'), 3, id="bad-json-line-3"),
    pytest.param(lines(envelope(), GOOD_OP2, ""), 3, id="blank-line-3"),
    pytest.param(lines(envelope(), "", GOOD_OP2), 2, id="blank-line-2"),
    pytest.param(lines(envelope(), '{"op": "update", "before": NaN}'), 2, id="nan-literal"),
    pytest.param(lines(envelope(), "[" * 100_000 + "]" * 100_000), 2, id="deep-nesting"),
    pytest.param(lines(envelope(), GOOD_OP2, "{} {}"), 3, id="two-objects-on-a-line"),
    # not an object
    pytest.param(lines(envelope(), [GOOD_OP2]), 2, id="line-2-is-an-array"),
    pytest.param(lines([envelope()], GOOD_OP2), 1, id="line-1-is-an-array"),
    pytest.param(lines(envelope(), GOOD_OP2, "null"), 3, id="line-3-is-null"),
    pytest.param(lines('"envelope"', GOOD_OP2), 1, id="line-1-is-a-string"),
    # envelope keys
    pytest.param(lines(envelope(extra=1), GOOD_OP), 1, id="envelope-unknown-key"),
    *[
        pytest.param(lines(without(envelope(), name), GOOD_OP), 1, id=f"envelope-missing-{name}")
        for name in ENVELOPE_KEYS
    ],
    # schema_version
    *[
        pytest.param(lines(envelope(schema_version=value), GOOD_OP), 1, id=f"schema-{value!r}")
        for value in (3, "1", 0, True, None, 1.5, [1])
    ],
    # envelope values
    pytest.param(lines(envelope(changeset_id="abc"), GOOD_OP), 1, id="changeset-id-not-uuid"),
    pytest.param(lines(envelope(changeset_id=7), GOOD_OP), 1, id="changeset-id-number"),
    pytest.param(lines(envelope(at="yesterday"), GOOD_OP), 1, id="at-garbage"),
    pytest.param(lines(envelope(at="2026-01-02"), GOOD_OP), 1, id="at-date-only"),
    pytest.param(lines(envelope(at="2026-01-02T03:04:05"), GOOD_OP), 1, id="at-no-offset"),
    pytest.param(lines(envelope(at="2026-13-02T03:04:05Z"), GOOD_OP), 1, id="at-month-13"),
    pytest.param(lines(envelope(at=1700000000), GOOD_OP), 1, id="at-number"),
    pytest.param(lines(envelope(rpc="Nope"), GOOD_OP), 1, id="rpc-unknown"),
    pytest.param(lines(envelope(rpc="batchmutate"), GOOD_OP), 1, id="rpc-case"),
    pytest.param(lines(envelope(rpc=None), GOOD_OP), 1, id="rpc-null"),
    pytest.param(lines(envelope(author=None), GOOD_OP), 1, id="author-null"),
    pytest.param(lines(envelope(branch=1), GOOD_OP), 1, id="branch-number"),
    pytest.param(lines(envelope(comment={"c": 1}), GOOD_OP), 1, id="comment-object"),
    # op-line keys
    pytest.param(lines(envelope(), GOOD_OP2, {**GOOD_OP, "content": {}}), 3, id="op-unknown-key"),
    *[
        pytest.param(lines(envelope(), without(GOOD_OP, name)), 2, id=f"op-missing-{name}")
        for name in OP_KEYS
        if name != "changed"  # optional: import computes its own
    ],
    # images
    *_bad_image_cases(),
    pytest.param(
        lines(envelope(), op_line("update", A, {"v": 1}, {"v": "nul\u0000"})), 2, id="nul-in-after"
    ),
    # op vs images
    pytest.param(
        lines(envelope(), op_line("create", B, {"b": 0}, {"b": 1})), 2, id="create-with-before"
    ),
    pytest.param(lines(envelope(), op_line("create", B, None, None)), 2, id="create-without-after"),
    pytest.param(
        lines(envelope(), op_line("delete", A, {"v": 1}, {"v": 2})), 2, id="delete-with-after"
    ),
    pytest.param(
        lines(envelope(), op_line("delete", A, None, None)), 2, id="delete-without-before"
    ),
    pytest.param(
        lines(envelope(), op_line("update", A, None, {"v": 2})), 2, id="update-without-before"
    ),
    pytest.param(
        lines(envelope(), op_line("update", A, {"v": 1}, None)), 2, id="update-without-after"
    ),
    # op name
    *[
        pytest.param(lines(envelope(), GOOD_OP2, {**GOOD_OP, "op": value}), 3, id=f"op-{value!r}")
        for value in ("put", "CREATE", "", None, 1, "patch")
    ],
    # names
    *[
        pytest.param(lines(envelope(), {**GOOD_OP, "namespace": value}), 2, id=f"ns-{value!r}")
        for value in ("Acme.Orders", "", "acme..orders", "acme orders", 5, None)
    ],
    *[
        pytest.param(lines(envelope(), {**GOOD_OP, "kind": value}), 2, id=f"kind-{value!r}")
        for value in ("Order", "1order", "", "or-der", None)
    ],
    *[
        pytest.param(lines(envelope(), {**GOOD_OP, "slug": value}), 2, id=f"slug-{value!r}"[:40])
        for value in ("has space", "", "x" * 201, "a/b", None, 3)
    ],
]


@pytest.mark.parametrize(("text", "line"), STRICT_FAILURES)
def test_strict_parse_failure_is_400_at_the_line(api, seeded, text, line):
    snapshot = log_snapshot()
    response = post_import(api, text)
    body = assert_problem(response, 400, pointer=f"/line/{line}")
    assert body["type"].endswith("/invalid-ndjson")
    assert f"Line {line}" in body["detail"]
    assert_nothing_written(snapshot)


@pytest.mark.parametrize(("text", "line"), STRICT_FAILURES)
def test_strict_parse_failure_on_a_dry_run_too(api, seeded, text, line):
    assert_problem(post_import(api, text, dry_run=True), 400, pointer=f"/line/{line}")


def test_schema_version_float_one_is_refused(api, seeded):
    """JSON's 1.0 is not the integer 1 (Python's == would say it is)."""
    text = lines(envelope(), GOOD_OP).replace('"schema_version": 1,', '"schema_version": 1.0,')
    assert '"schema_version": 1.0' in text
    assert_problem(post_import(api, text), 400, pointer="/line/1")


def test_invalid_utf8_names_its_line(api, seeded):
    text = lines(envelope(), GOOD_OP2).encode() + b'{"op": "\xff\xfe"}\n'
    snapshot = log_snapshot()
    assert_problem(post_import(api, text), 400, pointer="/line/3")
    assert_nothing_written(snapshot)


def test_the_first_bad_line_is_reported(api, seeded):
    """An envelope missing a key (line 1) and bad JSON (line 3): line 1 is named."""
    text = lines(without(envelope(), "comment"), GOOD_OP2, "{oops")
    assert_problem(post_import(api, text), 400, pointer="/line/1")
    text = lines(envelope(), {**GOOD_OP2, "op": "bad"}, "{oops")
    assert_problem(post_import(api, text), 400, pointer="/line/2")


def test_out_of_range_number_is_refused_without_a_500(api, seeded):
    text = lines(
        envelope(),
        '{"op": "update", "namespace": "acme.orders", "kind": "order",'
        ' "slug": "a", "before": {"v": 1}, "after": {"v": 1e400}}',
    )
    snapshot = log_snapshot()
    response = post_import(api, text)
    assert response.status_code in (400, 422), response.content
    assert_problem(response, response.status_code)
    assert_nothing_written(snapshot)


def test_parse_accepts_its_own_export_of_a_big_changeset(staff, namespace):
    cs = batch(staff, *[("put", f"{NS}/order/o{i}", {"i": i}) for i in range(50)])
    revisions = list(Revision.objects.filter(changeset=cs).order_by("id"))
    text = "".join(ndjson.export_lines(cs, revisions))
    document = ndjson.parse(text.encode())
    assert len(document.ops) == 50
    assert document.ops[-1].line == 51


# --- import: media type, permissions, limits, idempotency ---------------------------------------


@pytest.mark.parametrize(
    "content_type", ["application/json", "text/plain", "application/x-ndjsonx"]
)
def test_wrong_content_type_is_415(api, seeded, content_type):
    text = lines(envelope(), GOOD_OP)
    snapshot = log_snapshot()
    assert_problem(api.post(IMPORT, data=text, content_type=content_type), 415)
    assert_nothing_written(snapshot)


def test_content_type_with_charset_is_accepted(api, seeded):
    text = lines(envelope(), GOOD_OP)
    response = api.post(IMPORT, data=text, content_type=f"{NDJSON}; charset=utf-8")
    assert response.status_code == 200, response.content


def test_reader_gets_403_and_nothing_written(make_user, client_for, seeded):
    reader = make_user("rita", reader=[NS])
    snapshot = log_snapshot()
    assert_problem(post_import(client_for(reader), lines(envelope(), GOOD_OP)), 403)
    assert_problem(post_import(client_for(reader), lines(envelope(), GOOD_OP), dry_run=True), 403)
    assert_nothing_written(snapshot)


def test_no_role_on_the_namespace_is_404_and_nothing_written(make_user, client_for, seeded, ns2):
    stranger = make_user("sam", writer=[NS2])
    snapshot = log_snapshot()
    assert_problem(post_import(client_for(stranger), lines(envelope(), GOOD_OP)), 404)
    assert_nothing_written(snapshot)


def test_one_unwritable_namespace_refuses_the_whole_file(make_user, client_for, seeded, ns2):
    user = make_user("half", writer=[NS], reader=[NS2])
    text = lines(envelope(), GOOD_OP, op_line("create", f"{NS2}/invoice/i", None, {"i": 1}))
    snapshot = log_snapshot()
    assert_problem(post_import(client_for(user), text), 403)
    assert_nothing_written(snapshot)


def test_protected_namespace_needs_maintainer(make_user, client_for, staff, protected_namespace):
    path = f"{protected_namespace.name}/rule/r"
    text = lines(envelope(), op_line("create", path, None, {"r": 1}))
    plain = make_user("will", writer=[protected_namespace.name])
    maintainer = make_user("mary", maintainer=[protected_namespace.name])
    snapshot = log_snapshot()
    assert_problem(post_import(client_for(plain), text), 403)
    assert_nothing_written(snapshot)
    assert post_import(client_for(maintainer), text).status_code == 200
    assert_json_identical(content(path), {"r": 1})


def test_missing_namespace_is_404(api, seeded):
    text = lines(envelope(), op_line("create", "acme.nowhere/order/x", None, {"x": 1}))
    snapshot = log_snapshot()
    assert_problem(post_import(api, text), 404)
    assert_nothing_written(snapshot)


def test_anonymous_is_401(client_for, seeded):
    assert post_import(client_for(None), lines(envelope(), GOOD_OP)).status_code == 401


def test_body_over_the_limit_is_413(api, seeded, settings):
    settings.ATLAS_MAX_BODY_BYTES = 200
    text = lines(envelope(), op_line("update", A, {"v": 1}, {"v": "x" * 500}))
    snapshot = log_snapshot()
    assert_problem(post_import(api, text), 413)
    assert_nothing_written(snapshot)


def test_idempotency_key_replays_an_import(api, seeded):
    text = lines(envelope(), GOOD_OP)
    first = post_import(api, text, HTTP_IDEMPOTENCY_KEY="imp-1")
    assert first.status_code == 200, first.content
    snapshot = log_snapshot()
    second = post_import(api, text, HTTP_IDEMPOTENCY_KEY="imp-1")
    assert second.status_code == 200
    assert second["Idempotent-Replayed"] == "true"
    assert second.content == first.content
    assert_nothing_written(snapshot)
    assert Changeset.objects.filter(rpc=Rpc.IMPORT_CHANGESET).count() == 1
