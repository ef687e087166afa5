"""The admin's revert page: preview a changeset's revert, then confirm it.

The only admin page that writes. It is apart from the read-only pages
(``pages``) because its safety is its own: the confirm must write exactly
the plan the user previewed, so the preview is signed and re-derived on
confirm (see :func:`revert_view`). The write itself is the revert service's
(``changesets.services.revert.changeset_revert``), run as the logged-in user.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core import signing
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from atlas.admin_mixins import admin_user
from atlas.api.provenance import request_context
from atlas.exceptions import AtlasError
from changesets.admin.diff import diff_images
from changesets.admin.pages import (
    can_revert,
    changeset_url,
    history_url,
    page_context,
    revision_key,
    visible_changeset,
)
from changesets.exceptions import RevertConflict
from changesets.models import BASELINE, Changeset
from changesets.ops import canonical
from changesets.selectors.log import revisions_of
from changesets.services.revert import changeset_revert
from entities.store import EntityKey, baseline

# How long a revert preview stays confirmable.
PREVIEW_MAX_AGE_SECONDS = 3600
_PLAN_SALT = "atlas.admin.revert-plan"


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
    revisions = {revision_key(r): r for r in revisions_of(changeset).order_by("id")}
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
    context = page_context(
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
            context=request_context(request),
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
