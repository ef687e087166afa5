"""Branch endpoints: thin views over ``branches.services`` and ``branches.selectors``."""

from __future__ import annotations

from dataclasses import replace

from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from atlas.api import paging
from atlas.api.idempotency import idempotent
from atlas.exceptions import NotFound, ValidationFailed
from branches import services
from branches.api import serializers as s
from branches.models import Branch
from branches.selectors import branch_diff, branch_get, branch_list, member_names
from changesets.api.serializers import changeset_repr
from entities import access
from entities.store import EntityKey

PROBLEM = OpenApiTypes.OBJECT
IDEMPOTENCY_PARAM = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Replays the first response for the same principal, key and request.",
)


def get_visible_branch(request: Request, name: str) -> Branch:
    """The branch, or 404 when it does not exist, is invisible, or the name is invalid."""
    branch = branch_get(name=name, user=request.user)
    if branch is None:
        raise NotFound("No such branch.")
    return branch


class BranchListView(APIView):
    @extend_schema(
        operation_id="branches_list",
        summary="Branches you can see, by name",
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, enum=s.STATUSES),
            OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, max 500."),
            OpenApiParameter("page_token", OpenApiTypes.STR, description="From next_page_token."),
        ],
        responses={200: s.BranchPageSerializer, 400: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request) -> Response:
        paging.check_known_params(request, {"status", "page_size", "page_token"})
        status = request.query_params.get("status") or None
        if status is not None and status not in s.STATUSES:
            raise ValidationFailed(
                f"status must be one of {', '.join(s.STATUSES)}.",
                errors=[{"pointer": "/status", "detail": f"One of {', '.join(s.STATUSES)}."}],
            )
        limit = paging.page_size(request)
        scope = f"branches:{status or ''}"
        position = paging.page_position(scope, request)
        after = None
        if position is not None:
            after = position.get("n")
            if not isinstance(after, str):
                raise paging.BadRequest("The page token is invalid.", pointer="/page_token")
        rows = branch_list(user=request.user, status=status, after=after, limit=limit + 1)
        token = None
        if len(rows) > limit:
            rows = rows[:limit]
            token = paging.encode_token(scope, request, {"n": rows[-1].name})
        readable = access.readable_namespaces(request.user)
        visible = s.visible_changeset_ids(rows, readable)
        members = member_names(rows)
        return Response(
            {
                "results": [s.branch_repr(b, readable, visible, members) for b in rows],
                "next_page_token": token,
            }
        )

    @extend_schema(
        operation_id="branches_create",
        summary="Cut a branch from baseline as it is now",
        request=s.BranchCreateSerializer,
        parameters=[IDEMPOTENCY_PARAM],
        responses={201: s.BranchSerializer, **{c: PROBLEM for c in (400, 403, 409, 415, 422)}},
    )
    @idempotent
    def post(self, request: Request) -> Response:
        name, comment = s.parse_create(request.data)
        branch = services.branch_create(name=name, actor=request.user, comment=comment)
        response = Response(
            s.branch_repr(branch, access.readable_namespaces(request.user)), status=201
        )
        response["Location"] = f"{request.path.rstrip('/')}/{branch.name}"
        return response


class BranchDetailView(APIView):
    @extend_schema(
        operation_id="branches_get",
        summary="One branch",
        responses={200: s.BranchSerializer, 404: PROBLEM},
    )
    def get(self, request: Request, name: str) -> Response:
        paging.check_known_params(request, set())
        branch = get_visible_branch(request, name)
        return Response(s.branch_repr(branch, access.readable_namespaces(request.user)))

    @extend_schema(
        operation_id="branches_abandon",
        summary="Abandon a branch: its overlay goes, its changesets stay in the log",
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={200: s.BranchSerializer, **{c: PROBLEM for c in (403, 404, 409)}},
    )
    @idempotent
    def delete(self, request: Request, name: str) -> Response:
        branch = get_visible_branch(request, name)
        branch = services.branch_abandon(branch=branch, actor=request.user)
        return Response(s.branch_repr(branch, access.readable_namespaces(request.user)))


class BranchDiffView(APIView):
    @extend_schema(
        operation_id="branches_diff",
        summary="What the branch changed (paged, in key order), and how far baseline moved",
        parameters=[
            OpenApiParameter("page_size", OpenApiTypes.INT, description="Default 50, max 500."),
            OpenApiParameter("page_token", OpenApiTypes.STR, description="From next_page_token."),
        ],
        responses={200: s.DiffSerializer, 400: PROBLEM, 404: PROBLEM, 422: PROBLEM},
    )
    def get(self, request: Request, name: str) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        branch = get_visible_branch(request, name)
        limit = paging.page_size(request)
        scope = f"branch-diff:{branch.name}"
        after = _diff_position(paging.page_position(scope, request))
        diff = branch_diff(
            branch=branch,
            namespaces=access.readable_namespaces(request.user),
            after=after,
            limit=limit + 1,
        )
        token = None
        if len(diff.changes) > limit:
            diff = replace(diff, changes=diff.changes[:limit])
            last = diff.changes[-1].key
            position = {"k": [last.namespace, last.kind, last.slug]}
            token = paging.encode_token(scope, request, position)
        return Response(s.diff_repr(diff, token))


def _diff_position(position: dict | None) -> EntityKey | None:
    """The key a diff page token continues after (400 when it is not one)."""
    if position is None:
        return None
    key = position.get("k")
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(p, str) for p in key)):
        raise paging.BadRequest("The page token is invalid.", pointer="/page_token")
    return EntityKey(*key)


class BranchMergeView(APIView):
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
    @idempotent
    def post(self, request: Request, name: str) -> Response:
        branch = get_visible_branch(request, name)
        dry_run, comment = s.parse_merge(request.data)
        result = services.branch_merge(
            branch=branch, actor=request.user, dry_run=dry_run, comment=comment
        )
        readable = access.readable_namespaces(request.user)
        return Response(
            {
                "changeset": (
                    changeset_repr(result.changeset, result.revisions) if result.changeset else None
                ),
                "merged": [s.ref_repr(k) for k in result.merged],
                "dry_run": result.dry_run,
                "branch": s.branch_repr(result.branch, readable),
            }
        )


class BranchMemberView(APIView):
    """``PUT|DELETE /branches/{name}/members/user/{username}``."""

    def _resolve(self, request: Request, name: str, username: str) -> tuple[Branch, object]:
        branch = get_visible_branch(request, name)
        user = None
        if "\x00" not in username:  # no user can have it (PostgreSQL text cannot)
            user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise NotFound("No such user.")
        return branch, user

    def _answer(self, request: Request, branch: Branch, status: int) -> Response:
        branch.refresh_from_db()
        return Response(
            s.branch_repr(branch, access.readable_namespaces(request.user)), status=status
        )

    @extend_schema(
        operation_id="branches_members_put",
        summary="Let a user write the branch (its creator, or a maintainer everywhere it wrote)",
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={
            200: s.BranchSerializer,
            201: s.BranchSerializer,
            **{c: PROBLEM for c in (403, 404, 409, 422)},
        },
    )
    @idempotent
    def put(self, request: Request, name: str, username: str) -> Response:
        branch, user = self._resolve(request, name, username)
        s.parse_member_put(request.data)
        added = services.branch_member_add(branch=branch, user=user, actor=request.user)
        return self._answer(request, branch, 201 if added else 200)

    @extend_schema(
        operation_id="branches_members_delete",
        summary="Take a user's membership of the branch away",
        request=None,
        parameters=[IDEMPOTENCY_PARAM],
        responses={204: None, **{c: PROBLEM for c in (403, 404, 409)}},
    )
    @idempotent
    def delete(self, request: Request, name: str, username: str) -> Response:
        branch, user = self._resolve(request, name, username)
        services.branch_member_remove(branch=branch, user=user, actor=request.user)
        return Response(status=204)
