"""Atlas's HTTP API as one urlconf, for a host project to include under a prefix of its own.

``path("atlas/", include("atlas.api_urls"))`` serves ``atlas/api/v1/...`` (API.md),
its OpenAPI schema at ``atlas/api/schema/`` and Swagger UI at ``atlas/api/docs/``.
The admin pages register with Django's default admin site, so they appear
under the host's own admin. ``atlas.urls`` is Atlas's own project's root
urlconf: this, plus the admin, the probes and the error handlers.
"""

from django.urls import URLPattern, URLResolver, include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from atlas.api.errors import unknown_api_path

api_v1: list[URLPattern | URLResolver] = [
    path("", include("entities.api.urls")),
    path("", include("changesets.api.urls")),
    path("", include("changesets.api.feed_urls")),
    path("", include("branches.api.urls")),
    # Last: whatever nothing above matched is a problem+json 404, DEBUG on or off.
    re_path(r"^.*$", unknown_api_path),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves its start-up script as a file (?script), so the page has no
    # inline script and runs under the Content-Security-Policy (script-src 'self').
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="docs"),
    # Beside api/v1/ too (/api/nope, /api/v2/...): a client's wrong prefix or version
    # gets problem+json, not Django's HTML page when DEBUG is on. api/schema and
    # api/docs without their slash are left unmatched, so APPEND_SLASH redirects them.
    re_path(r"^api/(?!(?:schema|docs)$).*$", unknown_api_path),
]
