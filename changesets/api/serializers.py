"""What the changeset actions answer, and their inputs.

The changeset and revision representations themselves are shared by every
API that shows a changeset (:mod:`atlas.api.representations`). Inputs (a
revert body, the import's query) are :mod:`atlas.api.strict` serializers: the
one description that both validates and documents them.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.fields import empty

from atlas.api import strict
from atlas.api.inputs import (
    comment_field,
    kind_field,
    metadata_field,
    namespace_field,
    slug_field,
)
from atlas.api.representations import ChangesetSerializer
from atlas.exceptions import ValidationFailed
from changesets.merge3 import GRANULARITIES
from entities.store import EntityKey


class InverseOpSerializer(serializers.Serializer):
    op = serializers.ChoiceField(["put", "delete"])
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    content = serializers.JSONField(required=False)


# What revert and import answer: the changeset written (null on a dry run or when
# nothing changes), its ops as batch ops, and whether it was a dry run.
class ChangesetActionResponseSerializer(serializers.Serializer):
    changeset = ChangesetSerializer(allow_null=True)
    ops = InverseOpSerializer(many=True)
    dry_run = serializers.BooleanField()


# --- inputs --------------------------------------------------------------------


# An entity ref in a body: ``{"namespace", "kind", "slug"}``, closed.
class RefBody(strict.Body):
    first = ()
    namespace = namespace_field()
    kind = kind_field()
    slug = slug_field()


class ObjectListField(serializers.ListField):
    """A JSON array of closed objects, each checked by ``child`` (a :class:`strict.Body`),
    every error at its pointer inside the list (``/only/2/slug``)."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            return super().run_validation(data)
        if not isinstance(data, list):
            raise strict.FieldProblem([("", "Must be a list.")])
        items: list[tuple[str, str]] = []
        values: list[dict[str, Any]] = []
        for i, item in enumerate(data):
            if not isinstance(item, dict):
                items.append((f"/{i}", "Expected an object."))
                continue
            try:
                values.append(self.child.to_internal_value(item))
            except ValidationFailed as exc:
                errors = exc.errors or [{"pointer": "", "detail": exc.detail}]
                items += [(f"/{i}{e['pointer']}", e["detail"]) for e in errors]
        if items:
            raise strict.FieldProblem(items)
        return values


def ref_key(ref: dict[str, Any]) -> EntityKey:
    return EntityKey(ref["namespace"], ref["kind"], ref["slug"])


def granularity_field(default: str, help_text: str) -> serializers.Field:
    return strict.StrictChoiceField(
        list(GRANULARITIES), required=False, default=default, help_text=help_text
    )


# ``POST /changesets/{id}/revert``; no body at all reads as ``{}``.
class RevertBodySerializer(strict.Body):
    first = ()  # errors in declaration order, as this endpoint always answered
    dry_run = strict.StrictBooleanField(required=False, default=False)
    comment = comment_field()
    metadata = metadata_field()
    granularity = granularity_field(
        "entity",
        "entity: undo whole entities, refused when one moved on; key: undo only the"
        " pointers the changeset changed, keeping later edits to other pointers",
    )
    only = ObjectListField(
        child=RefBody(),
        required=False,
        help_text="Revert just these of the changeset's entities",
    )


class ImportQuerySerializer(strict.Query):
    dry_run = strict.QueryBooleanField(required=False, help_text="Check, write nothing.")

    def refuse(self, errors: list[dict[str, str]]) -> None:
        # As this endpoint always answered: the parameter named in the detail.
        strict.refuse_naming("dry_run", errors)
