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
4. :class:`Query` reads query parameters the same way (one 422 with every
   error, a pointer each); an empty value is an absent one.

Every view reads an input with :func:`validated`, a body or a query alike.

The same field objects give drf-spectacular the schema (types, patterns,
lengths, defaults), so what the document says is what is checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn, cast

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


# A body with no fields: none at all, or ``{}``.
class Empty(Body):
    pass


# Query parameters: each field reads its one value (the last, like Django), or all
# of them if it is a ``ListField`` (a repeatable parameter). An empty value counts
# as absent unless the field ``keeps_empty``; an absent field takes its default, if
# it has one. Unknown parameters are the view's business (``paging.check_known_params``
# with :meth:`names`): some endpoints accept any.
class Query(serializers.Serializer):
    @classmethod
    def names(cls) -> set[str]:
        """The parameters this query reads: what ``check_known_params`` lets through."""
        return set(cls._declared_fields)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        params = data if isinstance(data, QueryDict) else QueryDict(mutable=True)
        errors: list[dict[str, str]] = []
        values: dict[str, Any] = {}
        for name, field in self.fields.items():
            raw = _sent(params, name, field)
            if raw is None:
                if field.default is not empty:
                    values[name] = field.get_default()
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


def _sent(params: QueryDict, name: str, field: serializers.Field) -> Any:
    """What the client sent for ``field`` (a list for a repeatable one), or None if nothing."""
    if isinstance(field, serializers.ListField):
        return [value for value in params.getlist(name) if value != ""] or None
    raw = params.get(name)
    if raw == "" and not getattr(field, "keeps_empty", False):
        return None
    return raw


def refuse_naming(name: str, errors: list[dict[str, str]]) -> NoReturn:
    """The 422 some single-parameter checks always answered: ``detail`` names the
    parameter (``dry_run must be true or false.``) and there is no top-level pointer."""
    detail = errors[0]["detail"]
    raise ValidationFailed(f"{name} {detail[:1].lower()}{detail[1:]}", errors=errors)


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """``data`` (a body or ``request.query_params``) checked by ``serializer_class``:
    its values, or the 422 it raises. The one way every view reads an input."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON ``true`` or ``false`` only: ``"yes"``, ``1`` or null is a 422, not a guess."""

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


# The query fields below are plain ``Field``s described by an extension: drf-spectacular
# reads a ``CharField``'s or ``ChoiceField``'s ``allow_blank`` into ``minLength: 1`` or
# a ``oneOf`` with the empty string, neither of which a query value needs (empty is absent).


class QueryChoiceField(serializers.Field):
    """A query value that is one of ``choices``; anything else is ``One of a, b, c.``"""

    def __init__(self, choices: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.choices = list(choices)
        self.message = f"One of {', '.join(self.choices)}."

    def run_validation(self, data: Any = empty) -> str:
        if data not in self.choices:
            raise serializers.ValidationError(self.message)
        return str(data)

    def to_representation(self, value: Any) -> Any:
        return value


class _QueryChoiceSchema(OpenApiSerializerFieldExtension):
    target_class = QueryChoiceField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return {"type": "string", "enum": sorted(self.target.choices)}


class QueryIntField(serializers.Field):
    """An integer query value: below ``minimum`` is a 422, above ``maximum`` is clamped
    to it (API.md "Decisions that close open points"), as ``int()`` reads it."""

    default_error_messages = {
        "integer": "Must be an integer.",
        "minimum": "Must be at least {minimum}.",
    }

    def __init__(self, *, maximum: int, minimum: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.maximum = maximum
        self.minimum = minimum

    def run_validation(self, data: Any = empty) -> int:
        try:
            value = int(data)
        except (TypeError, ValueError):
            self.fail("integer")
        if value < self.minimum:
            self.fail("minimum", minimum=self.minimum)
        return min(value, self.maximum)

    def to_representation(self, value: Any) -> Any:
        return value


class _QueryIntSchema(OpenApiSerializerFieldExtension):
    target_class = QueryIntField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        # No ``maximum``: a larger value is not refused, it is clamped.
        return {"type": "integer", "minimum": self.target.minimum}


class StrictCharField(serializers.CharField):
    """Any JSON string, as sent (no trimming); anything else gets ``message``."""

    def __init__(self, *, message: str = MSG_STRING, **kwargs: Any) -> None:
        kwargs["error_messages"] = {"invalid": message, "null": message}
        super().__init__(trim_whitespace=False, **kwargs)

    def run_validation(self, data: Any = empty) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data


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
    "QueryChoiceField",
    "QueryIntField",
    "StrictBooleanField",
    "StrictCharField",
    "StrictChoiceField",
    "StrictRegexField",
    "raise_errors",
    "refuse_naming",
    "validated",
]
