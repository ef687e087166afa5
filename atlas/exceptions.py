"""The one error hierarchy. Services raise these; ``atlas.api`` renders them as
RFC 9457 problem+json. Services never raise DRF exceptions, so the same rules
hold for management commands, tasks and the admin.
"""

from __future__ import annotations

from typing import Any

PROBLEM_BASE = "https://atlas.dev/problems/"


class AtlasError(Exception):
    status: int = 400
    type: str = "bad-request"
    title: str = "Bad request"

    def __init__(
        self,
        detail: str = "",
        *,
        pointer: str | None = None,
        errors: list[dict[str, str]] | None = None,
        conflicts: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(detail or self.title)
        self.detail = detail or self.title
        self.pointer = pointer
        self.errors = errors
        self.conflicts = conflicts

    def as_problem(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": PROBLEM_BASE + self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.pointer is not None:
            body["pointer"] = self.pointer
        if self.errors is not None:
            body["errors"] = self.errors
        if self.conflicts is not None:
            body["conflicts"] = self.conflicts
        return body


class BadRequest(AtlasError):
    status, type, title = 400, "bad-request", "Bad request"


class NotAuthenticated(AtlasError):
    status, type, title = 401, "not-authenticated", "Authentication required"


class PermissionDenied(AtlasError):
    status, type, title = 403, "forbidden", "Permission denied"


class NotFound(AtlasError):
    status, type, title = 404, "not-found", "Not found"


class Conflict(AtlasError):
    status, type, title = 409, "conflict", "Conflict"


class Gone(AtlasError):
    status, type, title = 410, "gone", "Gone"


class PreconditionFailed(AtlasError):
    status, type, title = 412, "precondition-failed", "Precondition failed"


class PayloadTooLarge(AtlasError):
    status, type, title = 413, "payload-too-large", "Payload too large"


class ValidationFailed(AtlasError):
    status, type, title = 422, "validation-failed", "Invalid input"


class ServiceUnavailable(AtlasError):
    status, type, title = 503, "service-unavailable", "Service unavailable"


class UnsupportedMediaType(AtlasError):
    status, type, title = 415, "unsupported-media-type", "Unsupported media type"
