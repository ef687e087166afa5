"""What the changeset actions answer, and their inputs.

The changeset and revision representations themselves are shared by every
API that shows a changeset (:mod:`atlas.api.representations`). Inputs (a
revert body, the import's query) are :mod:`atlas.api.strict` serializers: the
one description that both validates and documents them.
"""

from __future__ import annotations

from rest_framework import serializers

from atlas.api import strict
from atlas.api.inputs import comment_field, metadata_field
from atlas.api.representations import ChangesetSerializer


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


# ``POST /changesets/{id}/revert``; no body at all reads as ``{}``.
class RevertBodySerializer(strict.Body):
    first = ()  # errors in declaration order, as this endpoint always answered
    dry_run = strict.StrictBooleanField(required=False, default=False)
    comment = comment_field()
    metadata = metadata_field()


class ImportQuerySerializer(strict.Query):
    dry_run = strict.QueryBooleanField(required=False, help_text="Check, write nothing.")

    def refuse(self, errors: list[dict[str, str]]) -> None:
        # As this endpoint always answered: the parameter named in the detail.
        strict.refuse_naming("dry_run", errors)
