"""Branch endpoints: one thin viewset over ``branches.services`` and ``branches.selectors``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.auth import actor
from atlas.api.idempotency import idempotent
from atlas.api.openapi import IDEMPOTENCY_PARAM, PAGE_PARAMS, PROBLEM
from atlas.api.provenance import request_context
from atlas.api.representations import changeset_repr
from atlas.exceptions import NotFound
from branches import services
from branches.api import serializers as s
from branches.models import Branch
from branches.selectors import (
    branch_diff,
    branch_fresh,
    branch_get,
    branch_list,
    member_names,
    user_by_username,
    visible_changeset_ids,
)
from branches.sync import branch_sync
from entities import access
from entities.store import EntityKey

_MEMBERS = "``PUT|DELETE /branches/{name}/members/user/{username}``."


# Branches: cut, read, diff, merge, sync, abandon, and who besides the creator may write.
# (No class docstring: drf-spectacular would make it every operation's description.)
class BranchViewSet(viewsets.ViewSet):
    lookup_url_kwarg = "name"
    lookup_value_converter = "str"

    def get_object(self) -> Branch:
        """The branch, or 404 when it does not exist, is invisible, or the name is invalid."""
        branch = branch_get(name=self.kwargs[self.lookup_url_kwarg], user=self.request.user)
        if branch is None:
            raise NotFound("No such branch.")
        return branch

    def _repr(self, branch: Branch, status: int = 200) -> Response:
        readable = access.readable_namespaces(self.request.user)
        return Response(s.branch_repr(branch, readable), status=status)

    @extend_schema(
        operation_id="branches_list",
        summary="Branches you can see, by name",
        parameters=[s.BranchListQuery, *PAGE_PARAMS],
        responses={200: s.BranchPageSerializer, 400: PROBLEM, 422: PROBLEM},
    )
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {*s.BranchListQuery.names(), "page_size", "page_token"})
        status = strict.validated(s.BranchListQuery, request.query_params).get("status")
        page = paging.keyset_page(
            request,
            scope=f"branches:{status or ''}",
            field="n",
            field_type=str,
            fetch=lambda after, limit: branch_list(
                user=request.user, status=status, after=after, limit=limit
            ),
            position_of=lambda branch: branch.name,
        )
        readable = access.readable_namespaces(request.user)
        visible = visible_changeset_ids(page.results, readable)
        members = member_names(page.results)
        results = [s.branch_repr(b, readable, visible, members) for b in page.results]
        return Response({"results": results, "next_page_token": page.next_page_token})

    @extend_schema(
        operation_id="branches_create",
        summary="Cut a branch from baseline as it is now",
        request=s.BranchCreateSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: s.BranchSerializer, **{c: PROBLEM for c in (400, 403, 409, 415, 422)}},
    )
    @idempotent
    def create(self, request: Request) -> Response:
        body = strict.validated(s.BranchCreateSerializer, request.data)
        branch = services.branch_create(
            name=body["name"], actor=actor(request), comment=body.get("comment", "")
        )
        response = self._repr(branch, status=201)
        response["Location"] = f"{request.path.rstrip('/')}/{branch.name}"
        return response

    @extend_schema(
        operation_id="branches_get",
        summary="One branch",
        responses={200: s.BranchSerializer, 404: PROBLEM},
    )
    def retrieve(self, request: Request, name: str) -> Response:
        paging.check_known_params(request, set())
        return self._repr(self.get_object())

    @extend_schema(
        operation_id="branches_abandon",
        summary="Abandon a branch: its overlay goes, its changesets stay in the log",
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={200: s.BranchSerializer, **{c: PROBLEM for c in (403, 404, 409)}},
    )
    @idempotent
    def destroy(self, request: Request, name: str) -> Response:
        branch = services.branch_abandon(branch=self.get_object(), actor=actor(request))
        return self._repr(branch)

    @extend_schema(
        operation_id="branches_diff",
        summary="What the branch changed (paged, in key order), and how far baseline moved",
        parameters=PAGE_PARAMS,
        responses={200: s.DiffSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    @action(detail=True, methods=["get"])
    def diff(self, request: Request, name: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        branch = self.get_object()
        readable = access.readable_namespaces(request.user)
        diffs = []  # the Diff the page came from: its counts ride along

        def changes_after(after: list[str] | None, limit: int) -> list[Any]:
            key = EntityKey(*after) if after is not None else None
            diffs.append(branch_diff(branch=branch, namespaces=readable, after=key, limit=limit))
            return diffs[-1].changes

        page = paging.keyset_page(
            request,
            scope=f"branch-diff:{branch.name}",
            field="k",
            field_type=list,
            fetch=changes_after,
            position_of=lambda change: [change.key.namespace, change.key.kind, change.key.slug],
        )
        return Response(s.diff_repr(replace(diffs[-1], changes=page.results), page.next_page_token))

    @extend_schema(
        operation_id="branches_merge",
        summary="Land the branch on baseline as one changeset (rpc MergeBranch)",
        request=s.MergeBodySerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={
            200: s.MergeResponseSerializer,
            **{c: PROBLEM for c in (400, 403, 404, 409, 413, 415, 422)},
        },
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def merge(self, request: Request, name: str) -> Response:
        branch = self.get_object()
        body = strict.validated(s.MergeBodySerializer, request.data)
        result = services.branch_merge(
            branch=branch,
            actor=actor(request),
            dry_run=body["dry_run"],
            comment=body.get("comment", ""),
            metadata=body.get("metadata"),
            context=request_context(request),
            granularity=body["granularity"],
            resolutions=s.resolutions(body),
        )
        readable = access.readable_namespaces(request.user)
        changeset = result.changeset
        return Response(
            {
                "changeset": changeset_repr(changeset, result.revisions) if changeset else None,
                "merged": [s.ref_repr(k) for k in result.merged],
                "dry_run": result.dry_run,
                "branch": s.branch_repr(result.branch, readable),
            }
        )

    @extend_schema(
        operation_id="branches_sync",
        summary="Move the branch's base point to baseline's head, merging baseline's newer"
        " changes in (rpc SyncBranch)",
        request=s.SyncBodySerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={
            200: s.SyncResponseSerializer,
            **{c: PROBLEM for c in (400, 403, 404, 409, 413, 415, 422)},
        },
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def sync(self, request: Request, name: str) -> Response:
        branch = self.get_object()
        body = strict.validated(s.SyncBodySerializer, request.data)
        result = branch_sync(
            branch=branch,
            actor=actor(request),
            granularity=body["granularity"],
            resolutions=s.resolutions(body),
            dry_run=body["dry_run"],
            comment=body.get("comment", ""),
            metadata=body.get("metadata"),
            context=request_context(request),
        )
        readable = access.readable_namespaces(request.user)
        changeset = result.changeset
        return Response(
            {
                "changeset": changeset_repr(changeset, result.planned.applied.revisions)
                if changeset
                else None,
                "ops": result.planned.ops,
                "dry_run": body["dry_run"],
                "branch": s.branch_repr(result.branch, readable),
            }
        )

    def _member(self, username: str) -> tuple[Branch, Any]:
        branch = self.get_object()
        user = user_by_username(username)
        if user is None:
            raise NotFound("No such user.")
        return branch, user

    @extend_schema(
        operation_id="branches_members_put",
        summary="Let a user write the branch (its creator, or a maintainer everywhere it wrote)",
        description=_MEMBERS,
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={
            200: s.BranchSerializer,
            201: s.BranchSerializer,
            **{c: PROBLEM for c in (403, 404, 409, 422)},
        },
    )
    @action(
        detail=True,
        methods=["put"],
        url_path="members/user/<str:username>",
        url_name="member",
    )
    @idempotent
    def member(self, request: Request, name: str, username: str) -> Response:
        branch, user = self._member(username)
        strict.validated(strict.Empty, request.data)
        added = services.branch_member_add(branch=branch, user=user, actor=actor(request))
        return self._repr(branch_fresh(branch=branch), status=201 if added else 200)

    @extend_schema(
        operation_id="branches_members_delete",
        summary="Take a user's membership of the branch away",
        description=_MEMBERS,
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={204: None, **{c: PROBLEM for c in (403, 404, 409)}},
    )
    @member.mapping.delete
    @idempotent
    def member_remove(self, request: Request, name: str, username: str) -> Response:
        branch, user = self._member(username)
        services.branch_member_remove(branch=branch, user=user, actor=actor(request))
        return Response(status=204)
