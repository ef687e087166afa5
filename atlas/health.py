"""Liveness, readiness and metrics endpoints (outside /api/v1).

``/healthz`` and ``/readyz`` answer anyone (load balancers and orchestrators
probe them). ``/metrics`` answers a superuser (token or session) or a
scraper holding ``ATLAS_METRICS_TOKEN`` as ``Authorization: Bearer``:
anonymous → 401, anyone else → 403 (API.md, "Limits and visibility").
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from drf_spectacular.utils import extend_schema
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from atlas import conf
from changesets.outbox.metrics import journal_lag_seconds, scrape_registry

BROKER_TIMEOUT_SECONDS = 1.0


def healthz(request: HttpRequest) -> JsonResponse:
    """The process is up and serving; says nothing about dependencies."""
    return JsonResponse({"status": "ok"})


def broker_status(timeout: float = BROKER_TIMEOUT_SECONDS) -> str:
    """``"ok"`` when the Celery broker accepts a connection within ``timeout`` seconds."""
    from kombu import Connection

    try:
        with Connection(
            settings.CELERY_BROKER_URL,
            connect_timeout=timeout,
            transport_options=getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {},
        ) as conn:
            conn.ensure_connection(
                max_retries=1,
                interval_start=0,
                interval_step=0,
                interval_max=0,
                timeout=timeout,  # type: ignore[arg-type]  # kombu takes float seconds
            )
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "unreachable"
        return f"error: {type(exc).__name__}"


def journal_status() -> str:
    """``"ok"``, or how far post-commit work lags when its oldest entry is older than
    ``ATLAS_JOURNAL_MAX_LAG_SECONDS`` (the relay or the workers are down or behind)."""
    try:
        lag = journal_lag_seconds()
    except Exception as exc:  # noqa: BLE001 - reported, never raised from a probe
        return f"error: {type(exc).__name__}"
    limit = float(conf.get("ATLAS_JOURNAL_MAX_LAG_SECONDS"))
    if lag > limit:
        return f"lagging: oldest unpublished changeset is {lag:.0f} s old (limit {limit:g} s)"
    return "ok"


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when PostgreSQL answers; 503 otherwise so a balancer stops routing here.

    The broker and the journal's lag are reported too, but do not make the
    process unready: writes commit without them (their journal entries wait
    for the relay or the sweep), so taking the web tier out of the balancer
    would turn a delay into an outage. Either shows as ``"degraded"``.
    """
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        checks["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
        checks["database"] = f"error: {type(exc).__name__}"
    checks["broker"] = broker_status()
    if checks["database"] == "ok":
        checks["journal"] = journal_status()
    if checks["database"] != "ok":
        status, code = "unavailable", 503
    elif checks["broker"] != "ok" or checks["journal"] != "ok":
        status, code = "degraded", 200
    else:
        status, code = "ok", 200
    return JsonResponse({"status": status, "checks": checks}, status=code)


METRICS_SCRAPER = "metrics-scraper"  # request.auth of a request carrying the metrics token
METRICS_CHALLENGE = 'Bearer realm="atlas-metrics"'
MSG_METRICS_TOKEN_INVALID = "Invalid metrics token."


class MetricsBearerAuthentication(BaseAuthentication):
    """``Authorization: Bearer <ATLAS_METRICS_TOKEN>``: the scraper, who is no user.

    Compared in constant time. With the setting empty no bearer token is
    accepted, so only superusers can read the metrics.
    """

    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        auth = get_authorization_header(request).split()
        if not auth or auth[0].lower() != b"bearer":
            return None
        expected = conf.get("ATLAS_METRICS_TOKEN").encode()
        if len(auth) != 2 or not expected or not hmac.compare_digest(auth[1], expected):
            raise AuthenticationFailed(MSG_METRICS_TOKEN_INVALID)
        return AnonymousUser(), METRICS_SCRAPER

    def authenticate_header(self, request: Request) -> str:
        return METRICS_CHALLENGE


class CanReadMetrics(BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return request.auth == METRICS_SCRAPER or bool(request.user.is_superuser)


class FirstRendererNegotiation(BaseContentNegotiation):
    """Prometheus asks for its own media types; the answer is text whatever it asks."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        listed = list(parsers)  # DRF passes the view's list
        return listed[0] if listed else None

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        first = list(renderers)[0]
        return first, first.media_type


class MetricsView(APIView):
    """Prometheus text: database-derived totals plus this process's (or all processes') own."""

    # api_settings resolves the dotted paths to classes; the stubs type them as str.
    authentication_classes = [
        MetricsBearerAuthentication,
        *cast("list[type[BaseAuthentication]]", api_settings.DEFAULT_AUTHENTICATION_CLASSES),
    ]
    permission_classes = [CanReadMetrics]
    content_negotiation_class = FirstRendererNegotiation

    @extend_schema(exclude=True)
    def get(self, request: Request) -> HttpResponse:
        return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)

    def handle_exception(self, exc: Exception) -> Any:
        response = super().handle_exception(exc)
        if response.status_code == 401:  # tell a scraper which scheme to use
            response["WWW-Authenticate"] = METRICS_CHALLENGE
        return response


metrics = MetricsView.as_view()
