"""The one router every app's API registers its viewsets on.

DRF's ``SimpleRouter`` with Django path converters (``<str:name>``, so dotted
names such as ``acme.orders`` match, which the default regex ``[^/.]+`` would
refuse) and no trailing slash (API.md's paths have none). A viewset may name
several lookup fields (``lookup_fields = ("namespace", "kind", "slug")``),
which become consecutive path segments.
"""

from __future__ import annotations

from typing import Any

from rest_framework.routers import SimpleRouter


class Router(SimpleRouter):
    def __init__(self) -> None:
        super().__init__(trailing_slash=False, use_regex_path=False)

    def get_lookup_regex(self, viewset: Any, lookup_prefix: str = "") -> str:
        fields = getattr(viewset, "lookup_fields", None)
        if not fields:
            return super().get_lookup_regex(viewset, lookup_prefix)
        return "/".join(f"<str:{lookup_prefix}{name}>" for name in fields)
