"""Key-level history over HTTP: the query serializers (each validates and
describes its query: ``extend_schema(parameters=[...])``) and the shapes the
answers share.

Shared by the entity actions (``entities.api.history``: history, blame, diff)
and the namespace-wide reads (``changesets.api.history``: ``/revisions``,
``/diff``), so it lives on the ground floor: no app's API imports another's.
"""

from __future__ import annotations

import uuid
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

from atlas.api import strict
from atlas.api.inputs import PrefixField, kind_field, namespace_field
from atlas.api.render import parse_rfc3339, rfc3339
from atlas.exceptions import ValidationFailed
from changesets import pointers
from changesets.models import Changeset
from changesets.selectors.diff import Points

MSG_UUID = "Not a changeset id (UUID)."
MSG_TIMESTAMP = "Not an RFC 3339 timestamp with offset."


@extend_schema_field(
    {
        "type": "string",
        "maxLength": pointers.MAX_POINTER_LENGTH,
        "pattern": pointers.POINTER_PATTERN,
        "example": "/address/city",
    }
)
class PointerField(serializers.Field):
    """An RFC 6901 JSON pointer into ``content``."""

    default_error_messages = {"invalid": pointers.MSG_POINTER}

    def run_validation(self, data: Any = empty) -> str:
        if not isinstance(data, str) or not pointers.is_pointer(data):
            self.fail("invalid")
        return data


@extend_schema_field({"type": "string", "format": "uuid"})
class ChangesetIdField(serializers.Field):
    default_error_messages = {"invalid": MSG_UUID}

    def run_validation(self, data: Any = empty) -> str:
        try:
            return str(uuid.UUID(str(data)))
        except ValueError:
            self.fail("invalid")
        raise AssertionError("unreachable")  # pragma: no cover


@extend_schema_field({"type": "string", "format": "date-time"})
class InstantField(serializers.Field):
    """RFC 3339 with an offset, parsed as everywhere in Atlas (``parse_rfc3339``)."""

    default_error_messages = {"invalid": MSG_TIMESTAMP}

    def run_validation(self, data: Any = empty) -> Any:
        value = parse_rfc3339(data) if isinstance(data, str) else None
        if value is None:
            self.fail("invalid")
        return value


# A query whose ``required`` fields must be present (and not empty): each missing
# one is a 422 at its pointer, reported before the values of the others.
class RequiredQuery(strict.Query):
    def to_internal_value(self, data: Any) -> dict[str, Any]:
        missing = [
            {"pointer": f"/{name}", "detail": strict.MSG_REQUIRED}
            for name, field in self.fields.items()
            if field.required and not data.get(name)
        ]
        strict.raise_errors(missing)
        return super().to_internal_value(data)


# ``key``: only revisions whose changed pointers equal it, lie inside it, or contain it.
class HistoryQuery(strict.Query):
    key = PointerField(
        required=False,
        help_text="Only revisions where a changed pointer equals, lies inside or contains it.",
    )


def _point(name: str, what: str) -> dict[str, serializers.Field]:
    return {
        name: ChangesetIdField(
            required=False, help_text=f"{what}: the baseline right after this changeset."
        ),
        f"{name}_time": InstantField(
            required=False,
            help_text=f"{what}: the baseline at the newest changeset at or before this time.",
        ),
    }


# Two points of the baseline's history. ``from`` or ``from_time`` is required;
# ``to`` absent is now (on a branch with the branch header: the branch as it reads now).
class DiffPointsQuery(strict.Query):
    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields.update(_point("from", "Compare from"))
        fields.update(_point("to", "Compare to (absent: now)"))
        return fields

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        values = super().to_internal_value(data)
        if "from" not in values and "from_time" not in values:
            raise ValidationFailed(
                "Give from or from_time.",
                pointer="/from",
                errors=[{"pointer": "/from", "detail": strict.MSG_REQUIRED}],
            )
        for name in ("from", "to"):
            if name in values and f"{name}_time" in values:
                raise ValidationFailed(
                    f"Give {name} or {name}_time, not both.",
                    pointer=f"/{name}_time",
                    errors=[{"pointer": f"/{name}_time", "detail": f"Conflicts with {name}."}],
                )
        return values


# ``GET /diff``: the points, and which entities (namespace required).
class NamespaceDiffQuery(DiffPointsQuery):
    def get_fields(self) -> dict[str, serializers.Field]:
        fields: dict[str, serializers.Field] = {
            "namespace": namespace_field(required=True),
            "kind": kind_field(required=False),
            "slug_prefix": PrefixField(),
        }
        fields.update(super().get_fields())
        return fields

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not data.get("namespace"):
            strict.raise_errors([{"pointer": "/namespace", "detail": strict.MSG_REQUIRED}])
        return super().to_internal_value(data)


# --- answers ------------------------------------------------------------------------------

PATCH_HELP = "RFC 6902 operations; applied to before they give after."


class AsOfSerializer(serializers.Serializer):
    changeset_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    at = serializers.DateTimeField()


def as_of_repr(changeset: Changeset) -> dict[str, Any]:
    """A point of the log as answers show it (``as_of``, a diff's ``from`` and ``to``)."""
    return {"changeset_id": str(changeset.id), "seq": changeset.seq, "at": rfc3339(changeset.at)}


def points_repr(points: Points) -> dict[str, Any]:
    """A diff's ``from`` and ``to`` (``to`` null: a branch as it reads now)."""
    return {
        "from": as_of_repr(points.start),
        "to": as_of_repr(points.end) if points.end is not None else None,
    }
