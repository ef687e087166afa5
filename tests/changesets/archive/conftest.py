"""Fixtures of the archive tests: a signing key, an archive folder, a seeded log.

The seeded log has what an archive must carry: creates, updates, deletes and
re-creates, batches over two namespaces, metadata, a merged branch, and an
erasure (sealed rows) before the cut.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from branches.services import branch_create, branch_merge
from branches.store import BranchStore
from changesets import ndjson
from changesets.archive import archiver, boundary, signing
from changesets.models import Changeset, Revision, Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp
from changesets.selectors.log import previous_hash
from changesets.services.apply import changeset_apply
from changesets.services.erase import EraseTarget, entities_erase
from entities.store import EntityKey, baseline
from tests.changesets.partition_helpers import layout, singles, standard

KEY = signing.new_private_key()
NS_A, NS_B = "arch.alpha", "arch.beta"


# Seqs that each end a revision partition in these tests (then one wide partition).
SINGLES = 40


@pytest.fixture(autouse=True)
def seq_partitions(request):
    """A partition per seq for the first ``SINGLES`` seqs, so a cut may end at any of
    them (cuts end where partitions end); the standard layout is put back after a
    transactional test (a ``db`` test's rollback undoes it)."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None:
        yield
        return
    request.getfixturevalue("transactional_db" if marker.kwargs.get("transaction") else "db")
    layout(singles(SINGLES))
    yield
    if not connection.in_atomic_block:
        standard()


@pytest.fixture
def archive_dir(settings, tmp_path) -> Path:
    """The archive storage in a temporary folder, signed with a test key, no grace."""
    folder = tmp_path / "archive"
    settings.STORAGES = {
        **settings.STORAGES,
        "atlas_archive": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(folder)},
        },
    }
    settings.ATLAS_ARCHIVE_SIGNING_KEY = KEY
    settings.ATLAS_ARCHIVE_GRACE_SECONDS = 0
    settings.ATLAS_ARCHIVE_CUT_CACHE_SECONDS = 0
    settings.ATLAS_ARCHIVE_SEGMENT_REVISIONS = 7
    return folder


def public_key() -> str:
    return signing.public_key_text(signing.load_private_key(KEY))


def key(path: str) -> EntityKey:
    return EntityKey(*path.split("/"))


@dataclass
class Seeded:
    root: Any
    ids: list[Any] = field(default_factory=list)

    def seq_of(self, index: int) -> int:
        return Changeset.objects.get(pk=self.ids[index]).seq


def _put(actor: Any, *items: tuple[str, dict | None], metadata: dict | None = None) -> Any:
    ops = [DeleteOp(key(p)) if c is None else PutOp(key(p), c) for p, c in items]
    rpc = Rpc.BATCH_MUTATE if len(ops) > 1 else Rpc.PUT_ENTITY
    if len(ops) == 1 and items[0][1] is None:
        rpc = Rpc.DELETE_ENTITY
    return changeset_apply(store=baseline, actor=actor, ops=ops, rpc=rpc, metadata=metadata)


@pytest.fixture
def seed(make_user, publish_committed) -> Callable[..., Seeded]:
    """``seed(rounds)``: a varied log written through the services; returns its changesets."""

    def run(rounds: int = 3) -> Seeded:
        root = make_user("root", superuser=True)
        make_user("ns-maker", maintainer=[NS_A, NS_B])
        seeded = Seeded(root)

        def keep(result: Any) -> None:
            if result.changeset is not None:
                seeded.ids.append(result.changeset.id)

        for r in range(rounds):
            keep(_put(root, (f"{NS_A}/doc/a", {"n": r, "email": f"a{r}@x.test", "tags": [r]})))
            keep(_put(root, (f"{NS_A}/doc/b{r}", {"title": f"b{r}"}), (f"{NS_B}/doc/c", {"r": r})))
            keep(
                changeset_apply(
                    store=baseline,
                    actor=root,
                    ops=[PatchOp(key(f"{NS_A}/doc/a"), {"extra": {"deep": r}})],
                    rpc=Rpc.PATCH_ENTITY,
                    metadata={"round": r},
                )
            )
            if r % 2:
                keep(_put(root, (f"{NS_A}/doc/b{r - 1}", None)))
        keep(_put(root, (f"{NS_B}/doc/gone", {"v": 1})))
        keep(_put(root, (f"{NS_B}/doc/gone", None)))
        keep(_put(root, (f"{NS_B}/doc/gone", {"v": 2})))  # re-created
        branch = branch_create(name="arch-feature", actor=root)
        store = BranchStore(branch, writer=root)
        changeset_apply(
            store=store, actor=root, ops=[PutOp(key(f"{NS_B}/doc/c"), {"r": "branch"})],
            rpc=Rpc.PUT_ENTITY,
        )  # fmt: skip
        keep(branch_merge(branch=branch, actor=root))
        entities_erase(
            actor=root,
            targets=[EraseTarget(key(f"{NS_A}/doc/a"), ("/email",))],
            reason="test: a person asked",
        )
        publish_committed()  # no relay runs here; an unpublished entry holds the cut back
        return seeded

    return run


def full_export() -> dict[str, dict[str, Any]]:
    """Every changeset as its export lines and chain fields, by id (taken before a cut)."""
    out = {}
    for changeset in Changeset.objects.order_by("seq"):
        revisions = list(Revision.objects.filter(changeset=changeset).order_by("id"))
        out[str(changeset.id)] = {
            "lines": list(ndjson.export_lines(changeset, revisions)),
            "seq": changeset.seq,
            "hash": changeset.hash,
            # What a segment holds: the row stores none since migration 0034.
            "prev_hash": previous_hash(changeset),
            "salts": [None if r.salt is None else bytes(r.salt).hex() for r in revisions],
            "sealed": [r.sealed for r in revisions],
        }
    return out


def cut(before: Any, **kw: Any) -> archiver.Outcome:
    """Archive in this process, as archive_log does; reads then see the cut."""
    outcome = archiver.archive(before=before, requested_by="test", **kw)
    boundary.forget()
    return outcome
