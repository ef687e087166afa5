"""What one webhook delivery holds: whole changesets, or one part of one.

A delivery never exceeds ``ATLAS_WEBHOOK_PAGE_SIZE`` records or
``ATLAS_WEBHOOK_MAX_BODY_BYTES`` bytes; a changeset too big for one goes in
parts, each with a stable delivery id, so a redelivery keeps its id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from atlas import conf
from changesets.models import Subscription
from changesets.selectors import feed

_DELIVERY_NAMESPACE = uuid.UUID("5f0c8a8e-6a53-4c3e-9b1e-2f7b8f0e7a11")


def delivery_id(subscription: Subscription, page: feed.FeedPage) -> str:
    """Stable for the same page of the same subscription: a redelivery keeps its id."""
    scope = f"{subscription.id}:{page.after_seq}:{page.last_seq}:{page.capture}:"
    scope += ",".join(subscription.namespaces)
    return str(uuid.uuid5(_DELIVERY_NAMESPACE, scope))


def part_delivery_id(
    subscription: Subscription, *, seq: int, offset: int, part: int, parts: int, capture: str
) -> str:
    """Stable for the same part of the same changeset: each part has its own id."""
    scope = f"{subscription.id}:part:{seq}:{offset}:{part}/{parts}:{capture}:"
    scope += ",".join(subscription.namespaces)
    return str(uuid.uuid5(_DELIVERY_NAMESPACE, scope))


def _encode(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def page_body(
    subscription: Subscription,
    page: feed.FeedPage,
    delivery: str,
    *,
    part: int | None = None,
    parts: int | None = None,
) -> bytes:
    """The delivered document: a feed page, plus which subscription and delivery it is
    (and, for a changeset delivered in parts, which ``part`` of how many ``parts``)."""
    document: dict[str, Any] = {"subscription_id": str(subscription.id), "delivery_id": delivery}
    document.update(page.as_dict())
    if part is not None:
        document["part"] = part
        document["parts"] = parts
    return _encode(document)


@dataclass
class Outgoing:
    """One delivery: whole changesets, or one part of one changeset.

    ``seq`` is its first changeset (the one a parked delivery names);
    ``cursor_after`` is where a 2xx moves the cursor (unchanged for a part
    that is not the last). ``oversize`` says why it cannot be sent at all.
    """

    seq: int
    cursor_after: int
    records: int
    changesets: int
    delivery: str = ""
    body: bytes = b""
    part: int | None = None
    parts: int | None = None
    offset: int = 0
    oversize: str = ""

    @property
    def last_part(self) -> bool:
        return self.part is None or self.part == self.parts


@dataclass
class _Changeset:
    seq: int
    records: list[dict[str, Any]]
    sizes: list[int]


def _changesets(page: feed.FeedPage) -> list[_Changeset]:
    groups: list[_Changeset] = []
    for record in page.records:
        if not groups or groups[-1].seq != record["seq"]:
            groups.append(_Changeset(record["seq"], [], []))
        groups[-1].records.append(record)
        groups[-1].sizes.append(len(_encode(record)))
    return groups


def _body_size(overhead: int, sizes: Sequence[int]) -> int:
    # The document with an empty record list, plus the records and the commas between them.
    return overhead + sum(sizes) + max(len(sizes) - 1, 0)


def _envelope_size(subscription: Subscription, page: feed.FeedPage, **part: int) -> int:
    return len(page_body(subscription, page, str(uuid.UUID(int=0)), **part))


def _subpage(
    page: feed.FeedPage, records: list[dict[str, Any]], cursor_after: int
) -> feed.FeedPage:
    return feed.FeedPage(
        records=records,
        after_seq=page.after_seq,
        last_seq=cursor_after,
        capture=page.capture,
        watermark=page.watermark,
    )


def plan_delivery(subscription: Subscription, page: feed.FeedPage) -> Outgoing:
    """Choose what the next delivery holds, within the record and byte bounds.

    1. A changeset already half delivered in parts (``part_seq`` is the next
       changeset): its next part.
    2. Otherwise as many whole changesets from the page as fit in
       ``ATLAS_WEBHOOK_PAGE_SIZE`` records and ``ATLAS_WEBHOOK_MAX_BODY_BYTES``
       bytes (only one while the subscription is isolating a failure).
    3. If not even the first fits, it goes in parts: step 1 from its first record.
    """
    groups = _changesets(page)
    first = groups[0]
    if subscription.part_seq == first.seq and subscription.part_offset < len(first.records):
        return _plan_part(
            subscription, page, first, offset=subscription.part_offset, done=subscription.parts_done
        )
    max_records = int(conf.get("ATLAS_WEBHOOK_PAGE_SIZE"))
    max_bytes = int(conf.get("ATLAS_WEBHOOK_MAX_BODY_BYTES"))
    room = 1 if subscription.cursor_seq < subscription.narrow_through_seq else len(groups)
    records: list[dict[str, Any]] = []
    sizes: list[int] = []
    taken = 0
    for group in groups[:room]:
        candidate = sizes + group.sizes
        overhead = _envelope_size(subscription, _subpage(page, [], group.seq))
        if len(candidate) > max_records or _body_size(overhead, candidate) > max_bytes:
            break
        records += group.records
        sizes = candidate
        taken += 1
    if not taken:
        return _plan_part(subscription, page, first, offset=0, done=0)
    cursor_after = groups[taken - 1].seq
    subpage = _subpage(page, records, cursor_after)
    delivery = delivery_id(subscription, subpage)
    return Outgoing(
        seq=first.seq,
        cursor_after=cursor_after,
        records=len(records),
        changesets=taken,
        delivery=delivery,
        body=page_body(subscription, subpage, delivery),
    )


def _split(sizes: Sequence[int], *, overhead: int) -> list[tuple[int, int]]:
    """Greedy ``(start, end)`` runs of records, each within both bounds.

    Greedy from a given record is the tail of greedy from any earlier part
    boundary, so re-splitting what is left after a delivered part gives the
    same remaining parts (as long as the records did not change).
    A record that alone exceeds the byte bound is a run of its own.
    """
    max_records = int(conf.get("ATLAS_WEBHOOK_PAGE_SIZE"))
    max_bytes = int(conf.get("ATLAS_WEBHOOK_MAX_BODY_BYTES"))
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(sizes):
        end, total = start + 1, overhead + sizes[start]
        while (
            end < len(sizes)
            and end - start < max_records
            and total + 1 + sizes[end] <= max_bytes  # 1: the comma before it
        ):
            total += 1 + sizes[end]
            end += 1
        runs.append((start, end))
        start = end
    return runs


def _plan_part(
    subscription: Subscription, page: feed.FeedPage, group: _Changeset, *, offset: int, done: int
) -> Outgoing:
    # An upper bound of the envelope: the final cursor is the longest, and part
    # numbers never reach 10 digits.
    overhead = _envelope_size(subscription, _subpage(page, [], group.seq), part=10**9, parts=10**9)
    runs = _split(group.sizes[offset:], overhead=overhead)
    part, parts = done + 1, done + len(runs)
    start, end = runs[0]
    records = group.records[offset + start : offset + end]
    cursor_after = group.seq if part == parts else page.after_seq
    out = Outgoing(
        seq=group.seq,
        cursor_after=cursor_after,
        records=len(records),
        changesets=1,
        part=part,
        parts=parts,
        offset=offset,
    )
    size = _body_size(overhead, group.sizes[offset + start : offset + end])
    if size > int(conf.get("ATLAS_WEBHOOK_MAX_BODY_BYTES")):
        record = records[0]
        out.oversize = (
            f"record {record['event_id']} alone makes a {size}-byte delivery, over "
            f"ATLAS_WEBHOOK_MAX_BODY_BYTES ({conf.get('ATLAS_WEBHOOK_MAX_BODY_BYTES')}); "
            "raise the limit and retry, or skip it"
        )
        return out
    out.delivery = part_delivery_id(
        subscription, seq=group.seq, offset=offset, part=part, parts=parts, capture=page.capture
    )
    subpage = _subpage(page, records, cursor_after)
    out.body = page_body(subscription, subpage, out.delivery, part=part, parts=parts)
    return out
