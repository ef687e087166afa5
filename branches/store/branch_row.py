"""The branch row: the lock every branch write takes first, the checks made under
it, and closing the branch (merge, abandon)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.db import connection

from atlas.exceptions import PermissionDenied
from branches.exceptions import BranchClosed
from branches.models import Branch, BranchStatus
from branches.selectors import may_write
from entities import writer


class LockedBranch(NamedTuple):
    """The branch row as locked by :func:`lock_branch_row`."""

    id: int
    name: str
    status: str
    namespaces: list[str]
    created_by_id: int | None


def lock_branch_row(branch_id: int) -> LockedBranch:
    """``SELECT … FOR UPDATE`` the branch row.

    Every branch write, the merge, the abandon and membership changes take
    this lock first, so they queue behind each other: a write can never land
    on a branch that a concurrent merge or abandon has just closed, nor by a
    member whose removal committed first.

    Anything else judged under this lock (membership) must be read by a
    *later* statement: under READ COMMITTED a statement that waited for the
    lock sees the locked row's newest version, but every other table as of
    its own start, i.e. before the transaction it waited for committed.
    """
    row = (
        Branch.objects.select_for_update()
        .filter(pk=branch_id)
        .values_list("id", "name", "status", "namespaces", "created_by_id")
        .first()
    )
    if row is None:  # pragma: no cover - branch rows are never deleted
        raise BranchClosed("The branch no longer exists.")
    return LockedBranch(row[0], row[1], row[2], list(row[3]), row[4])


MSG_WRITE_DENIED = (
    "Writing branch {name!r} needs its creator, one of its members, or the maintainer role"
    " in every namespace it touches."
)


def require_writer(user: Any, locked: LockedBranch, namespaces: Iterable[str] = ()) -> None:
    """403 unless ``user`` may write the locked branch (:func:`branches.selectors.may_write`).

    ``namespaces``: those about to be written, which the branch touches from then on.
    Call it after :func:`lock_branch_row`: membership is read by a statement of its own.
    """
    if not may_write(
        user,
        branch_id=locked.id,
        created_by_id=locked.created_by_id,
        namespaces={*locked.namespaces, *namespaces},
    ):
        raise PermissionDenied(MSG_WRITE_DENIED.format(name=locked.name))


def require_open(name: str, status: str) -> None:
    if status != BranchStatus.OPEN:
        raise BranchClosed(f"Branch {name!r} is {status}; it takes no more changes.")


def close_branch(
    branch_id: int, *, status: str, now: datetime, merged_changeset_id: UUID | None = None
) -> None:
    """Mark the (locked) branch merged or abandoned and delete its overlay.

    The overlay is working state, not the log: the branch's changesets and
    revisions stay. Its rows go under the marker ``close:<branch id>``, the
    one the overlay's guard trigger lets delete this branch's rows
    (``entities.writer``); the statement clears it again.
    """
    Branch.objects.filter(pk=branch_id).update(
        status=str(status), closed_at=now, merged_changeset_id=merged_changeset_id
    )
    # Raw SQL buys setting, using and clearing the marker within one statement.
    with connection.cursor() as cursor:
        cursor.execute(_CLOSE_OVERLAY, [f"close:{branch_id}", branch_id])


_CLOSE_OVERLAY = (
    f"WITH {writer.MARK_JOIN} AS MATERIALIZED (SELECT set_config('atlas.writer', %s, true)),"
    f" d AS (DELETE FROM branches_branchentity o USING {writer.MARK_JOIN}"
    " WHERE o.branch_id = %s RETURNING 1)"
    f" SELECT {writer.done_sql('(SELECT count(*) FROM d)')}"
)
