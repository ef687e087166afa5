"""The state at a cut (``changesets.archive.state``) in memory and spilled to disk.

Past ``SPILL`` keys the replay moves to a temporary SQLite file, and a digest
over more than ``SPILL`` lines sorts there: the checkpoint signs the digest, so
both must give the very digest the in-memory path gives, for any sequence of
creates, updates and deletes and for keys whose order depends on how strings
compare (case, accents, characters outside the BMP, prefixes).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from changesets.archive import state

KEYS = [
    ("a", "doc", "x"),
    ("a", "doc", "X"),
    ("a", "doc", "x2"),
    ("a", "Doc", "x"),
    ("ab", "doc", "x"),
    ("a", "doc", "é"),
    ("a", "doc", "\uffff"),
    ("a", "doc", "\U0001f600"),
    ("é", "doc", "x"),
    ("b", "doc", ""),
]

ops = st.lists(
    st.tuples(st.sampled_from(["create", "update", "delete"]), st.integers(0, len(KEYS) - 1)),
    max_size=60,
)


def _replay(sequence: list[tuple[str, int]], spill: int) -> state.Replay:
    replay = state.Replay(spill=spill)
    for seq, (op, k) in enumerate(sequence, start=1):
        ns, kind, slug = KEYS[k]
        row = SimpleNamespace(
            namespace=ns, kind=kind, slug=slug, seq=seq, op=op, branch="", changeset_id=f"c{seq}"
        )
        replay.apply(row, [op, seq, slug])
    return replay


@settings(max_examples=150, deadline=None)
@given(ops, st.integers(0, 4))
def test_a_spilled_replay_digests_as_the_one_in_memory(sequence, spill):
    held = _replay(sequence, spill=10**9)
    spilled = _replay(sequence, spill=spill)
    assert spilled.digest() == held.digest()
    assert sorted(spilled.lines()) == sorted(held.lines())
    assert len(spilled) == len(held)


@settings(max_examples=100, deadline=None)
@given(ops, st.integers(0, 5))
def test_a_digest_sorted_on_disk_is_the_one_sorted_in_memory(sequence, spill):
    lines = list(_replay(sequence, spill=10**9).lines())
    expected = state.digest(lines)
    with mock.patch.object(state, "SPILL", spill):
        assert state.digest(reversed(lines)) == expected


def test_the_digest_is_what_it_was_before_spilling_existed():
    """Pinned: the signed digest of a fixed state, so neither path drifts from the format
    checkpoints already carry (``atlas-archive-state-v1``)."""
    replay = _replay([("create", 0), ("update", 0), ("create", 5), ("delete", 9)], spill=10**9)
    lines = "".join(f"{line}\n" for _, line in sorted(replay.lines()))
    assert replay.digest() == hashlib.sha256(state.VERSION + lines.encode()).hexdigest()


def _row(seq: int, op: str, k: int) -> SimpleNamespace:
    ns, kind, slug = KEYS[k]
    return SimpleNamespace(
        namespace=ns, kind=kind, slug=slug, seq=seq, op=op, branch="", changeset_id=f"c{seq}"
    )


def _state_rows(sequence: list[tuple[str, int]]) -> list[SimpleNamespace]:
    """What ``changesets_archivebase`` holds after ``sequence``: per live key, its
    life's create (or first row) and its newest row, one row when they are the same."""
    lives: dict[int, list[SimpleNamespace]] = {}
    for seq, (op, k) in enumerate(sequence, start=1):
        if op == "delete":
            lives.pop(k, None)
        elif op == "create" or k not in lives:
            lives[k] = [_row(seq, op, k)]
        else:
            lives[k] = [lives[k][0], _row(seq, op, k)]
    return [row for life in lives.values() for row in life]


@settings(max_examples=150, deadline=None)
@given(ops, ops, st.integers(0, 4), st.randoms(use_true_random=False))
def test_a_replay_seeded_from_a_cuts_rows_in_any_order_is_the_one_rolled_forward(
    before, after, spill, rnd
):
    """A second cut starts from the first cut's state rows, read a chunk at a time in
    no particular order (``base.rows_at``): seeded from them in any order, in memory
    or spilled, the replay digests as the one that saw every revision, before and
    after the revisions that follow."""
    rows = _state_rows(before)
    rnd.shuffle(rows)
    fields = mock.patch.object(
        state.chain, "revision_fields", lambda row: [row.op, row.seq, row.slug]
    )
    with fields:
        seeded = state.Replay(rows, spill=spill)
    rolled = _replay(before, spill=10**9)
    assert seeded.digest() == rolled.digest()
    assert len(seeded) == len(rolled)
    for seq, (op, k) in enumerate(after, start=len(before) + 1):
        row = _row(seq, op, k)
        seeded.apply(row, [op, seq, row.slug])
        rolled.apply(row, [op, seq, row.slug])
    assert seeded.digest() == rolled.digest()
