"""The change feed (``GET /changes``) and subscriptions (superusers): thin viewsets.

Shapes and bodies in :mod:`changesets.api.feed_serializers`; reads in
:mod:`changesets.selectors.feed`, writes in :mod:`changesets.outbox.subscriptions`.
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging, strict
from atlas.api.auth import actor
from atlas.api.idempotency import idempotent
from atlas.api.openapi import PAGE_PARAMS, PROBLEM
from atlas.exceptions import NotFound, PermissionDenied
from atlas.replicas import replica_read
from changesets.api import feed_serializers as s
from changesets.archive import boundary
from changesets.models import Subscription
from changesets.outbox import metrics
from changesets.outbox import subscriptions as subs
from changesets.selectors import feed
from entities import access


# ``GET /changes``: baseline changes after a cursor, in commit order. (No class
# docstrings on viewsets: drf-spectacular would make them operation descriptions.)
class ChangeFeedViewSet(viewsets.ViewSet):
    @extend_schema(
        operation_id="changes_list",
        summary="The change feed: baseline changes after a cursor, in commit order",
        parameters=[s.FeedQuery],
        responses={200: s.FeedPageSerializer, 400: PROBLEM, 410: PROBLEM, 422: PROBLEM},
    )
    @replica_read()
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, s.FeedQuery.names())
        query = strict.validated(s.FeedQuery, request.query_params)
        readable = access.readable_namespaces(request.user)
        namespaces = feed.effective_namespaces(readable, query.get("namespace"))
        after_seq = query["after_seq"]
        cut = boundary.current()
        if cut is not None and "since" not in query:
            after_seq = cut.seq  # "from the beginning" begins at the cut
        with metrics.feed_page_timer("pull"):
            page = feed.feed_page(
                after_seq=after_seq,
                namespaces=namespaces,
                capture=query["capture"],
                limit=query["limit"],
                from_cut="since" not in query,
            )
        body = page.as_dict()
        body["watermark"] = feed.visible_watermark(body["watermark"], readable)
        if not page.records and "since" in query:
            body["next_cursor"] = query["since"]  # an empty page keeps the reader where it was
        if cut is not None and after_seq == cut.seq:
            body["archived_before"] = boundary.marker(cut)  # what came before is archived
        return Response(body)


class IsSuperuser(BasePermission):
    """Subscriptions see every namespace's changes, so only superusers manage them
    (``is_staff`` alone grants nothing here)."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if not access.is_superuser(request.user):
            raise PermissionDenied("Subscriptions are managed by superusers.")
        return True


def _no_body(request: Request) -> None:
    """The actions take no fields: no body (JSON null included), or an empty object."""
    if request.data not in (None, b"", ""):
        strict.validated(strict.Empty, request.data)


_ACTION_PROBLEMS = {403: PROBLEM, 404: PROBLEM, 409: PROBLEM}


# Webhook subscriptions to the feed: superusers only.
class SubscriptionViewSet(viewsets.ViewSet):
    permission_classes = [IsSuperuser]
    lookup_url_kwarg = "subscription_id"
    lookup_value_converter = "str"

    def get_object(self) -> Subscription:
        subscription_id = self.kwargs[self.lookup_url_kwarg]
        try:
            uuid.UUID(subscription_id)
        except ValueError as exc:
            raise NotFound("No such subscription.") from exc
        subscription = subs.subscription_get(subscription_id=subscription_id)
        if subscription is None:
            raise NotFound("No such subscription.")
        return subscription

    @extend_schema(
        operation_id="subscriptions_list",
        summary="Subscriptions (superusers)",
        parameters=PAGE_PARAMS,
        responses={200: s.SubscriptionPageSerializer, 400: PROBLEM, 403: PROBLEM},
    )
    def list(self, request: Request) -> Response:
        paging.check_known_params(request, {"page_size", "page_token"})
        page = paging.keyset_page(
            request,
            scope="subscriptions",
            field="i",
            field_type=str,
            fetch=lambda after_id, limit: subs.subscription_list(after_id=after_id)[:limit],
            position_of=lambda row: str(row.id),
        )
        results = [s.subscription_repr(row) for row in page.results]
        return Response({"results": results, "next_page_token": page.next_page_token})

    @extend_schema(
        operation_id="subscriptions_create",
        summary="Create a subscription (superusers); the secret is shown only in this response",
        request=s.SubscriptionCreateBodySerializer,
        responses={201: s.SubscriptionCreatedSerializer, 403: PROBLEM, 422: PROBLEM},
    )
    @idempotent
    def create(self, request: Request) -> Response:
        body = strict.validated(s.SubscriptionCreateBodySerializer, request.data)
        subscription = subs.subscription_create(actor=actor(request), **body)
        return Response(s.subscription_repr(subscription, secret=True), status=201)

    @extend_schema(
        operation_id="subscriptions_get",
        summary="One subscription (superusers)",
        responses={200: s.SubscriptionSerializer, 403: PROBLEM, 404: PROBLEM},
    )
    def retrieve(self, request: Request, subscription_id: str) -> Response:
        return Response(s.subscription_repr(self.get_object()))

    @extend_schema(
        operation_id="subscriptions_update",
        summary="Change a subscription (superusers); moving the cursor replays or skips",
        request=s.SubscriptionUpdateBodySerializer,
        responses={
            200: s.SubscriptionSerializer,
            400: PROBLEM,
            403: PROBLEM,
            404: PROBLEM,
            422: PROBLEM,
        },
    )
    @idempotent
    def partial_update(self, request: Request, subscription_id: str) -> Response:
        subscription = self.get_object()
        changes = strict.validated(s.SubscriptionUpdateBodySerializer, request.data)
        subscription = subs.subscription_update(subscription_id=subscription.id, changes=changes)
        return Response(s.subscription_repr(subscription))

    @extend_schema(
        operation_id="subscriptions_delete",
        summary="Delete a subscription (superusers)",
        responses={204: None, 403: PROBLEM, 404: PROBLEM},
    )
    @idempotent
    def destroy(self, request: Request, subscription_id: str) -> Response:
        subscription = self.get_object()
        subs.subscription_delete(subscription_id=subscription.id)
        return Response(status=204)

    @extend_schema(
        operation_id="subscriptions_rotate_secret",
        summary="New secret (superusers); the old one also signs for the overlap window",
        request=None,
        responses={200: s.SubscriptionCreatedSerializer, 403: PROBLEM, 404: PROBLEM},
    )
    @action(detail=True, methods=["post"], url_path="rotate-secret", url_name="rotate-secret")
    @idempotent
    def rotate_secret(self, request: Request, subscription_id: str) -> Response:
        subscription = self.get_object()
        _no_body(request)
        subscription = subs.subscription_rotate_secret(
            subscription_id=subscription.id, actor=actor(request)
        )
        return Response(s.subscription_repr(subscription, secret=True))

    @extend_schema(
        operation_id="subscriptions_retry",
        summary="Deliver the parked changeset again (superusers)",
        request=None,
        responses={200: s.SubscriptionSerializer, **_ACTION_PROBLEMS},
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def retry(self, request: Request, subscription_id: str) -> Response:
        subscription = self.get_object()
        _no_body(request)
        subscription = subs.subscription_retry(
            subscription_id=subscription.id, actor=actor(request)
        )
        return Response(s.subscription_repr(subscription))

    @extend_schema(
        operation_id="subscriptions_skip",
        summary="Move the cursor past the parked changeset (superusers)",
        request=None,
        responses={200: s.SubscriptionSerializer, **_ACTION_PROBLEMS},
    )
    @action(detail=True, methods=["post"])
    @idempotent
    def skip(self, request: Request, subscription_id: str) -> Response:
        subscription = self.get_object()
        _no_body(request)
        subscription = subs.subscription_skip(subscription_id=subscription.id, actor=actor(request))
        return Response(s.subscription_repr(subscription))
