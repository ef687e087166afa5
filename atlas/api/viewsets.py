"""The base every Atlas viewset derives from."""

from __future__ import annotations

from typing import Any

from rest_framework.metadata import SimpleMetadata
from rest_framework.request import Request
from rest_framework.viewsets import GenericViewSet


class NoFormMetadata(SimpleMetadata):
    """``OPTIONS`` answers name, description, renders and parses, as for a plain view.

    DRF would also describe a form from ``get_serializer()``; Atlas viewsets
    have no ``serializer_class`` (each action names its own input and output
    serializers), so that probe would fail with a 500.
    """

    def determine_actions(self, request: Request, view: Any) -> dict[str, Any]:
        return {}


class ViewSet(GenericViewSet):
    metadata_class = NoFormMetadata
