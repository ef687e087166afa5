"""Step 5 of an erasure: the copies outside the log, stored idempotent responses
and error texts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from django.db import connection

from atlas.models import IdempotencyRecord
from changesets.redaction import ERASED, redacted
from entities.store import EntityKey

# Text columns are searched for erased strings of at least this many characters:
# replacing "ok" or "1" inside an error message would garble it and protect nothing.
MIN_TEXT_LENGTH = 4


def _strings(values: Iterable[Any]) -> set[str]:
    """The erased values' strings (recursively) long enough to search text for."""
    out: set[str] = set()
    for value in values:
        if isinstance(value, str):
            if len(value) >= MIN_TEXT_LENGTH:
                out.add(value)
        elif isinstance(value, dict | list):
            out |= _strings(value.values() if isinstance(value, dict) else value)
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            out.add(text)
        elif value is not None and not isinstance(value, bool):
            text = json.dumps(value)
            if len(text) >= MIN_TEXT_LENGTH:
                out.add(text)
    return out


def _redact_copies(pointers: Mapping[EntityKey, Sequence[str]], found: list[Any]) -> None:
    """Step 5: idempotent responses (by structure, then by value) and error texts."""
    strings = _strings(found)
    _redact_idempotency(pointers, strings)
    texts = sorted(strings | {json.dumps(s)[1:-1] for s in strings}, key=len, reverse=True)
    columns = [
        ("changesets_journalentry", "last_error"),
        ("changesets_subscription", "last_error"),
        ("changesets_subscription", "parked_error"),
    ]
    with connection.cursor() as cursor:
        for table, column in columns:
            for text in texts:
                cursor.execute(
                    f"UPDATE {table} SET {column} = replace({column}, %s, %s)"
                    f" WHERE strpos({column}, %s) > 0",
                    [text, ERASED, text],
                )


_IMAGE_FIELDS = ("content", "before", "after", "new_row", "new_values", "old_values")


def _redact_body(node: Any, pointers: Mapping[EntityKey, Sequence[str]], strings: set[str]) -> Any:
    """A rendered response with the targets' values erased wherever it shows them."""
    if isinstance(node, list):
        return [_redact_body(item, pointers, strings) for item in node]
    if isinstance(node, str):
        return ERASED if node in strings else node
    if not isinstance(node, dict):
        return node
    out = {k: _redact_body(v, pointers, strings) for k, v in node.items()}
    try:
        key = EntityKey(out["namespace"], out["kind"], out["slug"])
    except (KeyError, TypeError):
        return out
    for name in _IMAGE_FIELDS:
        if key in pointers and isinstance(out.get(name), dict):
            out[name], _ = redacted(out[name], pointers[key], [])
    return out


def _redact_idempotency(pointers: Mapping[EntityKey, Sequence[str]], strings: set[str]) -> None:
    """Stored responses that mention a target's slug (or an erased string), re-rendered redacted."""
    needles = sorted({k.slug for k in pointers} | strings)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM atlas_idempotencyrecord WHERE response_body IS NOT NULL"
            " AND EXISTS (SELECT 1 FROM unnest(%s::text[]) n"
            "  WHERE position(convert_to(n, 'UTF8') IN response_body) > 0)",
            [needles],
        )
        ids = [row[0] for row in cursor.fetchall()]
    for record in IdempotencyRecord.objects.filter(pk__in=ids).only("pk", "response_body"):
        try:
            body = json.loads(bytes(record.response_body or b""))
        except ValueError:
            continue
        clean = _redact_body(body, pointers, strings)
        if clean != body:
            text = json.dumps(clean, ensure_ascii=False, separators=(",", ":")).encode()
            IdempotencyRecord.objects.filter(pk=record.pk).update(response_body=text)
