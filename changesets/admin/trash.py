"""The admin's trash: deleted entities per namespace, and restoring one of them.

Three pages, all off :mod:`changesets.selectors.restore`:

- the index (``deleted/``): the namespaces the user can read, each linking to
- the namespace's "Deleted" view (``deleted/<ns>/``): keys whose newest
  revision is a delete, with who deleted them when and what they held, and a
  restore button where the user may write the namespace;
- the restore page (``deleted/<ns>/<kind>/<slug>/restore/``): GET previews
  (a dry run of ``entity_restore`` back to the version the delete removed),
  POST confirms it.

The confirm is revert's mechanism (``changesets.admin.revert``): the preview
signs a digest of exactly what it showed (the key, the delete it undoes, the
content it brings back); the confirm re-derives it and writes only if it is
unchanged, and the write itself is create-only (``if_none_match``), judged
under the write service's row lock, so an entity re-created meanwhile is
never overwritten.
"""

from __future__ import annotations

import hashlib

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import urlencode

from atlas.admin_mixins import admin_roles, admin_user, pretty_json
from atlas.api.provenance import request_context
from atlas.exceptions import AtlasError, PreconditionFailed
from changesets.admin.diff import diff_images
from changesets.admin.pages import changeset_url, history_url, page_context
from changesets.admin.revert import PREVIEW_MAX_AGE_SECONDS
from changesets.ops import canonical
from changesets.selectors.restore import DeletedEntity, deleted_entities, deleted_entity
from changesets.services.restore import entity_restore
from entities.models import Namespace
from entities.store import EntityKey, baseline

TRASH_PER_PAGE = 50
_PLAN_SALT = "atlas.admin.restore-plan"


def trash_url(namespace: str) -> str:
    return reverse("admin:changesets_revision_deleted", args=[namespace])


def restore_url(key: EntityKey) -> str:
    return reverse("admin:changesets_revision_restore", args=[key.namespace, key.kind, key.slug])


def _require_view(model_admin: ModelAdmin, request: HttpRequest) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def _readable_namespace(request: HttpRequest, namespace: str) -> str:
    """``namespace`` if it exists and the user reads it; else 404 (invariant 8)."""
    if not admin_roles(request).can_read(namespace):
        raise Http404("No such namespace.")
    if not Namespace.objects.filter(name=namespace).exists():
        raise Http404("No such namespace.")
    return namespace


def trash_index_view(model_admin: ModelAdmin, request: HttpRequest) -> HttpResponse:
    """The namespaces the user can read, each a link to its "Deleted" view."""
    _require_view(model_admin, request)
    readable = admin_roles(request).readable()
    names = Namespace.objects.order_by("name").values_list("name", flat=True)
    if readable is not None:
        names = names.filter(name__in=readable)
    context = page_context(
        model_admin,
        request,
        "Deleted entities",
        namespaces=[(name, trash_url(name)) for name in names[:500]],
    )
    return render(request, "admin/changesets/revision/trash_index.html", context)


def trash_view(model_admin: ModelAdmin, request: HttpRequest, namespace: str) -> HttpResponse:
    """One keyset page of a namespace's trash (``?after=kind/slug`` resumes)."""
    _require_view(model_admin, request)
    _readable_namespace(request, namespace)
    after = None
    kind_slug = request.GET.get("after", "").split("/", 1)
    if len(kind_slug) == 2:
        after = EntityKey(namespace, *kind_slug)
    rows = deleted_entities(
        namespaces=None, namespace=namespace, after=after, limit=TRASH_PER_PAGE + 1
    )
    more = len(rows) > TRASH_PER_PAGE
    rows = rows[:TRASH_PER_PAGE]
    can_restore = admin_roles(request).can_write_all([namespace])
    entries = [
        {
            "entry": row,
            "history_url": history_url(row.key),
            "changeset_url": changeset_url(row.changeset_id),
            "restore_url": restore_url(row.key) if can_restore else None,
            "content": pretty_json(row.content),
        }
        for row in rows
    ]
    older = None
    if more:
        last = rows[-1].key
        older = "?" + urlencode({"after": f"{last.kind}/{last.slug}"})
    context = page_context(
        model_admin,
        request,
        f"Deleted in {namespace}",
        namespace=namespace,
        entries=entries,
        next_url=older,
        first_url=trash_url(namespace) if after is not None else None,
        can_restore=can_restore,
    )
    return render(request, "admin/changesets/revision/trash.html", context)


def plan_digest(entry: DeletedEntity) -> str:
    """A digest of exactly what the restore would do: bring ``entry.content`` back
    as the key's next version, undoing that one delete."""
    body = canonical(
        {
            "key": str(entry.key),
            "delete": str(entry.changeset_id),
            "version": entry.last_version,
            "content": entry.content,
        }
    )
    return hashlib.sha256(body.encode()).hexdigest()


def sign_plan(request: HttpRequest, key: EntityKey, digest: str) -> str:
    return signing.dumps({"k": str(key), "u": request.user.pk, "d": digest}, salt=_PLAN_SALT)


def read_plan(request: HttpRequest, key: EntityKey, token: str) -> str | None:
    """The digest in ``token`` if it is this user's, for this key, and fresh."""
    try:
        data = signing.loads(token, salt=_PLAN_SALT, max_age=PREVIEW_MAX_AGE_SECONDS)
    except signing.BadSignature:  # also SignatureExpired
        return None
    if data.get("k") != str(key) or data.get("u") != request.user.pk:
        return None
    return data.get("d")


def restore_view(
    model_admin: ModelAdmin, request: HttpRequest, namespace: str, kind: str, slug: str
) -> HttpResponse:
    """GET: the preview of restoring a deleted entity. POST: confirm it.

    The entity comes back with the content the delete removed (its
    ``last_version``), as a new changeset (rpc ``RestoreEntity``) authored by
    the user. Readers of the namespace see the trash but get no button and a
    403 here; an entity no longer in the trash sends the user back to it.
    """
    _require_view(model_admin, request)
    _readable_namespace(request, namespace)
    if not admin_roles(request).can_write_all([namespace]):
        raise PermissionDenied
    key = EntityKey(namespace, kind, slug)
    entry = deleted_entity(key=key)
    if entry is None:
        messages.info(request, f"{key} is not deleted (it exists, or never did).")
        return HttpResponseRedirect(trash_url(namespace))
    if request.method == "POST":
        return _confirm(request, entry)
    return _render_preview(model_admin, request, entry)


def _render_preview(
    model_admin: ModelAdmin, request: HttpRequest, entry: DeletedEntity, comment: str = ""
) -> HttpResponse:
    error = None
    try:
        entity_restore(
            store=baseline,
            actor=admin_user(request),
            key=entry.key,
            version=entry.last_version,
            if_none_match=True,
            dry_run=True,
        )
    except AtlasError as exc:
        error = exc.detail
    token = "" if error else sign_plan(request, entry.key, plan_digest(entry))
    context = page_context(
        model_admin,
        request,
        f"Restore {entry.key}?",
        entry=entry,
        error=error,
        diff=diff_images(None, entry.content),
        token=token,
        comment=comment,
        trash_url=trash_url(entry.key.namespace),
        history_url=history_url(entry.key),
        changeset_url=changeset_url(entry.changeset_id),
    )
    return render(request, "admin/changesets/revision/restore_preview.html", context)


def _confirm(request: HttpRequest, entry: DeletedEntity) -> HttpResponse:
    key, preview = entry.key, restore_url(entry.key)
    comment = request.POST.get("comment", "")
    if len(comment) > 10_000 or "\x00" in comment:
        messages.error(request, "The comment must be at most 10,000 characters, without NUL.")
        return HttpResponseRedirect(preview)
    digest = read_plan(request, key, request.POST.get("plan", ""))
    if digest is None:
        messages.error(
            request, "No valid preview was confirmed (missing or expired). Review the plan again."
        )
        return HttpResponseRedirect(preview)
    if plan_digest(entry) != digest:
        messages.warning(
            request,
            f"{key} changed since your preview, so nothing was restored. "
            "This is the plan as it stands now.",
        )
        return HttpResponseRedirect(preview)
    try:
        done = entity_restore(
            store=baseline,
            actor=admin_user(request),
            key=key,
            version=entry.last_version,
            if_none_match=True,
            comment=comment,
            context=request_context(request),
        )
    except PreconditionFailed:
        messages.warning(request, f"{key} was re-created meanwhile, so nothing was restored.")
        return HttpResponseRedirect(history_url(key))
    except AtlasError as exc:
        messages.error(request, f"Nothing was restored: {exc.detail}")
        return HttpResponseRedirect(preview)
    changeset = done.applied.changeset
    if changeset is None:  # pragma: no cover - create-only on an absent key always writes
        return HttpResponseRedirect(history_url(key))
    messages.success(
        request,
        f"Restored {key} (version {entry.last_version}'s content) as changeset #{changeset.seq}.",
    )
    return HttpResponseRedirect(changeset_url(changeset.id))
