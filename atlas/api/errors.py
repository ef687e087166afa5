"""Render every error, Atlas's and DRF's, as RFC 9457 problem+json.

A small handler rather than a library: the contract's fields (``pointer``,
``errors`` as ``{pointer, detail}``, ``conflicts``) are Atlas's own, and the
problem-details packages for DRF emit other shapes.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.response import Response

from atlas import exceptions as atlas

logger = logging.getLogger(__name__)
PROBLEM_JSON = "application/problem+json"
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"  # SQLSTATE idle_in_transaction_session_timeout

_DRF_MAP: list[tuple[type[drf.APIException], type[atlas.AtlasError]]] = [
    (drf.NotAuthenticated, atlas.NotAuthenticated),
    (drf.AuthenticationFailed, atlas.NotAuthenticated),
    (drf.PermissionDenied, atlas.PermissionDenied),
    (drf.NotFound, atlas.NotFound),
    (drf.ParseError, atlas.BadRequest),
]


def flatten_errors(errors: Any, prefix: str = "") -> list[dict[str, str]]:
    """Turn DRF's nested ``serializer.errors`` into ``[{pointer, detail}]`` (RFC 6901)."""
    out: list[dict[str, str]] = []
    if isinstance(errors, dict):
        for field, value in errors.items():
            name = (
                ""
                if field in ("non_field_errors", "__all__")
                else "/" + str(field).replace("~", "~0").replace("/", "~1")
            )
            out.extend(flatten_errors(value, prefix + name))
    elif isinstance(errors, list):
        if all(not isinstance(e, dict | list) for e in errors):
            out.extend({"pointer": prefix or "/", "detail": str(e)} for e in errors)
        else:
            for index, value in enumerate(errors):
                if value:
                    out.extend(flatten_errors(value, f"{prefix}/{index}"))
    else:
        out.append({"pointer": prefix or "/", "detail": str(errors)})
    return out


def problem_for(exc: Exception) -> atlas.AtlasError | None:
    """Translate an exception into an Atlas error, or None for an unexpected one."""
    if isinstance(exc, atlas.AtlasError):
        return exc
    if isinstance(exc, drf.ValidationError):
        errors = flatten_errors(exc.detail)
        detail = errors[0]["detail"] if len(errors) == 1 else f"{len(errors)} invalid values."
        return atlas.ValidationFailed(
            detail, errors=errors, pointer=errors[0]["pointer"] if errors else None
        )
    for drf_class, atlas_class in _DRF_MAP:
        if isinstance(exc, drf_class):
            return atlas_class(str(exc.detail))
    if isinstance(exc, drf.APIException):
        error = atlas.AtlasError(str(exc.detail))
        error.status = exc.status_code
        error.type = str(exc.default_code).replace("_", "-")
        # default_detail may be a template ('Method "{method}" not allowed.'): use the code.
        error.title = str(exc.default_code).replace("_", " ").capitalize()
        return error
    if isinstance(exc, Http404):
        return atlas.NotFound("Not found.")
    if isinstance(exc, DjangoPermissionDenied):
        return atlas.PermissionDenied()
    if isinstance(exc, OperationalError | InterfaceError):
        logger.warning("database unavailable: %s", exc)
        return atlas.ServiceUnavailable("The database is unavailable; retry shortly.")
    if getattr(exc.__cause__, "sqlstate", None) == IDLE_IN_TRANSACTION_TIMEOUT:
        # PostgreSQL ended a transaction that idled past idle_in_transaction_session_timeout
        # (a stalled process); it rolled back, so a retry is safe. psycopg calls it InternalError.
        logger.warning("transaction ended by the server: %s", exc)
        return atlas.ServiceUnavailable("The transaction stalled and was rolled back; retry.")
    return None


def problem_response(error: atlas.AtlasError, instance: str | None = None) -> Response:
    body = error.as_problem()
    if instance:
        body["instance"] = instance
    response = Response(body, status=error.status, content_type=PROBLEM_JSON)
    if error.status == 401:
        response["WWW-Authenticate"] = "Token"
    if error.status == 503:
        response["Retry-After"] = "5"
    return response


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every error leaves as problem+json, 500 included."""
    request = context.get("request")
    instance = request.get_full_path() if request is not None else None
    error = problem_for(exc)
    if error is None:
        if isinstance(exc, DatabaseError):
            logger.exception("database error")
        else:
            logger.exception("unhandled error")
        error = atlas.AtlasError("An unexpected error occurred; it has been logged.")
        error.status, error.type, error.title = 500, "internal-error", "Internal server error"
    return problem_response(error, instance)


def _plain_problem(request: HttpRequest, error: atlas.AtlasError) -> JsonResponse:
    body = error.as_problem()
    body["instance"] = request.get_full_path()
    return JsonResponse(body, status=error.status, content_type=PROBLEM_JSON)


# --- the OpenAPI description of errors -------------------------------------------------

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details (API.md Conventions, Errors).",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "pointer": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"pointer": {"type": "string"}, "detail": {"type": "string"}},
                "required": ["pointer", "detail"],
            },
        },
        "conflicts": {"type": "array", "items": {"type": "object"}},
    },
    "required": ["type", "title", "status", "detail", "instance"],
}
# What the shared plumbing can answer on any operation, whatever its view does:
# authentication (401), an unreachable database (503); bodies and Idempotency-Key
# (malformed JSON 400, a key still running 409, body over the limit 413, another
# Content-Type 415, invalid values or a reused key 422); query strings (a bad page
# token 400, unknown or invalid parameters 422).
_COMMON_ERRORS = {"401", "503"}
_WRITE_ERRORS = {"400", "409", "413", "415", "422"}
_READ_ERRORS = {"400", "422"}
_WRITE_METHODS = {"post", "put", "patch", "delete"}
_STATUS_TEXT = {
    "400": "Malformed request",
    "401": "Not authenticated",
    "403": "Permission denied",
    "404": "Not found",
    "409": "Conflict",
    "412": "Precondition failed",
    "413": "Payload too large",
    "415": "Unsupported media type",
    "422": "Invalid input",
    "503": "Service unavailable",
}


def problem_schema_hook(result: dict[str, Any], generator: Any, **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing: every error response is ``application/problem+json``.

    Views list their own error statuses; this hook adds the ones every
    operation shares and describes each 4xx/5xx with the ``Problem`` schema
    and the media type Atlas really sends.
    """
    result.setdefault("components", {}).setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    ref = {"$ref": "#/components/schemas/Problem"}
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in item.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            extra = _COMMON_ERRORS | (_WRITE_ERRORS if method in _WRITE_METHODS else _READ_ERRORS)
            for code in extra:
                responses.setdefault(code, {})
            for code, response in responses.items():
                if str(code)[:1] in ("4", "5"):
                    response["content"] = {PROBLEM_JSON: {"schema": ref}}
                    if not response.get("description"):
                        response["description"] = _STATUS_TEXT.get(str(code), "Error")
            operation["responses"] = dict(sorted(responses.items()))
    return result


# Printable characters that survive an HTTP header (Latin-1), as ``str.isprintable`` counts them.
IDEMPOTENCY_KEY_PATTERN = r"^[ -~\u00a1-\u00ac\u00ae-\u00ff]{1,255}$"


def input_rules_schema_hook(
    result: dict[str, Any], generator: Any, **kwargs: Any
) -> dict[str, Any]:
    """drf-spectacular postprocessing: the input rules every view shares.

    Request bodies refuse unknown fields (422), so their objects are closed;
    an array query parameter is repeated; an empty optional query parameter
    counts as absent; ``page_size`` and ``limit`` below 1 are 422;
    ``Idempotency-Key`` is 1-255 printable characters (``atlas.api.idempotency``).
    """
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                if parameter["in"] == "query" and schema.get("type") == "array":
                    # Repeated (``?namespace=a&namespace=b``): OpenAPI's default, said aloud.
                    parameter.setdefault("explode", True)
                    parameter.setdefault("style", "form")
                if parameter["in"] == "query" and not parameter.get("required"):
                    # Every view reads an empty query parameter as an absent one.
                    parameter["allowEmptyValue"] = True
                if parameter["in"] == "query" and parameter["name"] in ("page_size", "limit"):
                    schema["minimum"] = 1
                if parameter["in"] == "header" and parameter["name"] == "Idempotency-Key":
                    schema.update(minLength=1, maxLength=255, pattern=IDEMPOTENCY_KEY_PATTERN)
    return result


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Problem+json under /api/; Django's own page for the admin and the rest."""
    if not request.path.startswith("/api/"):
        return defaults.page_not_found(request, exception or Http404())
    return unknown_api_path(request)


@csrf_exempt
def unknown_api_path(request: HttpRequest) -> JsonResponse:
    """The last route under ``api/v1/`` and under ``api/``: any path nothing else matched,
    any method.

    ``handler404`` alone is not enough: with ``DEBUG`` on (``make run``) Django
    answers an unresolved URL with its HTML debug page and never calls it, and a
    host project that includes ``atlas.api_urls`` has a ``handler404`` of its
    own. A route that always matches answers problem+json in every setup. (No
    API route ends in a slash, so it costs no ``APPEND_SLASH`` redirect.)
    """
    return _plain_problem(request, atlas.NotFound("No such resource."))


def handler500(request: HttpRequest) -> JsonResponse:
    error = atlas.AtlasError("An unexpected error occurred; it has been logged.")
    error.status, error.type, error.title = 500, "internal-error", "Internal server error"
    return _plain_problem(request, error)


def handler400(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _plain_problem(request, atlas.BadRequest("Bad request."))


def handler403(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return _plain_problem(request, atlas.PermissionDenied())
