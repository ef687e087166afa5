"""NDJSON changeset files: the format, both ways (export lines, strict parsing).

Applying a parsed file is a write, in :mod:`changesets.services.interchange`.
Line 1 is the envelope, then one line per op in order (API.md). Parsing is
strict, in the spirit of a typed artifact: an unknown or missing key, a wrong
``schema_version``, malformed JSON, a non-object image or an op whose images
contradict it fails the whole file, naming the line (``/line/<n>``, 1-based).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from atlas.api.render import parse_rfc3339, rfc3339
from atlas.exceptions import PayloadTooLarge
from changesets import provenance
from changesets.exceptions import NdjsonError
from changesets.models import Changeset, Revision, Rpc
from entities import validation as v
from entities.store import EntityKey

# Version 2 op lines carry ``changed``; files of version 1 still import. Import
# recomputes ``changed`` (the new changeset's rows get their own), so a given one
# is accepted and ignored (API.md "Decisions for the added sections").
SCHEMA_VERSION = 2
SCHEMA_VERSIONS = (1, 2)
# As for a comment sent to the API (entities.api.serializers.MAX_COMMENT_LENGTH).
MAX_COMMENT_LENGTH = 10_000
ENVELOPE_KEYS = {"schema_version", "changeset_id", "author", "at", "rpc", "branch", "comment"}
OP_KEYS = {"op", "namespace", "kind", "slug", "before", "after"}
OPTIONAL_OP_KEYS = {2: {"changed"}}
# Version 2 envelopes carry provenance; files without it still import. The
# ``metadata`` becomes the new changeset's; the ``context`` is the exported
# write's and is checked, not kept (an import records its own).
OPTIONAL_ENVELOPE_KEYS = {2: {"metadata", "context"}}
MEDIA_TYPE = "application/x-ndjson"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def export_lines(
    changeset: Changeset, revisions: Iterable[Revision], *, sees_all: bool = True
) -> Iterator[str]:
    """The changeset as NDJSON lines (each ending in a newline).

    ``revisions`` are the ops the reader may see; ``sees_all`` false (the
    reader cannot read every namespace the changeset touched) blanks the
    envelope's ``comment``, ``metadata`` and ``context``, which the API hides
    from such readers (the keys stay, empty).
    """
    yield (
        _dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "changeset_id": str(changeset.id),
                "author": changeset.author_name,
                "at": rfc3339(changeset.at),
                "rpc": changeset.rpc,
                "branch": changeset.branch,
                "comment": changeset.comment if sees_all else "",
                "metadata": (changeset.metadata or {}) if sees_all else {},
                "context": changeset.context if sees_all else None,
            }
        )
        + "\n"
    )
    for revision in revisions:
        yield (
            _dumps(
                {
                    "op": revision.op,
                    "namespace": revision.namespace,
                    "kind": revision.kind,
                    "slug": revision.slug,
                    "before": revision.before,
                    "after": revision.after,
                    "changed": revision.changed,
                }
            )
            + "\n"
        )


@dataclass(frozen=True)
class FileOp:
    line: int
    op: str
    key: EntityKey
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(frozen=True)
class ChangesetFile:
    envelope: dict[str, Any]
    ops: list[FileOp]


def _fail(line: int, detail: str) -> NdjsonError:
    return NdjsonError(f"Line {line}: {detail}", pointer=f"/line/{line}")


def _keys(
    obj: dict[str, Any], expected: set[str], line: int, optional: set[str] | None = None
) -> None:
    unknown = sorted(set(obj) - expected - (optional or set()))
    missing = sorted(expected - set(obj))
    if unknown:
        raise _fail(line, f"unknown key(s): {', '.join(unknown)}.")
    if missing:
        raise _fail(line, f"missing key(s): {', '.join(missing)}.")


def _image(value: Any, line: int, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _fail(line, f"{name} must be an object or null.")
    bad = v.find_nul(value)
    if bad is not None:
        raise _fail(line, f"{name}{bad}: {v.MSG_BAD_TEXT}")
    return value


def parse(text: str | bytes) -> ChangesetFile:
    """Parse and check a whole file; raise :class:`NdjsonError` at the first bad line.

    Lines are checked one by one in file order (decoding included), so the
    error names the first line that is wrong, whatever is wrong with later ones.
    """
    lines: list[str] | list[bytes] = (
        text.split(b"\n") if isinstance(text, bytes) else text.split("\n")
    )
    if lines and not lines[-1]:
        lines.pop()  # the final newline
    if not lines:
        raise _fail(1, "the file is empty; line 1 must be the envelope.")
    envelope: dict[str, Any] = {}
    ops: list[FileOp] = []
    rows: Sequence[str | bytes] = lines  # one element type, for enumerate
    for number, raw in enumerate(rows, start=1):
        obj = _load_line(raw, number)
        if number == 1:
            envelope = _check_envelope(obj)
        else:
            ops.append(_check_op(obj, number, version=envelope["schema_version"]))
    return ChangesetFile(envelope, ops)


def _load_line(raw: str | bytes, number: int) -> dict[str, Any]:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(number, "the line is not UTF-8.") from exc
    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _fail(number, f"malformed JSON ({exc}).") from exc
    if not isinstance(obj, dict):
        raise _fail(number, "each line must be a JSON object.")
    try:
        # Lone UTF-16 surrogates ("\ud800") parse, but cannot be stored or even echoed.
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(number, "strings may not contain unpaired UTF-16 surrogates.") from exc
    return obj


def _check_envelope(envelope: dict[str, Any]) -> dict[str, Any]:
    # type(), not ==: JSON's 1.0 and true are not the integer 1, whatever Python says.
    version = envelope.get("schema_version")
    if type(version) is int and version in SCHEMA_VERSIONS:
        _keys(envelope, ENVELOPE_KEYS, 1, OPTIONAL_ENVELOPE_KEYS.get(version))
    else:
        _keys(envelope, ENVELOPE_KEYS, 1)
        raise _fail(1, f"schema_version must be {' or '.join(map(str, SCHEMA_VERSIONS))}.")
    for name in ("changeset_id", "author", "at", "rpc", "branch", "comment"):
        if not isinstance(envelope[name], str):
            raise _fail(1, f"{name} must be a string.")
    try:
        uuid.UUID(envelope["changeset_id"])
    except ValueError as exc:
        raise _fail(1, "changeset_id must be a UUID.") from exc
    if parse_rfc3339(envelope["at"]) is None:
        raise _fail(1, "at must be an RFC 3339 timestamp.")
    if envelope["rpc"] not in Rpc.values:
        raise _fail(1, f"rpc must be one of {', '.join(Rpc.values)}.")
    # The comment becomes the new changeset's: the API's rules for comments apply.
    if "\x00" in envelope["comment"] or len(envelope["comment"]) > MAX_COMMENT_LENGTH:
        raise _fail(1, f"comment must be at most {MAX_COMMENT_LENGTH} characters, no U+0000.")
    _check_provenance(envelope)
    return envelope


def _check_provenance(envelope: dict[str, Any]) -> None:
    """``metadata`` by the API's rules (over 4 KiB: 413); ``context`` an object or null."""
    metadata = envelope.get("metadata")
    if metadata is not None:
        problem = provenance.metadata_problem(metadata)
        if problem is not None and problem.too_large:
            raise PayloadTooLarge(f"Line 1: {problem.message}", pointer="/line/1")
        if problem is not None:
            raise _fail(1, f"metadata{problem.pointer}: {problem.message}")
    if not isinstance(envelope.get("context"), dict | None):
        raise _fail(1, "context must be an object or null.")


_SHAPES = {"create": (False, True), "update": (True, True), "delete": (True, False)}


def _check_op(obj: dict[str, Any], number: int, *, version: int) -> FileOp:
    _keys(obj, OP_KEYS, number, OPTIONAL_OP_KEYS.get(version))
    if obj["op"] not in _SHAPES:
        raise _fail(number, 'op must be "create", "update" or "delete".')
    if not v.is_valid_namespace(obj["namespace"]):
        raise _fail(number, v.MSG_NAMESPACE)
    if not v.is_valid_kind(obj["kind"]):
        raise _fail(number, v.MSG_KIND)
    if not v.is_valid_slug(obj["slug"]):
        raise _fail(number, v.MSG_SLUG)
    before = _image(obj["before"], number, "before")
    after = _image(obj["after"], number, "after")
    shape = _SHAPES[obj["op"]]
    if ((before is not None), (after is not None)) != shape:
        raise _fail(
            number,
            f"a {obj['op']} needs before {'object' if shape[0] else 'null'}"
            f" and after {'object' if shape[1] else 'null'}.",
        )
    key = EntityKey(obj["namespace"], obj["kind"], obj["slug"])
    return FileOp(number, obj["op"], key, before, after)


def _reject_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")
