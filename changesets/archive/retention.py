"""Retention: when the beat task cuts, from ``ATLAS_RETENTION_DAYS`` and each namespace's own.

What a per-namespace policy can mean when a cut is one seq for the whole log
(changesets span namespaces, and the chain is cut in one place): a
namespace's retention is a **floor**, "keep at least this many days of its
history hot". The cut goes where every namespace's floor allows:

1. Each namespace's retention is its own (``NamespaceRetention``, edited in
   the admin) or, without one, ``ATLAS_RETENTION_DAYS``; 0 or unset means
   "keep hot for ever".
2. If any namespace keeps its history for ever, nothing is cut.
3. Otherwise the cut is at ``now - max(retention)``: the longest floor wins,
   so a namespace asking for two years keeps everyone's last two years hot
   (a changeset touching it and another must be in one place), and a shorter
   retention takes effect only once every namespace allows it.

Nothing is lost either way: what is cut goes to the signed archive. The
archiver then pulls the cut back for open branches, subscriptions and the
journal (``changesets.archive.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from atlas import conf
from changesets.archive import archiver
from changesets.archive.models import ArchiveCut, ArchiveRewrite, CutState, NamespaceRetention
from entities.models import Namespace


@dataclass(frozen=True)
class Policy:
    """The cut retention asks for now (``before`` None: keep everything) and why."""

    before: datetime | None
    reason: str


def policy(now: datetime | None = None) -> Policy:
    """Steps 1-3 of the module docstring."""
    now = now or timezone.now()
    default = int(conf.get("ATLAS_RETENTION_DAYS") or 0)
    own = dict(NamespaceRetention.objects.values_list("namespace_id", "days"))
    names = list(Namespace.objects.values_list("name", flat=True))
    days = {name: own.get(name, default) for name in names}
    forever = sorted(name for name, d in days.items() if d <= 0)
    if forever:
        return Policy(None, f"{len(forever)} namespace(s) keep history for ever ({forever[0]}…)")
    if not days:
        if default <= 0:
            return Policy(None, "no retention is set")
        days = {"(global)": default}
    name, longest = max(days.items(), key=lambda item: (item[1], item[0]))
    return Policy(now - timedelta(days=longest), f"{name} keeps {longest} day(s)")


def has_work() -> bool:
    """A cut left open or a rewrite pending: the task finishes it whatever the policy."""
    return (
        ArchiveCut.objects.exclude(state=CutState.REMOVED).exists()
        or ArchiveRewrite.objects.exclude(state="done").exists()
    )


def apply(now: datetime | None = None) -> tuple[Policy, archiver.Outcome | None]:
    """Cut where the policy says (and finish open work); ``None`` when there is nothing."""
    wanted = policy(now)
    if wanted.before is None and not has_work():
        return wanted, None
    return wanted, archiver.archive(before=wanted.before, requested_by="retention")
