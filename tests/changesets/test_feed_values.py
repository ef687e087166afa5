"""``feed_values.changed_values`` compares as JSON, not as Python (issue 17 gave it a
fast path for unchanged scalars: these pin that the fast path keeps JSON's
distinctions)."""

from __future__ import annotations

from typing import Any

import pytest

from changesets.selectors import feed_values as feed


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (1, 1.0),
        (1, True),
        (1.0, True),
        (0, False),
        (0.0, -0.0),
        ("1", 1),
        (None, False),
        ({"x": 1}, {"x": 1.0}),
        ([1, True], [1, 1]),
        ({"x": [0]}, {"x": [False]}),
    ],
)
def test_values_python_calls_equal_but_json_does_not_are_changed(old: Any, new: Any):
    assert feed.changed_values({"k": old}, {"k": new}) == ({"k": old}, {"k": new})


@pytest.mark.parametrize(
    "value", [1, 2.5, -0.0, True, False, None, "é\u2028", "", [1, {"a": None}], {"b": [1.0]}]
)
def test_identical_values_are_unchanged(value: Any):
    assert feed.changed_values({"k": value, "n": 1}, {"k": value, "n": 2}) == (
        {"n": 1},
        {"n": 2},
    )
