"""What every hash of the chain is made of: its version tag, the genesis hash, the
canonical JSON and the time as the chain writes it (``changesets.chain``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64
VERSION = b"atlas-chain-v2"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _timestamp(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")
