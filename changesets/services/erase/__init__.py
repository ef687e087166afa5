"""Erasure: the one sanctioned rewrite of the log (DESIGN invariant 7, API.md "Erasure").

Every value at the given pointers of the given entities is replaced by
``"[erased]"`` wherever Atlas holds it or will send it: the current content
(an ``EraseEntity`` changeset on baseline and on each open branch whose
overlay holds it), every revision image on every branch (so the feed,
webhook bodies, parked deliveries, history, exports and the admin, all built
from revisions, carry no copy), stored idempotent responses and stored error
texts. The chain still verifies (``changesets.chain``: the erased member's
digest is kept, its salt destroyed). The erasure is recorded, with its
pointers and never its values, in a chain of its own.

Where it lives: ``service`` (``entities_erase``: who may, the ``EraseEntity``
changesets, the order of the steps, under one transaction), ``targets`` (what
an erasure names, checked), ``revisions`` (step 4: every revision of the
targets on every branch), ``copies`` (step 5: stored responses and error
texts) and ``record`` (step 6: the erasure row in its own chain).
"""

from __future__ import annotations

from changesets.redaction import MSG_POINTER, parse_pointer
from changesets.services.erase.service import (
    EraseResult,
    OverlayFinder,
    entities_erase,
    register_overlay_finder,
)
from changesets.services.erase.targets import MSG_REASON, EraseTarget

__all__ = [
    "MSG_POINTER",
    "MSG_REASON",
    "EraseResult",
    "EraseTarget",
    "OverlayFinder",
    "entities_erase",
    "parse_pointer",
    "register_overlay_finder",
]
