"""Atlas's own project's root urlconf. A host project includes ``atlas.api_urls`` instead."""

from django.contrib import admin
from django.urls import include, path

from atlas import health
from atlas.api import errors
from atlas.mcp.http import mcp_endpoint

urlpatterns = [
    path("", include("atlas.api_urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    # The MCP server's streamable HTTP transport (atlas/mcp/http.py, docs/mcp.md).
    path("mcp", mcp_endpoint, name="mcp"),
    path("admin/", admin.site.urls),
]

handler400 = errors.handler400
handler403 = errors.handler403
handler404 = errors.handler404
handler500 = errors.handler500
