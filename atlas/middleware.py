"""Middleware: compression that keeps entity ETags strong, the CSP header, request ids.

Compression:

Django's ``GZipMiddleware`` turns every strong ``ETag`` into a weak one
(``"3"`` → ``W/"3"``) when it compresses, because RFC 9110 ties a strong
validator to the exact bytes sent. Atlas's ETag is not a digest of bytes: it
is the entity's ``version`` (API.md: ``ETag`` is ``"<version>"``), the
validator clients send back in ``If-Match`` to make a write conditional, and
it names the same entity state whether the body travels compressed or not.
So this subclass compresses exactly as Django's does (same size threshold,
``Vary: Accept-Encoding``, the same BREACH padding) and then puts back the
strong tag the view set. Atlas serves no range requests, the one place where
a coding-specific strong validator would matter. See docs/reliability.md
("Strong ETags survive compression").
"""

from __future__ import annotations

from typing import Any

from django.middleware.gzip import GZipMiddleware as DjangoGZipMiddleware

from atlas import conf
from atlas.api.provenance import HEADER as REQUEST_ID_HEADER
from atlas.api.provenance import request_id_from


class GZipMiddleware(DjangoGZipMiddleware):
    def process_response(self, request: Any, response: Any) -> Any:
        etag = response.get("ETag")
        response = super().process_response(request, response)
        if etag and etag.startswith('"') and response.get("ETag") == "W/" + etag:
            response.headers["ETag"] = etag
        return response


class ContentSecurityPolicyMiddleware:
    """Put ``ATLAS_CONTENT_SECURITY_POLICY`` on every HTML response (the admin, /api/docs/).

    Django 5.2 has no CSP support of its own (it arrives in 6.0), and one
    header on HTML pages is all Atlas needs, so a few lines rather than
    django-csp. JSON, NDJSON and the Prometheus text are not documents a
    browser runs, so they go without. A view that sets its own policy keeps it.
    """

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        policy = conf.get("ATLAS_CONTENT_SECURITY_POLICY")
        content_type = response.get("Content-Type", "")
        if policy and content_type.startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", policy)
        return response


class RequestIdMiddleware:
    """Give every request an id and echo it in the response's ``X-Request-ID``.

    A well-formed ``X-Request-ID`` from the client is kept (1–200 characters of
    ``[A-Za-z0-9._:-]``), anything else replaced by a generated one
    (``atlas.api.provenance.request_id_from``), so a client can find its write's
    changeset by the id it chose, and a forged header cannot put arbitrary text
    into the log. The write's ``context`` records the same id. First in the
    stack, so even a redirect or a refused request answers with it.
    """

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        request.atlas_request_id = request_id_from(request.META.get("HTTP_X_REQUEST_ID"))
        response = self.get_response(request)
        response.headers[REQUEST_ID_HEADER] = request.atlas_request_id
        return response
