"""Small rendering helpers shared by the apps' APIs."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(value: datetime | None) -> str | None:
    """RFC 3339 UTC with milliseconds, as API.md fixes for every timestamp."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
