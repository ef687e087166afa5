from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from atlas import health
from atlas.api import errors
from atlas.mcp.http import mcp_endpoint

api_v1 = [
    path("", include("entities.api.urls")),
    path("", include("changesets.api.urls")),
    path("", include("changesets.api.feed_urls")),
    path("", include("branches.api.urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file (?script), so the page has no
    # inline script and runs under the Content-Security-Policy (script-src 'self').
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
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
