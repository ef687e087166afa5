"""What an erasure names: entities and the pointers in them, checked and merged per entity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from atlas.exceptions import ValidationFailed
from changesets.redaction import MSG_POINTER, parse_pointer
from changesets.services.apply import check_op_limit
from entities.store import EntityKey

MSG_REASON = "Say why (at most 2000 characters)."


@dataclass(frozen=True)
class EraseTarget:
    key: EntityKey
    pointers: tuple[str, ...]


def _checked(targets: Sequence[EraseTarget], reason: str) -> list[EraseTarget]:
    errors = []
    if not reason.strip() or len(reason) > 2000:
        errors.append({"pointer": "/reason", "detail": MSG_REASON})
    if not targets:
        errors.append({"pointer": "/targets", "detail": "Name at least one entity."})
    for i, target in enumerate(targets):
        if not target.pointers:
            errors.append({"pointer": f"/targets/{i}/pointers", "detail": MSG_POINTER})
        for j, pointer in enumerate(target.pointers):
            try:
                parse_pointer(pointer)
            except ValueError:
                errors.append({"pointer": f"/targets/{i}/pointers/{j}", "detail": MSG_POINTER})
    if errors:
        raise ValidationFailed(errors[0]["detail"], pointer=errors[0]["pointer"], errors=errors)
    check_op_limit(len(targets), what="An erasure")
    merged: dict[EntityKey, list[str]] = {}
    for target in targets:
        merged.setdefault(target.key, [])
        merged[target.key] += [p for p in target.pointers if p not in merged[target.key]]
    return [EraseTarget(k, tuple(p)) for k, p in merged.items()]
