"""The member digests' fast paths give exactly what the canonical encoding gives.

A member digest hashes the canonical JSON of one value; ``members._encode`` skips
the JSON encoder for strings and integers, and ``members._member_keys`` copies one
keyed BLAKE2b state per salt. A byte of difference would break every chain
written before (or after) the change, so both are pinned against the reference
spellings here, over the values JSON can hold.
"""

from __future__ import annotations

import enum
import hashlib
import os

import pytest

from changesets import chain
from changesets.chain.encoding import _canonical
from changesets.chain.members import _encode, _member_keys


class Colour(enum.IntEnum):
    RED = 1


class Tag(str):
    pass


VALUES = [
    0,
    -1,
    7,
    2**63,
    -(2**70),
    True,
    False,
    None,
    0.1,
    -2.5e-300,
    1e300,
    float("nan"),
    float("inf"),
    "",
    "plain",
    'quote " and backslash \\',
    "line\nbreak\ttab\x00nul\x1f",
    "ünïcødé ✓ 😀 \u2028",
    Colour.RED,
    Tag("sub"),
    [],
    ["a", 1, None, [True]],
    {},
    {"b": 1, "a": {"z": [1, 2], "y": "é"}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_member_encoding_is_the_canonical_json(value):
    assert _encode(value).encode() == _canonical(value)


def _reference_key(salt: bytes, side: str, name: str) -> bytes:
    """The member key as the chain defines it, a fresh keyed hash each time."""
    return hashlib.blake2b(f"{side}\0{name}".encode(), key=salt, digest_size=32).digest()


def test_the_copied_keyed_state_gives_member_key_for_every_side_and_name():
    for _ in range(20):
        salt = chain.new_salt()
        key = _member_keys(salt)
        for side in chain.SIDES:
            for name in ("", "n", "ünï", "a" * 300, os.urandom(8).hex()):
                assert key(side, name) == _reference_key(salt, side, name)
                assert chain.member_key(salt, side, name) == _reference_key(salt, side, name)


def test_image_digests_are_the_member_digests_of_the_derived_keys():
    salt = chain.new_salt()
    image = {"n": 3, "name": "x", "tags": ["a"], "ok": True, "price": 1.5, "gone": None}
    expected = {
        name: chain.member_digest(_reference_key(salt, "after", name), value)
        for name, value in image.items()
    }
    assert chain.image_digests(image, side="after", salt=salt) == expected
