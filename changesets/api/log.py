"""``GET /log/head`` and ``GET /log/checkpoints``: the log as a whole, to anchor it elsewhere.

The head names the newest seq and chain hash; the checkpoints are the archive's
signed cuts with the key that signs them (API.md "Archive and retention";
``docs/retention.md`` says how to check one without Atlas).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from atlas.api import paging
from atlas.api.openapi import PAGE_PARAMS, PROBLEM
from atlas.api.render import rfc3339
from changesets.archive.checkpoint import published
from changesets.archive.selectors import newest_public_key, signed_cuts
from changesets.archive.storage import public_key
from changesets.chain import GENESIS
from changesets.selectors.log import log_head

CheckpointPageSerializer = inline_serializer(
    "CheckpointPage",
    {
        "public_key": serializers.CharField(
            allow_null=True, help_text="Ed25519, base64 of the 32 raw bytes"
        ),
        "results": inline_serializer(
            "Checkpoint",
            {
                "seq": serializers.IntegerField(help_text="the cut: the last archived seq"),
                "hash": serializers.CharField(help_text="the chain hash at the cut"),
                "at": serializers.DateTimeField(),
                "segments": inline_serializer(
                    "CheckpointSegment",
                    {
                        "name": serializers.CharField(),
                        "digest": serializers.CharField(help_text="SHA-256 of the file, hex"),
                        "first_seq": serializers.IntegerField(),
                        "last_seq": serializers.IntegerField(),
                    },
                    many=True,
                ),
                "signature": serializers.CharField(
                    help_text="Ed25519 over the canonical JSON of every other member, base64"
                ),
            },
            many=True,
        ),
        "next_page_token": serializers.CharField(allow_null=True),
    },
)


# The log as a whole; ``head`` anchors it elsewhere (``GET /log/head``).
class LogViewSet(viewsets.ViewSet):
    permission_classes = [IsAuthenticated]  # API.md: any authenticated user, nobody else

    @extend_schema(
        operation_id="log_checkpoints",
        summary="The archive's signed checkpoints, oldest first, and the key that signs them",
        parameters=PAGE_PARAMS,
        responses={200: CheckpointPageSerializer, 400: PROBLEM, 422: PROBLEM},
    )
    @action(detail=False, methods=["get"])
    def checkpoints(self, request: Request) -> Response:
        # API.md "Archive and retention"; docs/retention.md says how to check one.
        paging.check_known_params(request, {"page_size", "page_token"})
        page = paging.keyset_page(
            request,
            scope="checkpoints",
            field="s",
            field_type=int,
            fetch=lambda after, limit: signed_cuts(after_seq=after)[:limit],
            position_of=lambda cut: cut.seq,
        )
        return Response(
            {
                "public_key": public_key() or newest_public_key(),
                "results": [published(cut) for cut in page.results],
                "next_page_token": page.next_page_token,
            }
        )

    @extend_schema(
        operation_id="log_head",
        summary="The newest seq and chain hash, to anchor the log elsewhere",
        responses={
            200: inline_serializer(
                "LogHead",
                {
                    "seq": serializers.IntegerField(),
                    "hash": serializers.CharField(),
                    "at": serializers.DateTimeField(allow_null=True),
                },
            )
        },
    )
    @action(detail=False, methods=["get"])
    def head(self, request: Request) -> Response:
        head = log_head()
        return Response(
            {
                "seq": head.seq if head else 0,
                "hash": (head.hash if head else "") or GENESIS,
                "at": rfc3339(head.at) if head else None,
            }
        )
