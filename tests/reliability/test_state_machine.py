"""Item 11: a Hypothesis state machine over the write services, checked against a model.

Rules drive the service layer directly — ``changeset_apply`` (put, patch,
delete, batch), ``changeset_revert``, ``branch_create``, writes through
``BranchStore``, ``branch_merge`` and ``changesets.selectors.feed.feed_page`` — while a
plain-Python model predicts every outcome: which changeset appears, with
which versions and images, which call is refused and with what error.

After every step (``@invariant``):

* **fold**: replaying the namespace's baseline revision rows in seq order
  (each ``before`` must equal the previous ``after`` of its key) gives exactly
  the live entity table, contents and versions, and the model's baseline;
* every open branch reads (``BranchStore.list``) as the model's overlay over
  the model's baseline.

Rules assert more: a revert over later edits is refused with
``RevertConflict`` and changes nothing (never a silent overwrite), and the
feed read from the beginning equals the baseline changesets the model made,
in order, record for record.

Each example works in a namespace of its own (``sm.<hex>``), so examples
share the test transaction without seeing each other and the append-only log
never needs truncating. ``ATLAS_STRESS=1``: 200 examples x 30 steps, random;
CI: 20 x 25, derandomized (the same examples every run).
"""

from __future__ import annotations

import copy
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from atlas.exceptions import NotFound, PreconditionFailed
from branches.exceptions import BranchClosed, MergeConflict
from branches.models import Branch
from branches.services import branch_create, branch_merge
from branches.store import BranchStore
from changesets.exceptions import RevertConflict
from changesets.models import Capture, Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp, canonical
from changesets.selectors import feed
from changesets.services.apply import changeset_apply
from changesets.services.revert import changeset_revert
from entities.models import Entity, Namespace
from entities.store import EntityKey, baseline
from tests.entities.factories import SuperuserFactory

pytestmark = pytest.mark.usefixtures("no_network")
STRESS = os.environ.get("ATLAS_STRESS") == "1"
EXAMPLES = 200 if STRESS else 20
STEPS = 30 if STRESS else 25

KIND = "doc"
SLUGS = ["a", "b", "c"]
TOMBSTONE = object()

STATS: dict[str, int] = {}


def _count(name: str) -> None:
    STATS[name] = STATS.get(name, 0) + 1


# --- the model -----------------------------------------------------------------------------

leaf = st.one_of(st.integers(0, 3), st.booleans(), st.none(), st.sampled_from(["", "x", "é"]))
value = st.one_of(leaf, st.dictionaries(st.sampled_from(["p", "q"]), leaf, max_size=2))
contents = st.dictionaries(st.sampled_from(["x", "y", "z"]), value, max_size=3)
patches = st.dictionaries(st.sampled_from(["x", "y", "z"]), value, max_size=2)
slugs = st.sampled_from(SLUGS)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON (1 is not true is not 1.0), None meaning absent."""
    if a is None or b is None:
        return a is None and b is None
    return canonical(a) == canonical(b)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396, written out independently of the app's library."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, item in patch.items():
        if item is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), item)
    return result


@dataclass
class ModelChangeset:
    id: str
    rpc: str
    # slug -> (op, before, after, after_version); only keys that moved (invariant 4)
    changes: dict[str, tuple[str, Any, Any, int | None]]


@dataclass
class ModelBranch:
    name: str
    open: bool = True
    overlay: dict[str, Any] = field(default_factory=dict)  # slug -> content | TOMBSTONE
    base_version: dict[str, int | None] = field(default_factory=dict)


class Refused(Exception):
    """The model's prediction that the service refuses the call."""

    def __init__(self, error: type[Exception]) -> None:
        super().__init__(error.__name__)
        self.error = error


# --- the machine ---------------------------------------------------------------------------


class AtlasMachine(RuleBasedStateMachine):
    changesets = Bundle("changesets")
    branches = Bundle("branches")

    def __init__(self) -> None:
        super().__init__()
        self.ns = f"sm.{uuid.uuid4().hex[:16]}"
        Namespace.objects.create(name=self.ns)
        self.actor = SuperuserFactory(username="sm-staff")
        # baseline model: slug -> (content, version); highest version each slug ever had
        self.base: dict[str, tuple[dict[str, Any], int]] = {}
        self.last_version: dict[str, int] = {}
        self.log: list[ModelChangeset] = []
        self.model_branches: dict[str, ModelBranch] = {}
        _count("examples")

    def key(self, slug: str) -> EntityKey:
        return EntityKey(self.ns, KIND, slug)

    # -- helpers ------------------------------------------------------------------------

    def content(self, slug: str) -> Any:
        return self.base[slug][0] if slug in self.base else None

    def version(self, slug: str) -> int | None:
        return self.base[slug][1] if slug in self.base else None

    def land(self, result_changeset: Changeset | None, rpc: str, final: dict[str, Any]) -> None:
        """Fold ``final`` (slug -> content | None) into the baseline model and check the
        changeset the service wrote is exactly the one the model expects."""
        changes: dict[str, tuple[str, Any, Any, int | None]] = {}
        for slug, after in final.items():
            before = self.content(slug)
            if same(before, after):
                continue
            if after is None:
                changes[slug] = ("delete", before, None, None)
            else:
                version = (self.version(slug) or self.last_version.get(slug, 0)) + 1
                changes[slug] = ("create" if before is None else "update", before, after, version)
        if not changes:
            assert result_changeset is None, "a changeset that changes nothing (invariant 3)"
            return
        assert result_changeset is not None, f"expected a changeset for {changes}"
        assert result_changeset.rpc == rpc
        assert result_changeset.branch == ""
        assert result_changeset.author_name == self.actor.username
        rows = {
            r.slug: (r.op, r.before, r.after, r.after_version)
            for r in Revision.objects.filter(changeset=result_changeset)
        }
        assert set(rows) == set(changes), (rows, changes)
        for slug, (op, before, after, version) in changes.items():
            got = rows[slug]
            assert got[0] == op and same(got[1], before) and same(got[2], after), (slug, got)
            assert got[3] == version, (slug, got, version)
        for slug, (op, _, after, version) in changes.items():
            if op == "delete":
                self.base.pop(slug)
            else:
                self.base[slug] = (after, version)
                self.last_version[slug] = version
        self.log.append(ModelChangeset(str(result_changeset.id), rpc, changes))
        _count(f"changeset:{rpc}")

    def apply(self, ops: list[Any], rpc: str, expect: dict[str, Any] | Refused) -> str | None:
        """Call the write service on baseline; compare with the model's expectation.

        Returns the new changeset's id (None when nothing was written), for revert.
        """
        if isinstance(expect, Refused):
            before = _live_rows(self.ns)
            with pytest.raises(expect.error):
                changeset_apply(store=baseline, actor=self.actor, ops=ops, rpc=rpc)
            assert _live_rows(self.ns) == before, "a refused write changed something"
            _count(f"refused:{expect.error.__name__}")
            return None
        result = changeset_apply(store=baseline, actor=self.actor, ops=ops, rpc=rpc)
        self.land(result.changeset, rpc, expect)
        return str(result.changeset.id) if result.changeset else None

    def predict_batch(self, ops: list[tuple]) -> dict[str, Any] | Refused:
        """Run ``ops`` on a copy of the model: the final state, or the refusal."""
        state = {s: self.content(s) for s in SLUGS}
        version = {s: self.version(s) for s in SLUGS}
        moved: set[str] = set()
        for kind, slug, arg, if_match in ops:
            exists = state[slug] is not None
            if if_match is not None:
                if not exists:
                    return Refused(PreconditionFailed)
                if if_match != "*" and version[slug] != if_match:
                    return Refused(PreconditionFailed)
            if kind == "delete":
                if not exists:
                    return Refused(NotFound)
                state[slug], version[slug] = None, None
                moved.add(slug)
                continue
            if kind == "patch":
                if not exists:
                    return Refused(NotFound)
                new = merge_patch(state[slug], arg)
            else:
                new = arg
            if exists and same(state[slug], new):
                continue
            state[slug] = new
            # Pending versions: every change in the batch makes the key's next version.
            version[slug] = (self.version(slug) or self.last_version.get(slug, 0)) + 1
            moved.add(slug)
        return {s: state[s] for s in moved}

    def to_op(self, kind: str, slug: str, arg: Any, if_match: Any) -> Any:
        key = self.key(slug)
        if kind == "put":
            return PutOp(key, arg, if_match=if_match)
        if kind == "patch":
            return PatchOp(key, arg, if_match=if_match)
        return DeleteOp(key, if_match=if_match)

    # -- baseline writes ----------------------------------------------------------------

    @initialize(target=changesets, slug=slugs, content=contents)
    def seed(self, slug: str, content: dict[str, Any]) -> Any:
        _count("rule:seed")
        return self.apply([PutOp(self.key(slug), content)], Rpc.PUT_ENTITY, {slug: content})

    @rule(target=changesets, slug=slugs, content=contents)
    def put(self, slug: str, content: dict[str, Any]) -> Any:
        _count("rule:put")
        return self.apply([PutOp(self.key(slug), content)], Rpc.PUT_ENTITY, {slug: content})

    @rule(target=changesets, slug=slugs, patch=patches)
    def patch(self, slug: str, patch: dict[str, Any]) -> Any:
        _count("rule:patch")
        expect = self.predict_batch([("patch", slug, patch, None)])
        return self.apply([PatchOp(self.key(slug), patch)], Rpc.PATCH_ENTITY, expect)

    @rule(target=changesets, slug=slugs)
    def delete(self, slug: str) -> Any:
        _count("rule:delete")
        expect = self.predict_batch([("delete", slug, None, None)])
        return self.apply([DeleteOp(self.key(slug))], Rpc.DELETE_ENTITY, expect)

    @rule(target=changesets, data=st.data())
    def batch(self, data: st.DataObject) -> Any:
        _count("rule:batch")
        ops = []
        for _ in range(data.draw(st.integers(1, 4), label="ops")):
            kind = data.draw(st.sampled_from(["put", "patch", "delete"]))
            slug = data.draw(slugs)
            arg = data.draw(contents if kind == "put" else patches) if kind != "delete" else None
            if_match = data.draw(
                st.sampled_from([None] * 5 + ["*", self.version(slug) or 1, 999]), label="if_match"
            )
            ops.append((kind, slug, arg, if_match))
        expect = self.predict_batch(ops)
        return self.apply([self.to_op(*op) for op in ops], Rpc.BATCH_MUTATE, expect)

    # -- revert -------------------------------------------------------------------------

    @rule(target=changesets, target_id=changesets)
    def revert(self, target_id: str | None) -> Any:
        _count("rule:revert")
        original = next((c for c in self.log if c.id == target_id), None)
        if original is None:  # the rule that made it wrote nothing
            return None
        conflicts, final = [], {}
        for slug, (_op, before, after, _v) in original.changes.items():
            now = self.content(slug)
            if same(now, before):
                continue  # already back at the pre-image
            if not same(now, after):
                conflicts.append(slug)  # moved on since: refuse, never overwrite
                continue
            final[slug] = before
        if conflicts:
            before_rows = _live_rows(self.ns)
            with pytest.raises(RevertConflict) as refused:
                changeset_revert(store=baseline, actor=self.actor, changeset_id=target_id)
            reported = sorted(c["slug"] for c in refused.value.conflicts)
            assert reported == sorted(conflicts)
            assert _live_rows(self.ns) == before_rows, "a refused revert wrote something"
            _count("refused:RevertConflict")
            return None
        result = changeset_revert(store=baseline, actor=self.actor, changeset_id=target_id)
        self.land(result.changeset, Rpc.REVERT_CHANGESET, final)
        return str(result.changeset.id) if result.changeset else None

    # -- branches -----------------------------------------------------------------------

    @rule(target=branches)
    def branch(self) -> str:
        _count("rule:branch")
        name = f"sm-{uuid.uuid4().hex[:20]}"
        branch_create(name=name, actor=self.actor)
        self.model_branches[name] = ModelBranch(name)
        _count("branches")
        return name

    def branch_view(self, branch: ModelBranch, slug: str) -> Any:
        if slug in branch.overlay:
            item = branch.overlay[slug]
            return None if item is TOMBSTONE else item
        return self.content(slug)

    @rule(
        name=branches,
        writes=st.lists(st.tuples(slugs, st.one_of(st.none(), contents)), min_size=1, max_size=3),
    )
    def branch_write(self, name: str, writes: list[tuple[str, dict[str, Any] | None]]) -> None:
        """Puts (or, for None, deletes) through the branch overlay store, one per changeset."""
        _count("rule:branch_write")
        for slug, content in writes:
            self.branch_write_one(name, slug, content)

    def branch_write_one(self, name: str, slug: str, content: dict[str, Any] | None) -> None:
        model = self.model_branches[name]
        key = self.key(slug)
        op, rpc = (
            (DeleteOp(key), Rpc.DELETE_ENTITY)
            if content is None
            else (
                PutOp(key, content),
                Rpc.PUT_ENTITY,
            )
        )
        store = BranchStore(Branch.objects.get(name=name))
        current = self.branch_view(model, slug)
        if not model.open or (content is None and current is None):
            error = BranchClosed if not model.open else NotFound
            with pytest.raises(error):
                changeset_apply(store=store, actor=self.actor, ops=[op], rpc=rpc)
            _count(f"refused:{error.__name__}")
            return
        result = changeset_apply(store=store, actor=self.actor, ops=[op], rpc=rpc)
        if same(current, content):
            assert result.changeset is None
            return
        assert result.changeset is not None and result.changeset.branch == name
        assert result.changeset.rpc == rpc
        if slug not in model.base_version:
            model.base_version[slug] = self.version(slug)
        model.overlay[slug] = TOMBSTONE if content is None else content
        _count("changeset:branch")

    @precondition(lambda self: any(b.open and b.overlay for b in self.model_branches.values()))
    @rule(target=changesets, data=st.data())
    def merge_a_branch_with_changes(self, data: st.DataObject) -> Any:
        """Most branches the machine makes are merged only by chance; aim at one that has work."""
        _count("rule:merge_a_branch_with_changes")
        ready = sorted(n for n, b in self.model_branches.items() if b.open and b.overlay)
        return self.merge(data.draw(st.sampled_from(ready), label="branch"))

    @rule(target=changesets, name=branches)
    def merge(self, name: str) -> Any:
        _count("rule:merge")
        model = self.model_branches[name]
        branch = Branch.objects.get(name=name)
        if not model.open:
            with pytest.raises(BranchClosed):
                branch_merge(branch=branch, actor=self.actor)
            _count("refused:BranchClosed")
            return None
        plan = {
            slug: self.branch_view(model, slug)
            for slug in model.overlay
            if not same(self.branch_view(model, slug), self.content(slug))
        }
        conflicts = sorted(s for s in plan if self.version(s) != model.base_version[s])
        if conflicts:
            with pytest.raises(MergeConflict) as refused:
                branch_merge(branch=branch, actor=self.actor)
            assert sorted(c["slug"] for c in refused.value.conflicts) == conflicts
            _count("refused:MergeConflict")
            return None
        result = branch_merge(branch=branch, actor=self.actor)
        model.open = False
        assert result.branch.status == "merged"
        self.land(result.changeset, Rpc.MERGE_BRANCH, plan)
        return str(result.changeset.id) if result.changeset else None

    # -- the feed -----------------------------------------------------------------------

    @rule(limit=st.integers(1, 7))
    def read_feed(self, limit: int) -> None:
        """All pages from the beginning equal the model's baseline changesets, in order."""
        _count("rule:read_feed")
        records: list[dict[str, Any]] = []
        after = 0
        while True:
            page = feed.feed_page(
                after_seq=after, namespaces=[self.ns], capture=Capture.NEW_ROW, limit=limit
            )
            if not page.records:
                assert page.last_seq == after
                break
            # Pages end on changeset boundaries: the last changeset is whole.
            last = page.records[-1]["changeset_id"]
            in_page = sum(1 for r in page.records if r["changeset_id"] == last)
            assert in_page == Revision.objects.filter(changeset_id=last, namespace=self.ns).count()
            records.extend(page.records)
            assert feed.cursor_decode(feed.cursor_encode(page.last_seq)) == page.last_seq
            after = page.last_seq
        order: list[str] = []
        got: dict[str, dict[str, tuple]] = {}
        for record in records:
            if not order or order[-1] != record["changeset_id"]:
                assert record["changeset_id"] not in got, "a changeset's records are split"
                order.append(record["changeset_id"])
                got[record["changeset_id"]] = {}
            got[record["changeset_id"]][record["slug"]] = (
                record["op"],
                canonical(record["new_row"]),
                record["version"],
            )
        assert order == [c.id for c in self.log]
        for changeset in self.log:
            expected = {
                slug: (op, canonical(after), version)
                for slug, (op, _before, after, version) in changeset.changes.items()
            }
            assert got[changeset.id] == expected, changeset.id
        _count("feed_reads")

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def entity_state_is_the_fold_of_its_revisions(self) -> None:
        folded: dict[str, tuple[str, int]] = {}
        last_after: dict[str, Any] = {}
        for slug, before, after, after_version in (
            Revision.objects.filter(branch="", namespace=self.ns, kind=KIND)
            .order_by("seq", "id")
            .values_list("slug", "before", "after", "after_version")
        ):
            assert same(before, last_after.get(slug)), f"{slug}: history has a gap"
            last_after[slug] = after
            if after is None:
                folded.pop(slug, None)
            else:
                folded[slug] = (canonical(after), after_version)
        live = _live_rows(self.ns)
        assert live == folded, (live, folded)
        model = {s: (canonical(c), v) for s, (c, v) in self.base.items()}
        assert live == model, (live, model)

    @invariant()
    def open_branches_read_as_the_model(self) -> None:
        for name, model in self.model_branches.items():
            if not model.open:
                continue
            store = BranchStore(Branch.objects.get(name=name))
            seen = {
                e.key.slug: canonical(e.content)
                for e in store.list(namespaces=None, namespace=self.ns, limit=100)
            }
            expected = {}
            for slug in SLUGS:
                view = self.branch_view(model, slug)
                if view is not None:
                    expected[slug] = canonical(view)
            assert seen == expected, (name, seen, expected)


def _live_rows(ns: str) -> dict[str, tuple[str, int]]:
    return {
        slug: (canonical(content), version)
        for slug, content, version in Entity.objects.filter(namespace_id=ns).values_list(
            "slug", "content", "version"
        )
    }


def test_state_machine_matches_the_model(db):
    STATS.clear()
    run_state_machine_as_test(
        AtlasMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            # CI replays one fixed set of examples (no flakes, and the coverage asserts
            # below hold); the full run draws new ones every time.
            derandomize=not STRESS,
            database=None if not STRESS else settings.default.database,
        ),
    )
    print(f"\nstate machine: {EXAMPLES} examples x {STEPS} steps: {dict(sorted(STATS.items()))}")
    assert STATS.get("changeset:RevertChangeset", 0) > 0
    assert STATS.get("refused:RevertConflict", 0) > 0
    assert STATS.get("changeset:MergeBranch", 0) > 0
    assert STATS.get("feed_reads", 0) > 0
