"""Inputs described once: DRF serializers that both validate and feed the OpenAPI document.

Why not DRF's fields as they come: they coerce (``CharField`` takes ``7`` as
``"7"``, ``BooleanField`` takes ``"yes"``), ignore unknown fields, and may
report one value twice (a failed pattern and a U+0000). Atlas's contract is
stricter (API.md "Decisions that close open points"): the JSON type must
match, an unknown field is 422, and every error names its value with an
RFC 6901 pointer. So:

1. :class:`Body` refuses a body that is not an object, then reports unknown
   fields (sorted), then missing required ones (sorted), then each present
   field's own error, in declaration order; all of them as one 422 in the
   contract's ``errors`` shape.
2. The fields check the JSON type before anything else and report one error
   each. :class:`CheckedField` hands the value to a domain check (a service's
   ``check_*``), whose :class:`~atlas.exceptions.ValidationFailed` keeps its
   own pointers (``/namespaces/2``).
3. A field absent from the body is absent from ``validated_data`` unless it
   has a default, so a partial update changes only what was sent.

The same field objects give drf-spectacular the schema (types, patterns,
lengths, defaults), so what the document says is what is checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

from django.http import QueryDict
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from rest_framework import serializers
from rest_framework.fields import empty

from atlas.exceptions import ValidationFailed

NO_NUL = r"^[^\x00]*$"
MSG_UNKNOWN = "Unknown field."
MSG_REQUIRED = "This field is required."
MSG_BOOL = "Must be true or false."
MSG_STRING = "Must be a string."
MAX_ERRORS = 100  # one 422 lists at most this many errors


def raise_errors(errors: list[dict[str, str]]) -> None:
    """Raise ``errors`` (``{pointer, detail}``) as one 422, if there are any."""
    if errors:
        first = errors[0]
        detail = first["detail"] if len(errors) == 1 else f"{len(errors)} errors."
        raise ValidationFailed(detail, pointer=first["pointer"], errors=errors[:MAX_ERRORS])


class FieldProblem(serializers.ValidationError):
    """A field's errors at pointers inside its value (``/content/a/b``, ``/ops/3/slug``)."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        super().__init__([message for _, message in items])
        self.items = items


def _field_errors(exc: Exception, pointer: str) -> list[dict[str, str]]:
    if isinstance(exc, FieldProblem):
        return [{"pointer": f"{pointer}{inner}", "detail": message} for inner, message in exc.items]
    if isinstance(exc, ValidationFailed):
        return list(exc.errors or [{"pointer": pointer, "detail": exc.detail}])
    detail = exc.detail if isinstance(exc, serializers.ValidationError) else str(exc)
    return _flatten(detail, pointer)


def _flatten(detail: Any, prefix: str) -> list[dict[str, str]]:
    if isinstance(detail, list) and all(not isinstance(d, dict | list) for d in detail):
        return [{"pointer": prefix, "detail": str(d)} for d in detail]
    if isinstance(detail, dict):
        return [i for k, d in detail.items() for i in _flatten(d, f"{prefix}/{k}")]
    return [{"pointer": prefix, "detail": str(detail)}]


def _bound_name(field: serializers.Field) -> str:
    # A field in ``self.fields`` is bound, so its name is set; the stubs type
    # ``field_name`` Optional for a field not bound yet.
    return cast(str, field.field_name)


# Serializer docstrings become schema descriptions (inherited by subclasses), so the
# bases below say what they are in comments.


# A JSON object request body: closed, strictly typed, every error with its pointer.
# The one base of every request body. Fields are checked (and their errors
# reported) in declaration order, except that those named in ``first`` (the
# common ``comment`` and ``dry_run``) go before the rest: the order clients
# have always seen. A value over a size limit answers 413 at once.
class Body(serializers.Serializer):
    first: tuple[str, ...] = ("comment", "dry_run")

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        # A JSON ``null`` body is a body that is not an object (422), not "no data".
        return (False, data)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise ValidationFailed(
                "The body must be a JSON object.",
                pointer="/",
                errors=[{"pointer": "/", "detail": "Expected an object."}],
            )
        fields = {_bound_name(f): f for f in self.fields.values() if not f.read_only}
        unknown = sorted(set(data) - set(fields))
        errors = [{"pointer": f"/{n}", "detail": MSG_UNKNOWN} for n in unknown]
        missing = sorted(n for n, f in fields.items() if f.required and n not in data)
        errors += [{"pointer": f"/{n}", "detail": MSG_REQUIRED} for n in missing]
        rank = {name: i for i, name in enumerate(self.first)}
        values: dict[str, Any] = {}
        for name in sorted(fields, key=lambda n: rank.get(n, len(rank))):
            field = fields[name]
            if name in data:
                try:
                    values[name] = field.run_validation(data[name])
                except (serializers.ValidationError, ValidationFailed) as exc:
                    errors += _field_errors(exc, f"/{name}")
            elif field.default is not empty:
                values[name] = field.get_default()
        raise_errors(errors)
        return values

    @classmethod
    def parse(cls, data: Any) -> dict[str, Any]:
        """Validate ``data`` (``request.data``) and return the values, or raise the 422."""
        return validated(cls, data)


# A body with no fields: none at all, or ``{}``.
class Empty(Body):
    pass


# Query parameters: each field reads its one value (the last, like Django); an
# empty value counts as absent unless the field ``keeps_empty``. Unknown parameters
# are the view's business (``paging.check_known_params``): some endpoints accept any.
class Query(serializers.Serializer):
    def to_internal_value(self, data: Any) -> dict[str, Any]:
        params = data if isinstance(data, QueryDict) else QueryDict(mutable=True)
        errors: list[dict[str, str]] = []
        values: dict[str, Any] = {}
        for name, field in self.fields.items():
            raw = params.get(name)
            if raw is None or (raw == "" and not getattr(field, "keeps_empty", False)):
                continue
            try:
                values[name] = field.run_validation(raw)
            except (serializers.ValidationError, ValidationFailed) as exc:
                errors += _field_errors(exc, f"/{name}")
        if errors:
            self.refuse(errors)
        return values

    def refuse(self, errors: list[dict[str, str]]) -> None:
        """Raise ``errors`` as one 422; a query may keep an older wording of its summary."""
        raise_errors(errors)


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """``data`` checked by ``serializer_class``: its values, or the 422 it raises."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON ``true`` or ``false``; nothing else (not ``"yes"``, not ``1``)."""

    default_error_messages = {"invalid": MSG_BOOL, "null": MSG_BOOL}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class QueryBooleanField(serializers.BooleanField):
    """A boolean query parameter: ``true``/``false``/``1``/``0``, any case."""

    default_error_messages = {"invalid": MSG_BOOL}

    def to_internal_value(self, data: Any) -> bool:
        value = str(data).lower()
        if value not in ("true", "false", "1", "0"):
            self.fail("invalid")
        return value in ("true", "1")


class StrictCharField(serializers.CharField):
    """Any JSON string, as sent (no trimming); anything else gets ``message``."""

    def __init__(self, *, message: str = MSG_STRING, **kwargs: Any) -> None:
        kwargs["error_messages"] = {"invalid": message, "null": message}
        super().__init__(trim_whitespace=False, **kwargs)

    def run_validation(self, data: Any = empty) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data


class TextField(serializers.Field):
    """A JSON string of at most ``max_length`` characters without U+0000; null reads as ``""``."""

    default_error_messages = {
        "type": MSG_STRING,
        "invalid": "At most {max_length} characters, no NUL.",
    }

    def __init__(self, *, max_length: int, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)
        self.max_length = max_length

    def run_validation(self, data: Any = empty) -> str:
        if data is None:
            return ""
        if not isinstance(data, str):
            self.fail("type")
        if len(data) > self.max_length or "\x00" in data:
            self.fail("invalid", max_length=self.max_length)
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class _TextFieldSchema(OpenApiSerializerFieldExtension):
    target_class = TextField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "maxLength": self.target.max_length, "pattern": NO_NUL}


class StrictChoiceField(serializers.ChoiceField):
    """One of ``choices``, as a JSON string; any other value gets ``message``."""

    def __init__(self, choices: list[str], *, message: str | None = None, **kwargs: Any) -> None:
        message = message or f"One of {', '.join(choices)}."
        kwargs["error_messages"] = {"invalid_choice": message, "null": message}
        super().__init__(choices, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str) or data not in self.choices:
            self.fail("invalid_choice")
        return data


class StrictRegexField(serializers.RegexField):
    """A JSON string matching ``regex`` in full (and ``max_length``); else ``message``.

    ``check`` replaces the match when the rule is a function elsewhere (one rule,
    one place); the pattern still describes it in the document.
    """

    def __init__(
        self,
        regex: str,
        *,
        message: str,
        check: Callable[[str], bool] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs["error_messages"] = {"invalid": message, "null": message}
        super().__init__(regex, trim_whitespace=False, **kwargs)
        pattern = re.compile(regex)
        self.check = check or (lambda value: pattern.fullmatch(value) is not None)

    def run_validation(self, data: Any = empty) -> str:
        if not isinstance(data, str) or not self.check(data):
            self.fail("invalid")
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("invalid")
        return data


class CheckedField(serializers.Field):
    """Mixin: the value goes to ``clean`` (a domain check that raises or returns it)."""

    def __init__(self, *args: Any, clean: Callable[[Any], Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clean = clean

    def run_validation(self, data: Any = empty) -> Any:
        return self.clean(data)


class CheckedRegexField(CheckedField, serializers.RegexField):
    """A string described by a pattern, checked by ``clean``."""


class CheckedListField(CheckedField, serializers.ListField):
    """A list described by its child field, checked by ``clean``."""


__all__ = [
    "Body",
    "FieldProblem",
    "Empty",
    "CheckedListField",
    "CheckedRegexField",
    "Query",
    "QueryBooleanField",
    "StrictBooleanField",
    "StrictCharField",
    "StrictChoiceField",
    "StrictRegexField",
    "TextField",
    "raise_errors",
    "validated",
]
