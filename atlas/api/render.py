"""Small rendering helpers shared by the apps' APIs."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.utils.dateparse import parse_datetime


def rfc3339(value: datetime | None) -> str | None:
    """RFC 3339 UTC with milliseconds, as API.md fixes for every timestamp."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# RFC 3339 date-time: full date, time with seconds, and a mandatory offset.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})\Z"
)


def parse_rfc3339(raw: str) -> datetime | None:
    """A strict RFC 3339 timestamp, or None (so callers answer 422, never 500).

    ``parse_datetime`` alone accepts other ISO 8601 forms and raises on
    well-formed but impossible values (month 13).
    """
    if not _RFC3339.match(raw):
        return None
    try:
        value = parse_datetime(raw.upper())
        if value is None or value.tzinfo is None:
            return None
        # In UTC: PostgreSQL refuses offsets beyond ±15:59 that RFC 3339 allows.
        return value.astimezone(UTC)
    except (ValueError, OverflowError):
        return None
