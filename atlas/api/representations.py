"""How a changeset and a revision look to a reader, for every API that shows one.

Entity writes, batch, branches and the changeset endpoints all answer with a
changeset, so its representation lives on the ground floor rather than in one
app's API (which the others would then import). ``changeset_repr`` applies the
per-reader rules of API.md: ``op_count_visible`` always; ``op_count``,
``message`` and ``comment`` only for readers of every namespace it touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers

from atlas.api.render import rfc3339
from changesets.models import Changeset, Revision
from changesets.selectors.log import sees_every_namespace
from changesets.selectors.rows import ChangesetBrief, HistoryRow


def op_repr(revision: Revision) -> dict[str, Any]:
    return {
        "namespace": revision.namespace,
        "kind": revision.kind,
        "slug": revision.slug,
        "op": revision.op,
        "before_version": revision.before_version,
        "after_version": revision.after_version,
        "changed": revision.changed,
    }


def changeset_repr(
    changeset: Changeset,
    ops: Iterable[Revision],
    *,
    namespaces: Sequence[str] | None = None,
    op_count_visible: int | None = None,
    **paging: Any,
) -> dict[str, Any]:
    """A changeset as ``namespaces`` (what the caller may read; None = all) sees it.

    ``ops`` are filtered to those namespaces here too, so a write response may
    pass every revision. ``op_count_visible`` defaults to the number of ops
    given after that filter: pass it when ``ops`` is one page of them.
    ``op_count``, ``message``, ``comment``, ``metadata`` and ``context`` are
    absent, not null, for a caller who cannot read every namespace the
    changeset touched, like the comment they sit beside (API.md
    "Limits and visibility"). ``paging`` adds ``ops_truncated`` (lists) or
    ``ops_next_page_token`` (one changeset) at the end.
    """
    sees_all = sees_every_namespace(changeset, namespaces)
    if namespaces is not None and not sees_all:
        readable = set(namespaces)
        ops = [r for r in ops if r.namespace in readable]
    rendered = [op_repr(r) for r in ops]
    body: dict[str, Any] = {
        "id": str(changeset.id),
        "seq": changeset.seq,
        "author": changeset.author_name,
        "at": rfc3339(changeset.at),
    }
    if sees_all:
        body["message"] = changeset.message
        body["comment"] = changeset.comment
        body.update(provenance_repr(changeset))
    body["branch"] = changeset.branch
    body["rpc"] = changeset.rpc
    if sees_all:
        body["op_count"] = changeset.op_count
    if op_count_visible is None:
        op_count_visible = changeset.op_count if sees_all else len(rendered)
    body["op_count_visible"] = op_count_visible
    body["ops"] = rendered
    body.update(paging)
    return body


def provenance_repr(changeset: Changeset) -> dict[str, Any]:
    """``metadata`` (``{}`` when the client sent none) and ``context`` (null on a
    changeset written before provenance was recorded): the same two on every surface."""
    return {"metadata": changeset.metadata or {}, "context": changeset.context}


def revision_repr(
    revision: Revision | HistoryRow, changeset: Changeset | ChangesetBrief | None = None
) -> dict[str, Any]:
    """A revision with its changeset's author, time and rpc: a model instance
    (``changeset`` given or selected with it) or a history page's row."""
    changeset = changeset or revision.changeset
    return {
        "changeset_id": str(changeset.id),
        "seq": revision.seq,
        "author": changeset.author_name,
        "at": rfc3339(changeset.at),
        "rpc": changeset.rpc,
        "branch": revision.branch,
        "namespace": revision.namespace,
        "kind": revision.kind,
        "slug": revision.slug,
        "op": revision.op,
        "before_version": revision.before_version,
        "after_version": revision.after_version,
        "before": revision.before,
        "after": revision.after,
        "changed": revision.changed,
    }


# --- schema descriptions -------------------------------------------------------


CHANGED_HELP = (
    "RFC 6901 pointers of what changed: every top-level member for a create or"
    " delete; for an update the deepest object members whose values differ."
    " Sorted by unescaped segments (docs/history.md)."
)


# An op as ``/batch`` takes it: what a revert, an import or a branch sync writes
# (or, on a dry run, would), in the answers of both apps' APIs.
class InverseOpSerializer(serializers.Serializer):
    op = serializers.ChoiceField(["put", "delete"])
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    content = serializers.JSONField(required=False)


class ChangesetOpSerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    before_version = serializers.IntegerField(allow_null=True)
    after_version = serializers.IntegerField(allow_null=True)
    changed = serializers.ListField(child=serializers.CharField(), help_text=CHANGED_HELP)


class ContextSerializer(serializers.Serializer):
    request_id = serializers.CharField(required=False, help_text="X-Request-ID of the write")
    ip = serializers.CharField(required=False, help_text="Client address (ATLAS_TRUSTED_PROXIES)")
    user_agent = serializers.CharField(required=False, allow_blank=True)
    auth = serializers.ChoiceField(choices=["token", "session", "system", "dev-header", "mcp"])
    token_id = serializers.IntegerField(
        required=False, help_text="The ApiToken's id, never the key"
    )
    client = serializers.CharField(
        required=False, help_text='auth "mcp": the MCP client\'s name (its clientInfo)'
    )


# Adds the ``context`` member to a schema serializer: a class attribute of that name
# would hide ``Serializer.context`` (DRF's serializer context). (A comment: serializer
# docstrings become schema descriptions.)
class WithContextField(serializers.Serializer):
    context_help = "How the write arrived (API.md Provenance; null before it was recorded)"
    context_required = True

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["context"] = ContextSerializer(
            required=self.context_required, allow_null=True, help_text=self.context_help
        )
        return fields


class ChangesetSerializer(WithContextField):
    context_help = (
        "How the write arrived (null before provenance was recorded); absent unless you"
        " can read every namespace it touched"
    )
    context_required = False

    id = serializers.UUIDField()
    seq = serializers.IntegerField()
    author = serializers.CharField()
    at = serializers.DateTimeField()
    message = serializers.CharField(
        required=False, help_text="Absent unless you can read every namespace it touched"
    )
    comment = serializers.CharField(
        allow_blank=True,
        required=False,
        help_text="Absent unless you can read every namespace it touched",
    )
    metadata = serializers.JSONField(
        required=False,
        help_text="The client's metadata ({} if none); absent unless you can read every"
        " namespace it touched",
    )
    branch = serializers.CharField(allow_blank=True, help_text='"" is baseline')
    rpc = serializers.CharField()
    op_count = serializers.IntegerField(
        required=False,
        help_text="All ops; absent unless you can read every namespace it touched",
    )
    op_count_visible = serializers.IntegerField(help_text="Ops in namespaces you can read")
    ops = ChangesetOpSerializer(many=True, help_text="Only ops in namespaces you can read")


class ChangesetListItemSerializer(ChangesetSerializer):
    ops = ChangesetOpSerializer(
        many=True, help_text="The first 100 ops in namespaces you can read, in op order"
    )
    ops_truncated = serializers.BooleanField(help_text="True when ops were cut at 100")


class ChangesetDetailSerializer(ChangesetSerializer):
    ops = ChangesetOpSerializer(
        many=True, help_text="One page (page_size, default 100) of the ops you can read"
    )
    ops_next_page_token = serializers.CharField(
        allow_null=True, help_text="page_token for the next page of ops; null when complete"
    )


class RevisionSerializer(serializers.Serializer):
    changeset_id = serializers.UUIDField()
    seq = serializers.IntegerField()
    author = serializers.CharField()
    at = serializers.DateTimeField()
    rpc = serializers.CharField()
    branch = serializers.CharField(allow_blank=True)
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    op = serializers.ChoiceField(choices=["create", "update", "delete"])
    before_version = serializers.IntegerField(allow_null=True)
    after_version = serializers.IntegerField(allow_null=True)
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    changed = serializers.ListField(child=serializers.CharField(), help_text=CHANGED_HELP)


class ArchivedBeforeSerializer(serializers.Serializer):
    """Where a listing ends after an archive cut (API.md "Archive and retention")."""

    seq = serializers.IntegerField(help_text="the last archived seq: the cut")
    checkpoint = serializers.CharField(help_text="the chain hash the cut's checkpoint signs")


ARCHIVED_HELP = "Present on the last page after an archive cut: older entries are archived."


# A page is one object, also where a viewset's ``list`` answers it (many=False keeps
# drf-spectacular from describing it as an array of pages).
@extend_schema_serializer(many=False)
class ChangesetPageSerializer(serializers.Serializer):
    results = ChangesetListItemSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)
    archived_before = ArchivedBeforeSerializer(required=False, help_text=ARCHIVED_HELP)


class RevisionPageSerializer(serializers.Serializer):
    results = RevisionSerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)
    archived_before = ArchivedBeforeSerializer(required=False, help_text=ARCHIVED_HELP)
