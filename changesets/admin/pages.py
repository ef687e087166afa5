"""The admin's own pages over the log: changeset detail, revert, entity history, as-of.

They are plain functions taking the model admin (for permissions, the
scoped queryset and the admin site's context) and the request. None writes
to the database except the revert confirm, which calls the revert service
(``changesets.services.revert.changeset_revert``) as the logged-in user.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from atlas.admin_mixins import admin_roles, admin_user, pretty_json
from atlas.exceptions import AtlasError
from changesets.admin.diff import diff_images
from changesets.exceptions import RevertConflict
from changesets.models import BASELINE, Changeset, JournalEntry, Revision
from changesets.ops import canonical
from changesets.selectors.asof import entity_as_of
from changesets.selectors.log import entity_has_history, entity_history
from changesets.services.revert import changeset_revert
from entities.models import Entity
from entities.store import EntityKey, baseline

OPS_PER_PAGE = 50
HISTORY_PER_PAGE = 25
# How long a revert preview stays confirmable.
PREVIEW_MAX_AGE_SECONDS = 3600
_PLAN_SALT = "atlas.admin.revert-plan"


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


def _key(revision: Revision) -> EntityKey:
    return EntityKey(revision.namespace, revision.kind, revision.slug)


# --- shared -----------------------------------------------------------------------


def _context(model_admin: ModelAdmin, request: HttpRequest, title: str, **extra: Any) -> dict:
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
    changeset = model_admin.get_queryset(request).filter(pk=pk).first()
    if changeset is None:
        raise Http404("No such changeset.")
    return changeset


def journal_status(changeset: Changeset) -> JournalEntry | None:
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
    ops = Revision.objects.filter(changeset=changeset).order_by("id")
    if readable is not None:
        ops = ops.filter(namespace__in=readable)
    page = Paginator(ops, OPS_PER_PAGE).get_page(request.GET.get("page"))
    views = [
        OpView(
            revision=rev,
            key=_key(rev),
            diff=diff_images(rev.before, rev.after),
            history_url=history_url(_key(rev), rev.branch),
            as_of_url=as_of_url(_key(rev), changeset.id) if rev.branch == BASELINE else None,
        )
        for rev in page.object_list
    ]
    hidden_namespaces = 0 if readable is None else len(set(changeset.namespaces) - set(readable))
    context = _context(
        model_admin,
        request,
        f"Changeset #{changeset.seq}",
        changeset=changeset,
        original=changeset,
        visible_namespaces=[
            ns for ns in changeset.namespaces if readable is None or ns in readable
        ],
        hidden_namespaces=hidden_namespaces,
        journal=journal_status(changeset),
        page=page,
        ops=views,
        can_revert=can_revert(request, changeset),
        revert_url=reverse("admin:changesets_changeset_revert", args=[str(changeset.id)]),
        author_changesets_url=reverse("admin:changesets_changeset_changelist")
        + "?"
        + urlencode({"author": changeset.author_name}),
    )
    return render(request, "admin/changesets/changeset/detail.html", context)


# --- revert: preview, then confirm ------------------------------------------------


def plan_digest(changeset: Changeset, ops: list[dict[str, Any]]) -> str:
    """A digest of exactly what the revert would write (the inverse ops, in order)."""
    body = canonical({"changeset": str(changeset.id), "ops": ops})
    return hashlib.sha256(body.encode()).hexdigest()


def sign_plan(request: HttpRequest, changeset: Changeset, digest: str) -> str:
    return signing.dumps(
        {"c": str(changeset.id), "u": request.user.pk, "d": digest}, salt=_PLAN_SALT
    )


def read_plan(request: HttpRequest, changeset: Changeset, token: str) -> str | None:
    """The digest in ``token`` if it is this user's, for this changeset, and fresh."""
    try:
        data = signing.loads(token, salt=_PLAN_SALT, max_age=PREVIEW_MAX_AGE_SECONDS)
    except signing.BadSignature:  # also SignatureExpired
        return None
    if data.get("c") != str(changeset.id) or data.get("u") != request.user.pk:
        return None
    return data.get("d")


@dataclass
class ConflictView:
    key: EntityKey
    newer: Changeset | None
    history_url: str


@dataclass
class InverseOpView:
    op: dict[str, Any]
    key: EntityKey
    diff: Any
    history_url: str


@dataclass
class Preview:
    ops: list[dict[str, Any]]
    conflicts: list[ConflictView]
    error: str | None


def _dry_run(request: HttpRequest, changeset: Changeset) -> Preview:
    try:
        result = changeset_revert(
            store=baseline, actor=admin_user(request), changeset_id=str(changeset.id), dry_run=True
        )
    except RevertConflict as exc:
        conflicts = exc.conflicts or []
        newer_ids = [c["newer_changeset_id"] for c in conflicts if c.get("newer_changeset_id")]
        newer = {str(c.id): c for c in Changeset.objects.filter(pk__in=newer_ids)}
        return Preview(
            ops=[],
            conflicts=[
                ConflictView(
                    key=EntityKey(c["namespace"], c["kind"], c["slug"]),
                    newer=newer.get(str(c.get("newer_changeset_id"))),
                    history_url=history_url(EntityKey(c["namespace"], c["kind"], c["slug"])),
                )
                for c in conflicts
            ],
            error=None,
        )
    except AtlasError as exc:
        return Preview(ops=[], conflicts=[], error=exc.detail)
    return Preview(ops=result.ops, conflicts=[], error=None)


def revert_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: the dry run, explained. POST: confirm the previewed plan and revert.

    The confirm carries a signed digest of the previewed plan. The dry run is
    repeated and must yield the same digest, else nothing is written and the
    new plan is shown. The revert service then re-checks, under its row
    locks, that every entity still holds what the changeset left; the only
    change it tolerates is an entity already back at its pre-image (skipped),
    which ends in the same state the preview showed.
    """
    changeset = visible_changeset(model_admin, request, object_id)
    detail_url = changeset_url(changeset.id)
    if changeset.branch != BASELINE:
        messages.error(
            request,
            "Branch changesets are reverted on their branch through the API "
            "(POST …/revert with X-Atlas-Branch); the admin reverts baseline changesets.",
        )
        return HttpResponseRedirect(detail_url)
    if not can_revert(request, changeset):
        raise PermissionDenied
    preview_url = reverse("admin:changesets_changeset_revert", args=[str(changeset.id)])
    if request.method == "POST":
        return _confirm(model_admin, request, changeset, preview_url)
    return _render_preview(model_admin, request, changeset)


def _render_preview(
    model_admin: ModelAdmin, request: HttpRequest, changeset: Changeset, comment: str = ""
) -> HttpResponse:
    preview = _dry_run(request, changeset)
    revisions = {_key(r): r for r in Revision.objects.filter(changeset=changeset).order_by("id")}
    inverse = []
    for op in preview.ops:
        key = EntityKey(op["namespace"], op["kind"], op["slug"])
        rev = revisions[key]
        inverse.append(
            InverseOpView(
                op=op,
                key=key,
                diff=diff_images(rev.after, op.get("content")),
                history_url=history_url(key),
            )
        )
    planned = {v.key for v in inverse}
    conflicted = {c.key for c in preview.conflicts}
    already_back = [k for k in revisions if k not in planned and k not in conflicted]
    token = ""
    if preview.ops and not preview.conflicts and not preview.error:
        token = sign_plan(request, changeset, plan_digest(changeset, preview.ops))
    context = _context(
        model_admin,
        request,
        f"Revert changeset #{changeset.seq}?",
        changeset=changeset,
        original=changeset,
        preview=preview,
        inverse=inverse,
        already_back=already_back,
        token=token,
        comment=comment,
        detail_url=changeset_url(changeset.id),
        changeset_url=changeset_url,
    )
    return render(request, "admin/changesets/changeset/revert_preview.html", context)


def _confirm(
    model_admin: ModelAdmin, request: HttpRequest, changeset: Changeset, preview_url: str
) -> HttpResponse:
    comment = request.POST.get("comment", "")
    if len(comment) > 10_000 or "\x00" in comment:
        messages.error(request, "The comment must be at most 10,000 characters, without NUL.")
        return _render_preview(model_admin, request, changeset, comment=comment[:10_000])
    digest = read_plan(request, changeset, request.POST.get("plan", ""))
    if digest is None:
        messages.error(
            request, "No valid preview was confirmed (missing or expired). Review the plan again."
        )
        return HttpResponseRedirect(preview_url)
    current = _dry_run(request, changeset)
    if current.conflicts or current.error or plan_digest(changeset, current.ops) != digest:
        messages.warning(
            request,
            "The changeset's entities changed since your preview, so nothing was reverted. "
            "This is the plan as it stands now.",
        )
        return HttpResponseRedirect(preview_url)
    try:
        result = changeset_revert(
            store=baseline,
            actor=admin_user(request),
            changeset_id=str(changeset.id),
            comment=comment,
        )
    except RevertConflict:
        messages.warning(
            request,
            "An entity changed while reverting, so nothing was reverted. "
            "This is the plan as it stands now.",
        )
        return HttpResponseRedirect(preview_url)
    except AtlasError as exc:
        messages.error(request, f"Nothing was reverted: {exc.detail}")
        return HttpResponseRedirect(preview_url)
    if result.changeset is None:
        messages.info(request, "Nothing to revert: every entity was already back as before.")
        return HttpResponseRedirect(changeset_url(changeset.id))
    messages.success(
        request,
        f"Reverted changeset #{changeset.seq} as changeset #{result.changeset.seq} "
        f"({result.changeset.op_count} op{'s' if result.changeset.op_count != 1 else ''}).",
    )
    return HttpResponseRedirect(changeset_url(result.changeset.id))


# --- entity history and as-of ----------------------------------------------------


def _readable_key(request: HttpRequest, namespace: str, kind: str, slug: str) -> EntityKey:
    if not admin_roles(request).can_read(namespace):
        raise Http404("No such entity.")
    return EntityKey(namespace, kind, slug)


@dataclass
class HistoryEntry:
    revision: Revision
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
    if not entity_has_history(key=key, branch=branch):
        raise Http404("No such entity.")
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
    context = _context(
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
    changeset = changesets.first()
    if changeset is None:
        raise Http404("No such changeset.")
    then = entity_as_of(seq=changeset.seq, key=key)
    live = Entity.objects.filter(namespace_id=key.namespace, kind=key.kind, slug=key.slug).first()
    context = _context(
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
