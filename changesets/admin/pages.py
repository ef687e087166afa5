"""The admin's own read-only pages over the log: changeset detail, entity history, as-of.

They are plain functions taking the model admin (for permissions, the
scoped queryset and the admin site's context) and the request. None writes
to the database; the one page that does, revert, is in ``revert`` and
shares the links and checks defined here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from atlas.admin_mixins import admin_roles, pretty_json
from changesets.admin.diff import diff_images
from changesets.archive import boundary
from changesets.models import BASELINE, Changeset, JournalEntry, Revision
from changesets.selectors import changeset_ids
from changesets.selectors.asof import entity_as_of
from changesets.selectors.log import (
    entity_has_history,
    entity_history,
    previous_hash,
    revisions_of,
)
from changesets.selectors.rows import HistoryRow
from entities.models import Entity
from entities.store import EntityKey

OPS_PER_PAGE = 50
HISTORY_PER_PAGE = 25


# --- links ------------------------------------------------------------------------


def changeset_url(changeset_id: Any) -> str:
    return reverse("admin:changesets_changeset_change", args=[str(changeset_id)])


def history_url(key: EntityKey, branch: str = BASELINE) -> str:
    url = reverse(
        "admin:changesets_revision_entity_history", args=[key.namespace, key.kind, key.slug]
    )
    return f"{url}?{urlencode({'branch': branch})}" if branch else url


def as_of_url(key: EntityKey, changeset_id: Any) -> str:
    return reverse(
        "admin:changesets_revision_entity_as_of",
        args=[key.namespace, key.kind, key.slug, str(changeset_id)],
    )


def revision_key(revision: Revision) -> EntityKey:
    return EntityKey(revision.namespace, revision.kind, revision.slug)


# --- shared -----------------------------------------------------------------------


def page_context(model_admin: ModelAdmin, request: HttpRequest, title: str, **extra: Any) -> dict:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        **extra,
    }


def visible_changeset(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> Changeset:
    """The changeset if the user may view it; 404 when missing or invisible (invariant 8)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    try:
        pk = uuid.UUID(str(object_id))
    except ValueError as exc:
        raise Http404("No such changeset.") from exc
    changeset = changeset_ids.find(model_admin.get_queryset(request), pk)
    if changeset is None:
        if boundary.current() is not None:
            # The list ends at the cut: a changeset through it (still being removed,
            # or an unknown id that may be archived) is archived.
            held = changeset_ids.seq_of(pk)
            if held is not None:
                boundary.check_seq(held, "That changeset is archived.")
            boundary.check_unknown_changeset(pk)
        raise Http404("No such changeset.")
    return changeset


def journal_status(changeset: Changeset) -> JournalEntry | None:
    """The changeset's outstanding journal entry; None once published (publishing
    deletes it) and for a branch changeset (it never had one)."""
    return JournalEntry.objects.filter(changeset=changeset).first()


def can_revert(request: HttpRequest, changeset: Changeset) -> bool:
    """Baseline changesets, by users who may write every namespace the changeset touched."""
    return changeset.branch == BASELINE and admin_roles(request).can_write_all(changeset.namespaces)


# --- the changeset page -----------------------------------------------------------


@dataclass
class OpView:
    revision: Revision
    key: EntityKey
    diff: Any
    history_url: str
    as_of_url: str | None


def changeset_detail(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """The changeset, its journal status, and its ops (readable namespaces only) with diffs."""
    changeset = visible_changeset(model_admin, request, object_id)
    readable = admin_roles(request).readable()
    ops = revisions_of(changeset).order_by("id")
    if readable is not None:
        ops = ops.filter(namespace__in=readable)
    page = Paginator(ops, OPS_PER_PAGE).get_page(request.GET.get("page"))
    views = [
        OpView(
            revision=rev,
            key=revision_key(rev),
            diff=diff_images(rev.before, rev.after),
            history_url=history_url(revision_key(rev), rev.branch),
            as_of_url=as_of_url(revision_key(rev), changeset.id)
            if rev.branch == BASELINE
            else None,
        )
        for rev in page.object_list
    ]
    hidden_namespaces = 0 if readable is None else len(set(changeset.namespaces) - set(readable))
    context = page_context(
        model_admin,
        request,
        f"Changeset #{changeset.seq}",
        changeset=changeset,
        original=changeset,
        prev_hash=previous_hash(changeset),
        visible_namespaces=[
            ns for ns in changeset.namespaces if readable is None or ns in readable
        ],
        hidden_namespaces=hidden_namespaces,
        journal=journal_status(changeset),
        metadata_json=json.dumps(changeset.metadata, indent=2, ensure_ascii=False)
        if changeset.metadata
        else "",
        page=page,
        ops=views,
        can_revert=can_revert(request, changeset),
        revert_url=reverse("admin:changesets_changeset_revert", args=[str(changeset.id)]),
        author_changesets_url=reverse("admin:changesets_changeset_changelist")
        + "?"
        + urlencode({"author": changeset.author_name}),
    )
    return render(request, "admin/changesets/changeset/detail.html", context)


# --- entity history and as-of ----------------------------------------------------


def _readable_key(request: HttpRequest, namespace: str, kind: str, slug: str) -> EntityKey:
    if not admin_roles(request).can_read(namespace):
        raise Http404("No such entity.")
    return EntityKey(namespace, kind, slug)


@dataclass
class HistoryEntry:
    revision: HistoryRow
    diff: Any
    as_of_url: str | None


def entity_history_view(
    model_admin: ModelAdmin, request: HttpRequest, namespace: str, kind: str, slug: str
) -> HttpResponse:
    """One entity's timeline, newest first: who, when, which rpc, and the diff of each change."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    key = _readable_key(request, namespace, kind, slug)
    branch = request.GET.get("branch", BASELINE)
    before = request.GET.get("before")
    before_seq = int(before) if before and before.isdigit() else None
    if boundary.current() is None and not entity_has_history(key=key, branch=branch):
        raise Http404("No such entity.")  # after a cut, an empty history ends at it
    revisions = entity_history(
        key=key, branch=branch, before_seq=before_seq, limit=HISTORY_PER_PAGE + 1
    )
    more = len(revisions) > HISTORY_PER_PAGE
    revisions = revisions[:HISTORY_PER_PAGE]
    entries = [
        HistoryEntry(
            revision=rev,
            diff=diff_images(rev.before, rev.after),
            as_of_url=as_of_url(key, rev.changeset_id) if branch == BASELINE else None,
        )
        for rev in revisions
    ]
    older_url = None
    if more:
        query: dict[str, str | int] = {"branch": branch} if branch else {}
        older_url = "?" + urlencode({**query, "before": revisions[-1].seq})
    live = Entity.objects.filter(namespace_id=key.namespace, kind=key.kind, slug=key.slug).first()
    context = page_context(
        model_admin,
        request,
        f"History of {key}",
        key=key,
        branch=branch,
        entries=entries,
        older_url=older_url,
        newest_url=history_url(key, branch) if before_seq is not None else None,
        live=live,
        live_url=(
            reverse("admin:entities_entity_change", args=[live.pk]) if live is not None else None
        ),
        changeset_url=changeset_url,
    )
    return render(request, "admin/changesets/revision/entity_history.html", context)


def entity_as_of_view(
    model_admin: ModelAdmin,
    request: HttpRequest,
    namespace: str,
    kind: str,
    slug: str,
    changeset_id: str,
) -> HttpResponse:
    """The entity as it stood right after a baseline changeset, and how it differs now."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    key = _readable_key(request, namespace, kind, slug)
    readable = admin_roles(request).readable()
    changesets = Changeset.objects.filter(pk=changeset_id, branch=BASELINE)
    if readable is not None:
        changesets = changesets.filter(namespaces__overlap=readable)
    changeset = changeset_ids.find(changesets, changeset_id)
    if changeset is None:
        boundary.check_unknown_changeset(changeset_id)
        raise Http404("No such changeset.")
    then = entity_as_of(seq=changeset.seq, key=key)
    live = Entity.objects.filter(namespace_id=key.namespace, kind=key.kind, slug=key.slug).first()
    context = page_context(
        model_admin,
        request,
        f"{key} as of changeset #{changeset.seq}",
        key=key,
        changeset=changeset,
        then=then,
        then_json=pretty_json(then.content) if then is not None else None,
        live=live,
        diff_to_now=diff_images(
            then.content if then is not None else None, live.content if live else None
        ),
        history_url=history_url(key),
        changeset_url=changeset_url,
    )
    return render(request, "admin/changesets/revision/entity_as_of.html", context)
