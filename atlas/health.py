"""Liveness, readiness and metrics endpoints (outside /api/v1, no auth)."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

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
                max_retries=1, interval_start=0, interval_step=0, interval_max=0, timeout=timeout
            )
        return "ok"
    except Exception as exc:  # noqa: BLE001 - any failure means "unreachable"
        return f"error: {type(exc).__name__}"


def readyz(request: HttpRequest) -> JsonResponse:
    """Ready when PostgreSQL answers; 503 otherwise so a balancer stops routing here.

    The broker is reported too, but does not make the process unready: writes
    commit without it (their journal entries wait for the sweep), so taking
    the web tier out of the balancer would turn a delay into an outage. Its
    status shows as ``"degraded"``.
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
    if checks["database"] != "ok":
        status, code = "unavailable", 503
    elif checks["broker"] != "ok":
        status, code = "degraded", 200
    else:
        status, code = "ok", 200
    return JsonResponse({"status": status, "checks": checks}, status=code)


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text: database-derived totals plus this process's (or all processes') own."""
    from changesets.metrics import scrape_registry

    return HttpResponse(generate_latest(scrape_registry()), content_type=CONTENT_TYPE_LATEST)
