"""The check every branch service makes first: may the caller see the branch?"""

from __future__ import annotations

from django.contrib.auth.models import User

from atlas.exceptions import NotFound
from branches.models import Branch
from branches.selectors import can_see


def require_visible(branch: Branch, actor: User) -> None:
    """404 for a branch the actor cannot see (the API resolves names the same way).

    Judged on the stored row: ``branch`` may predate writes that widened who sees it.
    """
    if not can_see(Branch.objects.get(pk=branch.pk), actor):
        raise NotFound("No such branch.")
