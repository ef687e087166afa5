"""The one three-way merge (``changesets.merge3``): rules by example, then properties.

Pure Python, no database. Documents are drawn from a small alphabet of member
names so that the two sides often touch the same or nested pointers.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changesets import pointers
from changesets.merge3 import MISSING, Conflict, merge3, put, take, value_at
from changesets.ops import canonical
from tests.changesets.test_changed_keys import mutate, random_doc, reference_changed

NAMES = ["a", "b", "c", "x/y"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([1.0, 2.5]),
    st.text("ab", max_size=2),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    ),
    max_leaves=8,
)
docs = st.dictionaries(st.sampled_from(NAMES), values, max_size=4)


def same(a: Any, b: Any) -> bool:
    return canonical(a) == canonical(b)


@st.composite
def edits(draw: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with a few members set, removed or recursed into."""
    out = dict(doc)
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(NAMES))
        roll = draw(st.integers(0, 3))
        if roll == 0:
            out.pop(name, None)
        elif roll == 1 and isinstance(out.get(name), dict):
            out[name] = draw(edits(out[name]))
        else:
            out[name] = draw(values)
    return out


@st.composite
def triples(draw: Any) -> tuple[dict, dict, dict]:
    base = draw(docs)
    return base, draw(edits(base)), draw(edits(base))


PROPS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def shallowest(a: str, b: str) -> str:
    return a if len(pointers.segments(a)) <= len(pointers.segments(b)) else b


# --- properties the issue names ---------------------------------------------------------


@PROPS
@given(st.data())
def test_merging_with_no_concurrent_change_returns_theirs(data):
    base = data.draw(docs)
    theirs = data.draw(edits(base))
    merged = merge3(base, base, theirs)
    assert merged.conflicts == []
    assert same(merged.content, theirs)


@PROPS
@given(st.data())
def test_merging_theirs_equal_to_base_returns_ours(data):
    base = data.draw(docs)
    ours = data.draw(edits(base))
    merged = merge3(base, ours, base)
    assert merged.conflicts == []
    assert same(merged.content, ours)


@PROPS
@given(triples())
def test_disjoint_pointer_changes_commute(triple):
    base, ours, theirs = triple
    ours_changed, theirs_changed = pointers.changed(base, ours), pointers.changed(base, theirs)
    if any(pointers.relates(p, q) for p in ours_changed for q in theirs_changed):
        return  # not disjoint: the next property covers it
    one, other = merge3(base, ours, theirs), merge3(base, theirs, ours)
    assert one.conflicts == [] and other.conflicts == []
    assert same(one.content, other.content)
    # ... and the merge holds each side's value at every pointer that side changed.
    for p in ours_changed:
        assert repr_at(one.content, p) == repr_at(ours, p)
    for p in theirs_changed:
        assert repr_at(one.content, p) == repr_at(theirs, p)
    assert pointers.changed(base, one.content) == sorted(
        {*ours_changed, *theirs_changed}, key=pointers.sort_key
    )


@PROPS
@given(triples())
def test_a_conflict_is_reported_exactly_when_both_sides_changed_one_pointer_differently(triple):
    base, ours, theirs = triple
    expected: set[str] = set()
    for p in pointers.changed(base, ours):
        for q in pointers.changed(base, theirs):
            if pointers.relates(p, q):
                meet = shallowest(p, q)
                if repr_at(ours, meet) != repr_at(theirs, meet):
                    expected.add(meet)
    # Meeting points nested in another are reported once, at the shallowest.
    expected = {p for p in expected if not any(q != p and p.startswith(q + "/") for q in expected)}
    merged = merge3(base, ours, theirs)
    assert {c.pointer for c in merged.conflicts} == expected
    for c in merged.conflicts:
        assert same(c.base, none_if_missing(value_at(base, c.pointer)))
        assert same(c.ours, none_if_missing(value_at(ours, c.pointer)))
        assert same(c.theirs, none_if_missing(value_at(theirs, c.pointer)))
        # Unsettled, the merge keeps ours there.
        assert repr_at(merged.content, c.pointer) == repr_at(ours, c.pointer)


@PROPS
@given(triples())
def test_taking_theirs_at_every_conflict_gives_theirs_wherever_theirs_changed(triple):
    base, ours, theirs = triple
    merged = merge3(base, ours, theirs)
    content = merged.content
    for c in merged.conflicts:
        content = take(content, theirs, c.pointer)
    for p in pointers.changed(base, theirs):
        assert repr_at(content, p) == repr_at(theirs, p)


def repr_at(doc: Any, pointer: str) -> str:
    value = value_at(doc, pointer)
    return "<missing>" if value is MISSING else canonical(value)


def none_if_missing(value: Any) -> Any:
    return None if value is MISSING else value


# --- rules by example -------------------------------------------------------------------


def test_a_later_edit_to_another_key_survives_a_key_level_undo():
    # revert: base = the change's after, theirs = its before, ours = now
    merged = merge3({"title": "new", "n": 1}, {"title": "new", "n": 2}, {"title": "old", "n": 1})
    assert merged.conflicts == []
    assert merged.content == {"title": "old", "n": 2}


def test_a_later_edit_to_the_same_key_is_a_conflict_naming_the_pointer():
    merged = merge3({"title": "new"}, {"title": "newer"}, {"title": "old"})
    assert merged.conflicts == [Conflict("/title", "new", "newer", "old")]
    assert merged.content == {"title": "newer"}


def test_nested_members_merge_member_by_member():
    base = {"a": {"x": 1, "y": 1}}
    merged = merge3(base, {"a": {"x": 2, "y": 1}}, {"a": {"x": 1, "y": 2, "z": 3}})
    assert merged.conflicts == [] and merged.content == {"a": {"x": 2, "y": 2, "z": 3}}


def test_an_object_replaced_by_a_scalar_meets_a_nested_change_at_the_shallower_pointer():
    merged = merge3({"a": {"x": 1}}, {"a": 5}, {"a": {"x": 2}})
    assert merged.conflicts == [Conflict("/a", {"x": 1}, 5, {"x": 2})]


def test_both_sides_making_the_same_change_is_no_conflict():
    merged = merge3({"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 2, "b": 3})
    assert merged.conflicts == [] and merged.content == {"a": 2, "b": 3}


def test_arrays_are_values_not_merged_element_by_element():
    merged = merge3({"t": [1, 2]}, {"t": [1, 2, 3]}, {"t": [0, 1, 2]})
    assert merged.conflicts == [Conflict("/t", [1, 2], [1, 2, 3], [0, 1, 2])]


def test_removed_members_merge_like_any_change_and_report_absent_as_null():
    assert merge3({"a": 1, "b": 1}, {"a": 1}, {"a": 2, "b": 1}).content == {"a": 2}
    merged = merge3({"a": 1}, {}, {"a": 2})
    assert merged.conflicts == [Conflict("/a", 1, None, 2)]


def test_json_types_are_compared_byte_for_byte():
    merged = merge3({"a": 1}, {"a": 1.0}, {"a": True})
    assert merged.conflicts == [Conflict("/a", 1, 1.0, True)]


@pytest.mark.parametrize(
    ("base", "ours", "theirs", "content", "conflicts"),
    [
        pytest.param({"a": 1}, {"a": 1}, None, None, [], id="delete-when-unchanged"),
        pytest.param({"a": 1}, None, None, None, [], id="both-deleted"),
        pytest.param(
            {"a": 1},
            {"a": 2},
            None,
            {"a": 2},
            [Conflict("", {"a": 1}, {"a": 2}, None)],
            id="delete-refused-after-a-later-edit",
        ),
        pytest.param(None, None, {"a": 1}, {"a": 1}, [], id="re-create"),
        pytest.param(
            None,
            {"a": 2},
            {"a": 1},
            {"a": 2},
            [Conflict("", None, {"a": 2}, {"a": 1})],
            id="both-created-differently",
        ),
        pytest.param(
            {"a": 1},
            None,
            {"a": 2},
            None,
            [Conflict("", {"a": 1}, None, {"a": 2})],
            id="edited-after-a-delete",
        ),
    ],
)
def test_whole_documents_merge_whole_when_one_side_is_absent(
    base, ours, theirs, content, conflicts
):
    merged = merge3(base, ours, theirs)
    assert merged.content == content and merged.conflicts == conflicts


def test_entity_granularity_refuses_any_concurrent_change_as_a_whole():
    merged = merge3({"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 1, "b": 2}, granularity="entity")
    assert merged.conflicts == [Conflict("", {"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 1, "b": 2})]
    assert merge3({"a": 1}, {"a": 1}, {"a": 2}, granularity="entity").content == {"a": 2}


def test_take_settles_one_conflict_and_put_copies_only_along_the_path():
    base = {"a": {"x": 1}, "b": 1}
    ours, theirs = {"a": {"x": 2}, "b": 2}, {"a": {"x": 3}, "b": 3}
    merged = merge3(base, ours, theirs)
    assert [c.pointer for c in merged.conflicts] == ["/a/x", "/b"]
    settled = take(merged.content, theirs, "/a/x")
    assert settled == {"a": {"x": 3}, "b": 2}
    assert ours == {"a": {"x": 2}, "b": 2}  # untouched
    assert take(merged.content, theirs, "") == theirs
    assert put({"a": {}}, "/a/m~1n", 1) == {"a": {"m/n": 1}}


# --- the pointer rule it uses is the changed-keys rule ----------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_the_python_pointer_rule_matches_the_changed_keys_witness(seed):
    rng = random.Random(seed)
    for _ in range(200):
        before = random_doc(rng)
        after = mutate(rng, before)
        if not isinstance(after, dict):
            after = random_doc(rng)
        for b, a in ((before, after), (None, after), (before, None)):
            assert pointers.changed(b, a) == reference_changed(b, a), (b, a)
