"""The query of ``GET /changesets``: one serializer that validates and documents it."""

from __future__ import annotations

import hashlib
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty
from rest_framework.request import Request

from atlas.api import strict
from atlas.api.inputs import namespace_field
from atlas.api.render import parse_rfc3339
from atlas.exceptions import ValidationFailed
from changesets.models import Rpc

MSG_NUL = "May not contain U+0000."
MSG_TIMESTAMP = "Must be an RFC 3339 timestamp with offset."
RPCS = [r.value for r in Rpc]

# Fields below are plain ``Field``s with their schema given: drf-spectacular reads a
# field's ``allow_blank`` (``CharField``, ``ChoiceField``) into ``minLength: 1`` or a
# ``oneOf`` with the empty string, neither of which a query value needs (empty is
# absent, or for ``branch`` a value its pattern already admits).


@extend_schema_field({"type": "string", "pattern": strict.NO_NUL})
class NoNulField(serializers.Field):
    """Any text without U+0000. ``keeps_empty``: an empty value is a value (else absent)."""

    default_error_messages = {"invalid": MSG_NUL}

    def __init__(self, *, keeps_empty: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.keeps_empty = keeps_empty

    def run_validation(self, data: Any = empty) -> str:
        if not isinstance(data, str) or "\x00" in data:
            self.fail("invalid")
        return data


class TimestampField(serializers.DateTimeField):
    """RFC 3339 with an offset, parsed as everywhere in Atlas (``parse_rfc3339``)."""

    default_error_messages = {"invalid": MSG_TIMESTAMP}

    def run_validation(self, data: Any = empty) -> Any:
        value = parse_rfc3339(data) if isinstance(data, str) else None
        if value is None:
            self.fail("invalid")
        return value


# Filters of the changeset list. An empty value is no filter, except ``branch``,
# where empty means baseline (absent: every branch the caller can see). Fields
# are in the order their errors are reported.
class ChangesetFilter(strict.Query):
    NAMES = ("branch", "namespace", "author", "rpc", "since", "until")

    namespace = namespace_field(required=False)
    rpc = strict.QueryChoiceField(RPCS, required=False)
    author = NoNulField(required=False)
    branch = NoNulField(
        keeps_empty=True,
        required=False,
        help_text="Absent = all visible; present = that branch; empty = baseline.",
    )
    since = TimestampField(required=False, help_text="at >= since")
    until = TimestampField(required=False, help_text="at <= until (its whole millisecond)")

    def refuse(self, errors: list[dict[str, str]]) -> None:
        # As this listing always answered: the first error's detail, however many.
        first = errors[0]
        raise ValidationFailed(first["detail"], pointer=first["pointer"], errors=errors)


def filter_digest(request: Request) -> str:
    """Binds a page token to the filters it was issued for (the raw values, as sent)."""
    params = request.query_params
    raw = repr([params.get(f) for f in ChangesetFilter.NAMES])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]
