"""Provenance: the client's ``metadata`` and the server's ``context`` of a changeset.

API.md "Provenance": every write may carry a ``metadata`` object (at most
4 KiB), and the server records how the write arrived (``context``: request
id, client IP, user agent, how it authenticated, which token). Both are
stored on the changeset and covered by the chain (``changesets.chain``).

The rules live here, below the API, because three doors share them: the
request bodies (``atlas.api.inputs``), an NDJSON envelope on import
(``changesets.ndjson``) and the write path, which stores the one normalized
form it hashes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from changesets.ops import canonical
from entities import validation as v

MAX_METADATA_BYTES = 4096
MSG_METADATA_OBJECT = "Must be a JSON object."
MSG_METADATA_TOO_LARGE = f"metadata is over {MAX_METADATA_BYTES} bytes (encoded as compact JSON)."
MSG_METADATA_TEXT = "Strings may not hold U+0000 or unpaired surrogates; nesting is limited to 64."

# A write that did not come through a request: an operator's command, a test, a task.
SYSTEM_CONTEXT: dict[str, Any] = {"auth": "system"}

AUTH_TOKEN, AUTH_SESSION, AUTH_SYSTEM = "token", "session", "system"
# A write made through the MCP server (``atlas.mcp``), as the token's user, on behalf of
# the MCP client that ``context.client`` names.
AUTH_MCP = "mcp"


@dataclass(frozen=True)
class MetadataProblem:
    pointer: str  # inside the metadata object ("" for the object itself)
    message: str
    too_large: bool = False


def metadata_problem(value: Any) -> MetadataProblem | None:
    """Why ``value`` cannot be a changeset's metadata, or None.

    The size is measured on the compact JSON the chain hashes, so the limit
    means the same thing however the client spaced its body.
    """
    if not isinstance(value, dict):
        return MetadataProblem("", MSG_METADATA_OBJECT)
    bad = v.find_nul(value)
    if bad is not None:
        return MetadataProblem(bad, MSG_METADATA_TEXT)
    try:
        size = len(canonical(v.as_stored(value)).encode())
    except UnicodeEncodeError:
        return MetadataProblem("", MSG_METADATA_TEXT)
    except ValueError:
        return MetadataProblem("", v.MSG_NOT_FINITE)
    if size > MAX_METADATA_BYTES:
        return MetadataProblem("", MSG_METADATA_TOO_LARGE, too_large=True)
    return None


def stored_metadata(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The form the changeset stores and the chain hashes: as ``jsonb`` gives it
    back (``entities.validation.as_stored``); no metadata and ``{}`` are both NULL,
    which costs a write nothing."""
    if not value:
        return None
    return dict(v.as_stored(dict(value)))


def stored_context(value: Mapping[str, Any] | None) -> dict[str, Any]:
    """The context a changeset stores: the request's, or :data:`SYSTEM_CONTEXT`."""
    return dict(value) if value else dict(SYSTEM_CONTEXT)


def as_text(value: Mapping[str, Any] | None) -> str | None:
    """The canonical JSON text the log statement inserts (None stays SQL NULL)."""
    return None if value is None else canonical(value)
