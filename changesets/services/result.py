"""What a write returns: :class:`ApplyResult` and :class:`PlannedResult`.

Built from memory by ``changesets.services.apply``; nothing here reads the database.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from changesets.models import BASELINE, Changeset, Revision
from changesets.ops import OpResult
from changesets.services.netchange import NetChange
from changesets.services.plans import plan_digest
from entities.store import EntityKey, StoredEntity

_REVISION_FIELDS = (
    "id",
    "changeset_id",
    "seq",
    "branch",
    "at",
    "namespace",
    "kind",
    "slug",
    "op",
    "undo",
    "after",
    "before_version",
    "after_version",
    "changed",
)


@dataclass
class ApplyResult:
    """What :func:`changeset_apply` did (or, on a dry run, would do).

    ``revisions`` are built on first use (in memory, never re-read): model
    instances cost more than the rows' insert, and not every caller wants them.
    They carry both images (``before`` given, not rebuilt), but not the row's
    stored form of before (``undo``, ``undo_gone``: the log statement's to compute).
    """

    changeset: Changeset | None
    results: list[OpResult]
    entities: dict[EntityKey, StoredEntity | None] = field(default_factory=dict)
    dry_run: bool = False
    changes: Sequence[NetChange] = field(default=(), repr=False)
    branch: str = BASELINE
    # Per change, the pointers the log statement stored (empty on a dry run).
    changed: Sequence[list[str]] = field(default=(), repr=False)

    @property
    def plan(self) -> str:
        """The digest of what this write records (or, on a dry run, would record):
        pass it back as ``expect_plan`` to confirm exactly this."""
        return plan_digest(branch=self.branch, changes=self.changes)

    @functools.cached_property
    def revisions(self) -> list[Revision]:
        cs = self.changeset
        cs_id, seq, at = (cs.id, cs.seq, cs.at) if cs is not None else (None, None, None)
        # Positional arguments (the first concrete fields in order; the rest take
        # their defaults) build a model instance about 2.5 times faster than
        # keywords; keywords if the model's fields ever stop matching this order.
        names = tuple(f.attname for f in Revision._meta.concrete_fields)
        positional = names[: len(_REVISION_FIELDS)] == _REVISION_FIELDS
        # Untyped on purpose: the Django plugin checks ``*values`` against each field
        # in turn, and whether it then objects depends on what else is installed
        # (with bench/requirements.txt, it did).
        build: Any = Revision
        out = []
        changed = list(self.changed) or [[] for _ in self.changes]
        for c, keys in zip(self.changes, changed, strict=True):
            values: tuple[Any, ...] = (
                None,
                cs_id,
                seq,
                self.branch,
                at,
                c.key.namespace,
                c.key.kind,
                c.key.slug,
                c.op,
                None,  # undo: not computed here (below, the instance is given its image)
                c.after,
                c.before_version,
                c.after_version,
                keys,
            )
            revision = (
                build(*values)
                if positional
                else Revision(**dict(zip(_REVISION_FIELDS, values, strict=True)))
            )
            revision.before = c.before
            if cs is not None:
                revision.changeset = cs
            out.append(revision)
        return out


@dataclass
class PlannedResult:
    """What a planned write (revert, import) did: the ops it chose, as batch ops."""

    changeset: Changeset | None
    ops: list[dict[str, Any]]
    dry_run: bool
    applied: ApplyResult
