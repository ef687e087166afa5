"""Byte-identical JSON comparison, with no Django in sight.

Pure so that the pointer rule (:mod:`changesets.pointers`) and the three-way
merge (:mod:`changesets.merge3`) can use it without importing the store;
:mod:`changesets.ops` re-exports both names for the write path.
"""

from __future__ import annotations

import json
from typing import Any


def canonical(content: Any) -> str:
    """A byte-stable encoding: equal strings mean byte-identical JSON values.

    Python's ``==`` would call ``1`` and ``true`` equal; JSON does not.
    """
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_content(a: Any, b: Any) -> bool:
    """Byte-identical JSON values.

    ``==`` first: it is cheap, and values it calls different encode differently
    (JSON object keys are strings). It calls ``1``, ``1.0`` and ``true`` equal,
    so only when it says equal are the canonical forms compared.
    """
    return a == b and canonical(a) == canonical(b)
