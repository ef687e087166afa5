"""Input parsing for entity writes, and the shapes of entity responses.

Batch ops are validated by hand rather than with nested DRF serializers: a
10,000-op batch must parse in milliseconds, and every error needs an exact
RFC 6901 pointer (``/ops/3/content``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema_field
from rest_framework import serializers

from atlas.api.render import rfc3339
from atlas.exceptions import PayloadTooLarge, ValidationFailed
from changesets.ops import DeleteOp, IfMatch, PatchOp, PutOp, WriteOp
from entities import validation as v
from entities.store import EntityKey, StoredEntity

MAX_COMMENT_LENGTH = 10_000


def entity_repr(entity: StoredEntity) -> dict[str, Any]:
    return {
        "namespace": entity.key.namespace,
        "kind": entity.key.kind,
        "slug": entity.key.slug,
        "content": entity.content,
        "version": entity.version,
        "created_at": rfc3339(entity.created_at),
        "updated_at": rfc3339(entity.updated_at),
        "changeset_id": str(entity.changeset_id) if entity.changeset_id else None,
    }


def etag(version: int) -> str:
    return f'"{version}"'


class Errors:
    """Collects ``{pointer, detail}`` pairs and raises them as one 422."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, pointer: str, detail: str) -> None:
        self.items.append({"pointer": pointer, "detail": detail})

    def raise_if_any(self) -> None:
        if self.items:
            first = self.items[0]
            detail = first["detail"] if len(self.items) == 1 else f"{len(self.items)} errors."
            raise ValidationFailed(detail, pointer=first["pointer"], errors=self.items[:100])


def require_object(data: Any, pointer: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValidationFailed(
            "The body must be a JSON object.",
            pointer=pointer or "/",
            errors=[{"pointer": pointer or "/", "detail": "Expected an object."}],
        )
    return data


def check_fields(
    data: dict[str, Any], errors: Errors, prefix: str, *, required: set[str], optional: set[str]
) -> None:
    for name in sorted(set(data) - required - optional):
        errors.add(f"{prefix}/{name}", "Unknown field.")
    for name in sorted(required - set(data)):
        errors.add(f"{prefix}/{name}", "This field is required.")


def check_content(value: Any, errors: Errors, pointer: str) -> None:
    if not isinstance(value, dict):
        errors.add(pointer, v.MSG_CONTENT_OBJECT)
        return
    bad = v.find_nul(value)
    if bad is not None:
        errors.add(pointer + bad, v.MSG_BAD_TEXT)
        return
    too_large = v.content_too_large(value)
    if too_large:
        raise PayloadTooLarge(too_large, pointer=pointer)


def check_comment(data: dict[str, Any], errors: Errors, prefix: str = "") -> str:
    comment = data.get("comment", "")
    if comment is None:
        return ""
    if not isinstance(comment, str):
        errors.add(f"{prefix}/comment", "Must be a string.")
        return ""
    if len(comment) > MAX_COMMENT_LENGTH or "\x00" in comment:
        errors.add(f"{prefix}/comment", f"At most {MAX_COMMENT_LENGTH} characters, no NUL.")
    return comment


def check_bool(data: dict[str, Any], name: str, errors: Errors, prefix: str = "") -> bool:
    value = data.get(name, False)
    if not isinstance(value, bool):
        errors.add(f"{prefix}/{name}", "Must be true or false.")
        return False
    return value


def check_key(data: dict[str, Any], errors: Errors, prefix: str) -> EntityKey | None:
    ok = True
    for name, valid, message in (
        ("namespace", v.is_valid_namespace, v.MSG_NAMESPACE),
        ("kind", v.is_valid_kind, v.MSG_KIND),
        ("slug", v.is_valid_slug, v.MSG_SLUG),
    ):
        if name in data and not valid(data[name]):
            errors.add(f"{prefix}/{name}", message)
            ok = False
    if not ok or not all(n in data for n in ("namespace", "kind", "slug")):
        return None
    return EntityKey(data["namespace"], data["kind"], data["slug"])


def parse_if_match(value: Any, errors: Errors, pointer: str) -> IfMatch:
    if value is None:
        return None
    if value == "*":
        return "*"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        errors.add(pointer, 'Must be a positive integer version or "*".')
        return None
    return value


_OP_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    "put": ({"op", "namespace", "kind", "slug", "content"}, {"if_match", "if_none_match"}),
    "patch": ({"op", "namespace", "kind", "slug", "patch"}, {"if_match"}),
    "delete": ({"op", "namespace", "kind", "slug"}, {"if_match"}),
}


def parse_batch(data: Any) -> tuple[list[WriteOp], str, bool]:
    """Validate a ``POST /batch`` body into ops, comment and dry_run."""
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required={"ops"}, optional={"comment", "dry_run"})
    comment = check_comment(body, errors)
    dry_run = check_bool(body, "dry_run", errors)
    raw_ops = body.get("ops", [])
    if not isinstance(raw_ops, list):
        errors.add("/ops", "Must be a list of ops.")
        errors.raise_if_any()
    limit = settings.ATLAS_MAX_BATCH_OPS
    if len(raw_ops) > limit:
        raise PayloadTooLarge(f"{len(raw_ops)} ops is over the {limit}-op limit.", pointer="/ops")
    ops: list[WriteOp] = []
    for index, raw in enumerate(raw_ops):
        pointer = f"/ops/{index}"
        if not isinstance(raw, dict):
            errors.add(pointer, "Each op must be an object.")
            continue
        kind = raw.get("op")
        if kind not in _OP_FIELDS:
            errors.add(f"{pointer}/op", 'Must be "put", "patch" or "delete".')
            continue
        required, optional = _OP_FIELDS[kind]
        check_fields(raw, errors, pointer, required=required, optional=optional)
        key = check_key(raw, errors, pointer)
        if_match = parse_if_match(raw.get("if_match"), errors, f"{pointer}/if_match")
        if kind == "put":
            if "content" in raw:
                check_content(raw["content"], errors, f"{pointer}/content")
            inm = raw.get("if_none_match")
            if inm not in (None, "*"):
                errors.add(f"{pointer}/if_none_match", 'Only "*" is supported.')
            if key is not None and isinstance(raw.get("content"), dict):
                ops.append(PutOp(key, raw["content"], if_match, inm == "*", pointer))
        elif kind == "patch":
            patch = raw.get("patch")
            if "patch" in raw and not isinstance(patch, dict):
                errors.add(f"{pointer}/patch", "A merge patch of content must be an object.")
            elif isinstance(patch, dict) and v.find_nul(patch) is not None:
                errors.add(f"{pointer}/patch", v.MSG_BAD_TEXT)
            if key is not None and isinstance(patch, dict):
                ops.append(PatchOp(key, patch, if_match, pointer))
        else:
            if key is not None:
                ops.append(DeleteOp(key, if_match, pointer))
        if len(errors.items) >= 100:
            break
    errors.raise_if_any()
    return ops, comment, dry_run


def parse_put(data: Any) -> tuple[dict[str, Any], str]:
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required={"content"}, optional={"comment"})
    comment = check_comment(body, errors)
    if "content" in body:
        check_content(body["content"], errors, "/content")
    errors.raise_if_any()
    return body["content"], comment


def parse_patch(data: Any) -> tuple[dict[str, Any], str]:
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required={"patch"}, optional={"comment"})
    comment = check_comment(body, errors)
    patch = body.get("patch")
    if "patch" in body and not isinstance(patch, dict):
        errors.add("/patch", "A merge patch of content must be an object.")
    elif isinstance(patch, dict) and v.find_nul(patch) is not None:
        errors.add("/patch" + (v.find_nul(patch) or ""), v.MSG_BAD_TEXT)
    errors.raise_if_any()
    return patch, comment  # type: ignore[return-value]


def is_empty_body(data: Any) -> bool:
    """No body at all: DRF hands the view an empty dict (or QueryDict).

    A body that is JSON ``""`` or ``null`` is a body, and not an object: 422.
    """
    return isinstance(data, dict) and not data


def parse_optional_comment(data: Any) -> str:
    """DELETE may carry ``{"comment"}``; an empty body is fine."""
    if is_empty_body(data):
        return ""
    body = require_object(data)
    errors = Errors()
    check_fields(body, errors, "", required=set(), optional={"comment"})
    comment = check_comment(body, errors)
    errors.raise_if_any()
    return comment


def parse_delete_by_query(data: Any) -> dict[str, Any]:
    body = require_object(data)
    errors = Errors()
    check_fields(
        body,
        errors,
        "",
        required={"namespace"},
        optional={"kind", "slug_prefix", "dry_run", "comment"},
    )
    comment = check_comment(body, errors)
    dry_run = check_bool(body, "dry_run", errors)
    if "namespace" in body and not v.is_valid_namespace(body["namespace"]):
        errors.add("/namespace", v.MSG_NAMESPACE)
    kind = body.get("kind")
    if kind is not None and not v.is_valid_kind(kind):
        errors.add("/kind", v.MSG_KIND)
    prefix = body.get("slug_prefix")
    if prefix is not None and (
        not isinstance(prefix, str) or len(prefix) > 200 or "\x00" in prefix
    ):
        errors.add("/slug_prefix", "Must be a string of at most 200 characters, no NUL.")
    errors.raise_if_any()
    return {
        "namespace": body["namespace"],
        "kind": kind,
        "slug_prefix": prefix or None,
        "dry_run": dry_run,
        "comment": comment,
    }


# --- schema descriptions -------------------------------------------------------
#
# These describe the hand-written parsing above for the OpenAPI document, as
# exactly as JSON Schema can: types, name patterns, lengths, nullability.
# What it cannot say (no U+0000 inside content, nesting depth, the size limit,
# a namespace that must exist) is in the descriptions and answers 422/404/413.


@extend_schema_field(
    {
        "oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "enum": ["*"]}],
        "nullable": True,
    }
)
class IfMatchField(serializers.JSONField):
    """``if_match``: a positive integer version or ``"*"``."""


NO_NUL = r"^[^\x00]*$"


@extend_schema_field(
    {"type": "string", "maxLength": MAX_COMMENT_LENGTH, "pattern": NO_NUL, "nullable": True}
)
class _CommentField(serializers.JSONField):
    """Any text up to the limit, empty or null included, without U+0000."""


@extend_schema_field({"type": "string", "maxLength": 200, "pattern": NO_NUL, "nullable": True})
class _PrefixField(serializers.JSONField):
    """A literal slug prefix: up to 200 characters, empty or null included, no U+0000."""


def comment_field() -> serializers.Field:
    # Described, not validated: check_comment() does that, with the same rules.
    return _CommentField(required=False, allow_null=True, help_text="The client's comment.")


def namespace_field(**kwargs: Any) -> serializers.RegexField:
    return serializers.RegexField(
        v.NAMESPACE_RE.pattern, max_length=v.NAMESPACE_MAX_LENGTH, **kwargs
    )


def kind_field(**kwargs: Any) -> serializers.RegexField:
    return serializers.RegexField(v.KIND_RE.pattern, max_length=v.KIND_MAX_LENGTH, **kwargs)


def slug_field(**kwargs: Any) -> serializers.RegexField:
    return serializers.RegexField(v.SLUG_RE.pattern, max_length=200, **kwargs)


class EntitySerializer(serializers.Serializer):
    namespace = serializers.CharField()
    kind = serializers.CharField()
    slug = serializers.CharField()
    content = serializers.DictField()
    version = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    changeset_id = serializers.UUIDField(help_text="The changeset that last wrote it")


class EntityPageSerializer(serializers.Serializer):
    results = EntitySerializer(many=True)
    next_page_token = serializers.CharField(allow_null=True)


class PutBodySerializer(serializers.Serializer):
    content = serializers.DictField(help_text="A JSON object (no U+0000, ≤ 64 levels)")
    comment = comment_field()


class PatchBodySerializer(serializers.Serializer):
    patch = serializers.DictField(help_text="RFC 7396 merge patch of content (an object)")
    comment = comment_field()


class _OpKeySerializer(serializers.Serializer):
    namespace = namespace_field()
    kind = kind_field()
    slug = slug_field()
    if_match = IfMatchField(required=False, help_text='integer version or "*"')


class PutOpSerializer(_OpKeySerializer):
    op = serializers.ChoiceField(choices=["put"])
    content = serializers.DictField()
    if_none_match = serializers.ChoiceField(
        choices=["*"], required=False, allow_null=True, help_text='"*": create only'
    )


class PatchOpSerializer(_OpKeySerializer):
    op = serializers.ChoiceField(choices=["patch"])
    patch = serializers.DictField(help_text="RFC 7396 merge patch of content")


class DeleteOpSerializer(_OpKeySerializer):
    op = serializers.ChoiceField(choices=["delete"])


BatchOpSerializer = PolymorphicProxySerializer(
    component_name="BatchOp",
    serializers={"put": PutOpSerializer, "patch": PatchOpSerializer, "delete": DeleteOpSerializer},
    resource_type_field_name="op",
    many=True,
)


class BatchBodySerializer(serializers.Serializer):
    ops = BatchOpSerializer
    comment = comment_field()
    dry_run = serializers.BooleanField(required=False, default=False)


class DeleteByQueryBodySerializer(serializers.Serializer):
    namespace = namespace_field()
    kind = kind_field(required=False, allow_null=True)
    slug_prefix = _PrefixField(required=False, allow_null=True)
    dry_run = serializers.BooleanField(required=False, default=False)
    comment = comment_field()
