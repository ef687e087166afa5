"""Request-body fields and checks every app's API shares, with the contract's error shape.

A bad body is one 422 listing every ``{pointer, detail}`` found (API.md
"Errors"), so a client fixes them all in one round trip; the pointers are
RFC 6901 paths into the body (``/ops/3/content``). The body and query bases
that collect them, and the fields that only check a JSON type, are in
:mod:`atlas.api.strict`; here are the fields that carry a domain rule (names,
content, the ``comment`` of every body), the checks ``/batch``'s measured
hand-written path shares, and the pieces revert's, merge's and sync's bodies
share (lists of entity refs, granularity). Apps' APIs import these from here,
never from each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.fields import empty

from atlas.api.strict import (
    MSG_REQUIRED,
    MSG_STRING,
    MSG_UNKNOWN,
    NO_NUL,
    FieldProblem,
    Query,
    StrictChoiceField,
    raise_errors,
)
from atlas.exceptions import PayloadTooLarge, ValidationFailed
from changesets import provenance
from changesets.merge3 import GRANULARITIES
from entities import validation as v
from entities.store import EntityKey

MAX_COMMENT_LENGTH = 10_000
MAX_PREFIX_LENGTH = 200
MSG_COMMENT = f"At most {MAX_COMMENT_LENGTH} characters, no NUL."


class Errors:
    """Collects ``{pointer, detail}`` pairs and raises them as one 422."""

    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, pointer: str, detail: str) -> None:
        self.items.append({"pointer": pointer, "detail": detail})

    def raise_if_any(self) -> None:
        raise_errors(self.items)


def check_fields(
    data: dict[str, Any], errors: Errors, prefix: str, *, required: set[str], optional: set[str]
) -> None:
    for name in sorted(set(data) - required - optional):
        errors.add(f"{prefix}/{name}", MSG_UNKNOWN)
    for name in sorted(required - set(data)):
        errors.add(f"{prefix}/{name}", MSG_REQUIRED)


def comment_error(value: Any) -> str | None:
    """Why ``value`` is not a comment (null is one: it means empty), or None."""
    if value is None:
        return None
    if not isinstance(value, str):
        return MSG_STRING
    if len(value) > MAX_COMMENT_LENGTH or "\x00" in value:
        return MSG_COMMENT
    return None


def prefix_error(value: Any) -> str | None:
    """Why ``value`` is not a literal slug prefix (null is one: no prefix), or None."""
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_PREFIX_LENGTH or "\x00" in value:
        return f"Must be a string of at most {MAX_PREFIX_LENGTH} characters, no NUL."
    return None


# --- fields: one description that both validates and feeds OpenAPI ------------------


class NullChecked:
    """JSON null meets the field's own rule and message, not DRF's "may not be null"."""

    allow_null: bool

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None and not self.allow_null:
            return False, data
        return super().validate_empty_values(data)  # type: ignore[misc]


@extend_schema_field(
    {"type": "string", "maxLength": MAX_COMMENT_LENGTH, "pattern": NO_NUL, "nullable": True}
)
class CommentField(serializers.Field):
    """Any text up to the limit, empty or null included (null reads as ``""``), without
    U+0000: the ``comment`` of every body that writes or records something."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("help_text", "The client's comment.")
        super().__init__(**kwargs)

    def run_validation(self, data: Any = empty) -> str:
        return "" if data is None else super().run_validation(data)

    def to_internal_value(self, data: Any) -> str:
        error = comment_error(data)
        if error is not None:
            raise serializers.ValidationError(error)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field(
    {"type": "string", "maxLength": MAX_PREFIX_LENGTH, "pattern": NO_NUL, "nullable": True}
)
class PrefixField(serializers.Field):
    """A literal slug prefix: up to 200 characters, empty or null included, no U+0000."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str | None:
        error = prefix_error(data)
        if error is not None:
            raise serializers.ValidationError(error)
        return data or None

    def to_representation(self, value: Any) -> Any:
        return value


class NameField(NullChecked, serializers.Field):
    """A name checked by one of ``entities.validation``'s rules, with its message."""

    def __init__(self, *, valid: Any, message: str, schema: dict[str, Any], **kwargs: Any) -> None:
        self.valid = valid
        self.message = message
        self.schema = schema
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not self.valid(data):
            raise serializers.ValidationError(self.message)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class NameFieldScheme(OpenApiSerializerFieldExtension):
    """A name field is described by its own schema (pattern, length)."""

    target_class = NameField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        # In a body as DRF's RegexField was described: never blank, then the name's own
        # limits. In a query an empty value is absent, so no ``minLength`` there.
        schema: dict[str, Any] = {"type": "string"}
        if self.target.allow_null:
            schema["nullable"] = True
        if not isinstance(self.target.root, Query):
            schema["minLength"] = 1
        schema["maxLength"] = self.target.schema["maxLength"]
        schema["pattern"] = self.target.schema["pattern"]
        return schema


class ChoiceOf(NullChecked, serializers.ChoiceField):
    """One of a few words, with one message for anything else."""

    def __init__(self, choices: Any, *, message: str, **kwargs: Any) -> None:
        self.message = message
        super().__init__(choices, **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if data is None and self.allow_null:
            return None
        if not isinstance(data, str) or data not in self.choice_strings_to_values:
            raise serializers.ValidationError(self.message)
        return self.choice_strings_to_values[data]


class ProblemCheckedField(serializers.Field):
    """A JSON value judged by one ``*_problem`` rule (``self.problem``): 413 at the
    field when it is too large, else 422 at the pointer the rule names."""

    problem: Callable[[Any], Any]

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        problem = self.problem(data)
        if problem is None:
            return data
        if problem.too_large:
            raise PayloadTooLarge(problem.message, pointer=f"/{self.field_name}")
        raise FieldProblem([(problem.pointer, problem.message)])

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"type": "object", "additionalProperties": {}})
class ContentField(NullChecked, ProblemCheckedField):
    """An entity's content, by the one content rule (``entities.validation``)."""

    def __init__(self, *, patch: bool = False, **kwargs: Any) -> None:
        self.problem = v.patch_problem if patch else v.content_problem
        super().__init__(**kwargs)


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {},
        "nullable": True,
        "description": "The client's provenance, stored on the changeset: a JSON object"
        f" of at most {provenance.MAX_METADATA_BYTES} bytes as compact JSON (413 over it).",
    }
)
class MetadataField(ProblemCheckedField):
    """``metadata`` of every write body (``changesets.provenance``); null means none."""

    def __init__(self, **kwargs: Any) -> None:
        self.problem = provenance.metadata_problem
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)


def metadata_field() -> serializers.Field:
    return MetadataField()


NAMESPACE_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": v.NAMESPACE_RE.pattern,
    "maxLength": v.NAMESPACE_MAX_LENGTH,
}
KIND_SCHEMA: dict[str, Any] = {
    "type": "string",
    "pattern": v.KIND_RE.pattern,
    "maxLength": v.KIND_MAX_LENGTH,
}
SLUG_SCHEMA: dict[str, Any] = {"type": "string", "pattern": v.SLUG_RE.pattern, "maxLength": 200}


def comment_field() -> serializers.Field:
    return CommentField()


def namespace_field(**kwargs: Any) -> serializers.Field:
    return NameField(
        valid=v.is_valid_namespace, message=v.MSG_NAMESPACE, schema=NAMESPACE_SCHEMA, **kwargs
    )


def kind_field(**kwargs: Any) -> serializers.Field:
    return NameField(valid=v.is_valid_kind, message=v.MSG_KIND, schema=KIND_SCHEMA, **kwargs)


def slug_field(**kwargs: Any) -> serializers.Field:
    return NameField(valid=v.is_valid_slug, message=v.MSG_SLUG, schema=SLUG_SCHEMA, **kwargs)


# --- lists of entity refs, and merge granularity: revert's, merge's and sync's bodies


class ObjectListField(serializers.ListField):
    """A JSON array of closed objects, each checked by ``child`` (a :class:`strict.Body`),
    every error at its pointer inside the list (``/only/2/slug``)."""

    def run_validation(self, data: Any = empty) -> Any:
        if data is empty:
            return super().run_validation(data)
        if not isinstance(data, list):
            raise FieldProblem([("", "Must be a list.")])
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
            raise FieldProblem(items)
        return values


def ref_key(ref: dict[str, Any]) -> EntityKey:
    return EntityKey(ref["namespace"], ref["kind"], ref["slug"])


def granularity_field(default: str, help_text: str) -> serializers.Field:
    return StrictChoiceField(
        list(GRANULARITIES), required=False, default=default, help_text=help_text
    )
