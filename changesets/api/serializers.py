"""What the changeset actions answer, and their inputs.

The changeset and revision representations themselves are shared by every
API that shows a changeset (:mod:`atlas.api.representations`). Inputs (a
revert body, the import's query) are :mod:`atlas.api.strict` serializers: the
one description that both validates and documents them.
"""

from __future__ import annotations

from rest_framework import serializers

from atlas.api import strict
from atlas.api.inputs import (
    ObjectListField,
    comment_field,
    granularity_field,
    kind_field,
    metadata_field,
    namespace_field,
    slug_field,
)
from atlas.api.representations import ChangesetSerializer, InverseOpSerializer


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
