"""The admin's merge page for a branch: conflicts per pointer, pick a side for each, merge.

A key-level merge (``branches.services.branch_merge`` with ``granularity="key"``),
run as the logged-in user. GET is its dry run: what would land, and every
pointer both sides changed differently with base, baseline and branch values.
POST sends one resolution per conflict (the radio buttons: branch or
baseline); the service decides again under its locks, so a conflict that
appeared since the page was drawn is shown, not overwritten.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse

from atlas.admin_mixins import admin_user, pretty_json
from atlas.api.provenance import request_context
from atlas.exceptions import AtlasError
from branches.exceptions import MergeConflict
from branches.keymerge import SIDES, Resolution
from branches.models import Branch
from branches.selectors import can_see
from branches.services import branch_merge
from changesets import pointers
from entities.store import EntityKey


@dataclass
class ConflictRow:
    index: int
    key: EntityKey
    pointer: str
    base: str
    ours: str
    theirs: str
    field: str  # the form field of its radio buttons


@dataclass
class Preview:
    landing: list[EntityKey]
    conflicts: list[ConflictRow]
    error: str | None


def _rows(conflicts: list[dict[str, Any]]) -> list[ConflictRow]:
    return [
        ConflictRow(
            index=i,
            key=EntityKey(c["namespace"], c["kind"], c["slug"]),
            pointer=c["pointer"],
            base=pretty_json(c["base"]),
            ours=pretty_json(c["ours"]),
            theirs=pretty_json(c["theirs"]),
            field=f"take-{i}",
        )
        for i, c in enumerate(conflicts)
    ]


def _preview(request: HttpRequest, branch: Branch, resolutions: list[Resolution]) -> Preview:
    try:
        result = branch_merge(
            branch=branch,
            actor=admin_user(request),
            dry_run=True,
            granularity="key",
            resolutions=resolutions,
        )
    except MergeConflict as exc:
        return Preview([], _rows(exc.conflicts or []), None)
    except AtlasError as exc:
        return Preview([], [], exc.detail)
    return Preview(result.merged, [], None)


def _resolutions(request: HttpRequest) -> tuple[list[Resolution], bool]:
    """The posted choices, and whether every conflict on the page got one."""
    try:
        shown = json.loads(request.POST.get("conflicts", "[]"))
    except ValueError:
        shown = []
    resolutions: list[Resolution] = []
    complete = True
    for i, item in enumerate(shown if isinstance(shown, list) else []):
        take = request.POST.get(f"take-{i}")
        try:
            ns, kind, slug, pointer = (str(part) for part in item)
        except (TypeError, ValueError):
            complete = False
            continue
        if take not in SIDES or not pointers.is_pointer(pointer):
            complete = False
            continue
        resolutions.append(Resolution(EntityKey(ns, kind, slug), take, pointer))
    return resolutions, complete


def merge_view(model_admin: ModelAdmin, request: HttpRequest, object_id: str) -> HttpResponse:
    """GET: the key-level merge's dry run with a branch/baseline choice per conflict.
    POST: merge with the chosen resolutions (only if each conflict shown got one)."""
    branch = Branch.objects.filter(pk=object_id).first() if object_id.isdigit() else None
    if branch is None or not can_see(branch, admin_user(request)):
        raise Http404("No such branch.")
    detail_url = reverse("admin:branches_branch_change", args=[branch.pk])
    if request.method == "POST":
        resolutions, complete = _resolutions(request)
        if not complete:
            messages.error(request, "Pick branch or baseline for every conflict.")
            return _render(model_admin, request, branch, detail_url)
        try:
            result = branch_merge(
                branch=branch,
                actor=admin_user(request),
                granularity="key",
                resolutions=resolutions,
                comment=request.POST.get("comment", "")[:10_000].replace("\x00", ""),
                context=request_context(request),
            )
        except MergeConflict:
            messages.warning(
                request,
                "Baseline or the branch changed since this page was drawn: nothing was merged."
                " These are the conflicts as they stand now.",
            )
            return _render(model_admin, request, branch, detail_url)
        except AtlasError as exc:
            messages.error(request, f"Nothing was merged: {exc.detail}")
            return HttpResponseRedirect(detail_url)
        landed = result.changeset
        messages.success(
            request,
            f"Merged branch {branch.name!r} as changeset #{landed.seq}."
            if landed
            else f"Merged branch {branch.name!r}: nothing to land on baseline.",
        )
        return HttpResponseRedirect(detail_url)
    return _render(model_admin, request, branch, detail_url)


def _render(
    model_admin: ModelAdmin, request: HttpRequest, branch: Branch, detail_url: str
) -> HttpResponse:
    preview = _preview(request, branch, [])
    shown = [[r.key.namespace, r.key.kind, r.key.slug, r.pointer] for r in preview.conflicts]
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Merge branch {branch.name}",
        "branch": branch,
        "preview": preview,
        "conflicts_json": json.dumps(shown),
        "detail_url": detail_url,
    }
    return render(request, "admin/branches/branch/merge.html", context)
