"""A revision stores its before image as what differs from after (``changesets.undo``, 0029).

The rule is only worth its bytes if the rebuild gives back exactly the image
the ``before`` column used to hold: the same members, the same values printed
the same way (``1`` is not ``1.0``), in the same key order. These tests pin
that for hostile pairs (nested objects, arrays, nulls, numbers, unicode and
empty keys, empty objects, members added, removed and retyped), in SQL
(``atlas_before_image``) and in Python (``Revision.before``, history rows),
through the real write path, and the feed's shortcut against the long way.
"""

from __future__ import annotations

import io
import itertools
import json
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changesets.canonical import canonical
from changesets.models import Op, Revision
from changesets.selectors import feed_values, keys
from changesets.selectors.log import entity_history
from changesets.undo import before_image, jsonb_key_order
from entities.validation import as_stored
from tests.changesets.helpers import key

pytestmark = pytest.mark.django_db

NS = "acme.orders"
# Names of different byte lengths and scripts: jsonb orders members by length first.
NAMES = ["a", "b", "ab", "Z", "", "é", "ü", "日本", "a/b", "m~n", "1", "zzz", "aé"]

names = st.sampled_from(NAMES)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, 1, 1.0, 1.5, -1, 0.1, 10**20, "1", "", "é", "[erased]"]),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: f or 0.0),
    st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=4),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(names, inner, max_size=3)),
    max_leaves=8,
)
documents = st.dictionaries(names, values, max_size=6)


@st.composite
def updates(draw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(before, after): after is before with members removed, retyped, changed or added,
    some to values that are equal in Python but print differently (``1``, ``1.0``)."""
    before = draw(documents)
    kept = draw(st.lists(st.booleans(), min_size=len(before), max_size=len(before)))
    after = {k: v for (k, v), keep in zip(before.items(), kept, strict=True) if keep}
    after.update(draw(st.dictionaries(names, values, max_size=3)))
    for name, value in before.items():
        if isinstance(value, int) and not isinstance(value, bool) and draw(st.booleans()):
            after[name] = float(value) if abs(value) < 2**50 else value
    return before, after


def sql_stored(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the log stores for ``before`` → ``after`` and what it rebuilds, as jsonb texts."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT b::text, a::text, u.undo::text, u.undo_gone,"
            " atlas_before_image('update', a, u.undo, u.undo_gone)::text"
            " FROM (SELECT %s::jsonb AS b, %s::jsonb AS a) x CROSS JOIN LATERAL atlas_undo(b, a) u",
            [json.dumps(before), json.dumps(after)],
        )
        b, a, undo, gone, rebuilt = cursor.fetchone()
    return {"before": b, "after": a, "undo": undo, "gone": gone, "rebuilt": rebuilt}


def member_texts(image_text: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT key, value::text FROM jsonb_each(%s::jsonb)", [image_text])
        return dict(cursor.fetchall())


def ordered(value: Any) -> str:
    """A decoded image as text, keeping its key order (``json.dumps`` without sorting)."""
    return json.dumps(value, ensure_ascii=False)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(pair=updates())
def test_the_rebuilt_before_image_is_the_stored_one_byte_for_byte(pair):
    before, after = pair
    got = sql_stored(before, after)
    # SQL: the rebuild prints exactly as the whole image did.
    assert got["rebuilt"] == got["before"]
    # What is stored is what differs, by printed text, and nothing else.
    b, a = member_texts(got["before"]), member_texts(got["after"])
    undo = member_texts(got["undo"]) if got["undo"] is not None else {}
    assert undo == {k: v for k, v in b.items() if a.get(k) != v}
    assert sorted(got["gone"] or []) == sorted(k for k in a if k not in b)
    assert got["gone"] != []  # NULL, never an empty array
    # Python: the rebuild from decoded columns is the decoded whole image, in its order.
    rebuilt = before_image(
        Op.UPDATE,
        json.loads(got["after"]),
        None if got["undo"] is None else json.loads(got["undo"]),
        got["gone"],
    )
    assert ordered(rebuilt) == ordered(json.loads(got["before"]))


def test_key_order_is_jsonb_order():
    names_in_order = list(json.loads(sql_stored({n: 1 for n in NAMES}, {})["before"]))
    assert names_in_order == [n for n, _ in sorted(((n, 1) for n in NAMES), key=jsonb_key_order)]


@pytest.mark.parametrize(
    ("before", "after", "undo", "gone"),
    [
        ({"a": 1, "b": {"c": [1, 2]}}, {"a": 2, "b": {"c": [1, 2]}}, {"a": 1}, None),
        ({"a": 1}, {"a": 1.0}, {"a": 1}, None),  # equal as jsonb numbers, not as JSON
        ({"a": 1, "b": 2}, {"a": 1}, {"b": 2}, None),  # removed
        ({"a": 1}, {"a": 1, "new": None}, None, ["new"]),  # added only: nothing to undo
        ({"a": {}}, {"a": []}, {"a": {}}, None),  # retyped
        ({"a": None}, {}, {"a": None}, None),  # a null member removed is still undone
    ],
)
def test_what_an_update_stores(before, after, undo, gone):
    got = sql_stored(before, after)
    assert (None if got["undo"] is None else json.loads(got["undo"])) == undo
    assert got["gone"] == gone
    assert json.loads(got["rebuilt"]) == before


# --- through the write path ------------------------------------------------------------------

_slugs = itertools.count()


def stored(revision_id: int) -> tuple[Any, Any, str | None]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT undo::text, undo_gone,"
            " atlas_before_image(op, after, undo, undo_gone)::text FROM changesets_revision"
            " WHERE id = %s",
            [revision_id],
        )
        return cursor.fetchone()


def test_each_op_stores_its_shape(staff, namespace, write):
    path = f"{NS}/order/shape"
    created = write(staff, path, {"a": 1, "b": {"x": [1]}}).changeset.revisions.get()
    updated = write(staff, path, {"a": 2, "b": {"x": [1]}, "c": 3}).changeset.revisions.get()
    deleted = write(staff, path, None).changeset.revisions.get()
    assert stored(created.id) == (None, None, None)
    assert stored(updated.id) == ('{"a": 1}', ["c"], '{"a": 1, "b": {"x": [1]}}')
    assert stored(deleted.id) == ('{"a": 2, "b": {"x": [1]}, "c": 3}', None) + (
        '{"a": 2, "b": {"x": [1]}, "c": 3}',
    )
    assert (created.before, updated.before, deleted.before) == (
        None,
        {"a": 1, "b": {"x": [1]}},
        {"a": 2, "b": {"x": [1]}, "c": 3},
    )


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(pair=updates())
def test_every_reader_sees_the_before_image_the_write_was_given(staff, namespace, write, pair):
    before, after = pair
    path = f"{NS}/order/h{next(_slugs)}"
    first = write(staff, path, before)
    second = write(staff, path, after)
    if second.changeset is None:  # the same content: nothing written
        return
    # The exact image: the create's after, as jsonb gave it back.
    created = Revision.objects.get(changeset=first.changeset)
    expected = ordered(created.after)
    revision = Revision.objects.get(changeset=second.changeset)
    assert ordered(revision.before) == expected
    with connection.cursor() as cursor:
        cursor.execute("SELECT after::text FROM changesets_revision WHERE id = %s", [created.id])
        assert stored(revision.id)[2] == cursor.fetchone()[0]
    row = entity_history(key=key(path), limit=1)[0]
    assert ordered(row.before) == expected
    by_namespace = keys.namespace_revisions(where=keys.RevisionFilter(namespace=NS), limit=1)
    assert ordered(by_namespace[0].before) == expected
    (listed,) = Revision.objects.filter(pk=revision.pk).values_list("before", flat=True)
    assert ordered(listed) == expected
    # The write's own instances carry the image as the write held it (its order).
    assert canonical(second.revisions[0].before) == canonical(as_stored(before))


def test_values_and_values_list_still_name_before(staff, namespace, write):
    path = f"{NS}/order/v"
    write(staff, path, {"a": 1, "b": 2})
    write(staff, path, {"a": 1, "b": 3})
    rows = Revision.objects.filter(slug="v").order_by("seq")
    assert list(rows.values_list("op", "before")) == [
        ("create", None),
        ("update", {"a": 1, "b": 2}),
    ]
    assert [r["before"] for r in rows.values("before", "after")] == [None, {"a": 1, "b": 2}]


# --- the feed's shortcut against the long way ----------------------------------------------


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(pair=updates())
def test_changed_values_from_the_stored_form_are_the_long_ways(pair):
    before, after = pair
    # Decoded as a reader gets them: jsonb key order, jsonb's numbers.
    b = json.loads(json.dumps(dict(sorted(before.items(), key=jsonb_key_order))))
    a = json.loads(json.dumps(dict(sorted(after.items(), key=jsonb_key_order))))
    undo = {k: v for k, v in b.items() if k not in a or json.dumps(a[k]) != json.dumps(v)}
    gone = [k for k in a if k not in b] or None
    fast = feed_values.stored_changed_values(Op.UPDATE, a, undo or None, gone)
    slow = feed_values.changed_values(b, a)
    assert [ordered(x) for x in fast] == [ordered(x) for x in slow]
    for op, image_b, image_a in (("create", None, a), ("delete", b, None)):
        fast = feed_values.stored_changed_values(op, image_a, image_b, None)
        assert [ordered(x) for x in fast] == [
            ordered(x) for x in feed_values.changed_values(image_b, image_a)
        ]


# --- the guard: an erasure's UPDATE in the new shape, and nothing else -----------------------


def test_the_guard_admits_an_erasure_and_refuses_a_forged_undo(staff, namespace, write):
    path = f"{NS}/order/g"
    write(staff, path, {"email": "x@example.org", "n": 1, "m": 1})
    revision = write(staff, path, {"email": "x@example.org", "n": 2, "m": 1}).changeset
    rid = Revision.objects.get(changeset=revision).pk
    refused = [
        # undo gains a value that is no erasure: the rebuilt before image changes
        "UPDATE changesets_revision SET undo = undo || '{\"m\": 5}', salt = NULL,"
        " sealed = '{}' WHERE id = %s",
        # a member claimed to be new in after: before loses it
        "UPDATE changesets_revision SET undo_gone = ARRAY['m'], salt = NULL,"
        " sealed = '{}' WHERE id = %s",
        # an unchanged member edited in after (so in before too)
        "UPDATE changesets_revision SET after = jsonb_set(after, '{m}', '7'), salt = NULL,"
        " sealed = '{}' WHERE id = %s",
    ]
    for sql in refused:
        sid = transaction.savepoint()
        with pytest.raises(Exception, match="append-only"), connection.cursor() as cursor:
            cursor.execute("SET LOCAL atlas.erasing = 'on'")
            cursor.execute(sql, [rid])
        transaction.savepoint_rollback(sid)
    with connection.cursor() as cursor:  # an unchanged member erased: after alone holds it
        cursor.execute("SET LOCAL atlas.erasing = 'on'")
        cursor.execute(
            "UPDATE changesets_revision SET after = jsonb_set(after, '{email}', '\"[erased]\"'),"
            " salt = NULL, sealed = '{}' WHERE id = %s",
            [rid],
        )
        assert cursor.rowcount == 1
    assert Revision.objects.get(pk=rid).before == {"m": 1, "n": 1, "email": "[erased]"}


# --- migration 0029 on a populated log, and back ----------------------------------------------

MIGRATION = "changesets.migrations.0029_revision_before_delta"


def _partition_indexes() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename LIKE 'changesets_revision_p%%'"
            " ORDER BY 1"
        )
        return [r[0] for r in cursor.fetchall()]


def _images() -> dict[int, tuple[str, str | None, str | None]]:
    """Per revision: op and both images as jsonb texts (rebuilt in SQL when stored as undo)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'changesets_revision' AND column_name = 'undo'"
        )
        before = "atlas_before_image(op, after, undo, undo_gone)" if cursor.fetchone() else "before"
        cursor.execute(f"SELECT id, op, {before}::text, after::text FROM changesets_revision")
        return {rid: (op, b, a) for rid, op, b, a in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_migration_converts_a_populated_log_and_back(staff, namespace, write, monkeypatch):
    import importlib

    from django.core.management import call_command
    from django.db.migrations.executor import MigrationExecutor

    from tests.changesets.partition_helpers import layout, standard
    from tests.changesets.test_partitions import _shape

    layout([(0, 4), (4, 9), (9, 1000)])  # rows across three partitions, one left alone
    try:
        contents = [
            {"a": 1, "b": {"c": [1, None]}, "é": "ü"},
            {"a": 1.0, "b": {"c": [1, None]}, "é": "ü"},
            {"a": 1.0, "b": {}, "日本": []},
            {"a": 1.0, "b": {}, "日本": [], "": None},
            {"": None},
        ]
        for content in contents:
            write(staff, f"{NS}/order/x", content)
        write(staff, f"{NS}/order/x", None)
        for n in range(3):
            write(staff, f"{NS}/order/y", {"n": n, "same": "s" * 50})
        images = _images()
        stored = {r.id: (r.undo, r.undo_gone) for r in Revision.objects.all()}
        assert any(undo_gone for _, undo_gone in stored.values())
        shape, indexes = _shape(), _partition_indexes()
        monkeypatch.setattr(importlib.import_module(MIGRATION), "CHUNK_SEQS", 2)

        executor = MigrationExecutor(connection)
        executor.migrate([("changesets", "0028_leaner_log_indexes")])
        assert _images() == images  # whole images again, byte for byte
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM changesets_revision WHERE before IS NULL")
            assert cursor.fetchone()[0] == 2  # the two creates

        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
        assert _images() == images
        assert {r.id: (r.undo, r.undo_gone) for r in Revision.objects.all()} == stored
        assert (_shape(), _partition_indexes()) == (shape, indexes)
        call_command("verify_log", "--no-progress", stdout=io.StringIO())  # exits 1 on a break
        again = write(staff, f"{NS}/order/y", {"n": 9, "same": "s" * 50}).changeset
        assert Revision.objects.get(changeset=again).undo == {"n": 2}
    finally:
        standard()
