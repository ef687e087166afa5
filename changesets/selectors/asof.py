"""As-of reads: the baseline store as it stood right after a changeset.

Because every write is recorded (invariant 1), the state at changeset X is,
per key, the ``after`` of the newest baseline revision with ``seq <= X.seq``.
It is read with index seeks, never by replaying history, so its cost does not
depend on how far back X is:

1. Walk the keys that were ever created, in key order, off the partial index
   ``revision_creates`` (one row per key life), taking per key the newest
   create at or before X: that is the start of the life current at X, and its
   time (``Revision.at``, the changeset's) is the entity's ``created_at``.
2. For each such key, seek its newest revision at or before X on
   ``revision_key`` (a hash of branch and key, then seq: migration 0041). A
   delete there means the key was absent at X.
3. Walk in batches of the page size (plus slack) until the page is full;
   each further batch is four times larger, so a long run of keys deleted at
   X costs a few round trips, never a scan of everything. (A single statement
   with the LIMIT outside the walk lets the planner join every key first and
   sort afterwards: ten times slower on the benchmark.)

After an archive cut at C, the revisions read are the hot ones after C beside
the state at C (``changesets.archive.boundary.revision_source``): for X after
C that is every row steps 1 and 2 need, so the answer is the one the full log
gave. X at or before C is archived (410).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from atlas.exceptions import BadRequest, NotFound
from atlas.replicas import read_connection
from changesets import keyhash, partitions
from changesets.archive import boundary
from changesets.models import BASELINE, Changeset
from changesets.selectors import changeset_ids
from changesets.selectors.bounds import resolve, seq_upto
from changesets.selectors.log import visible_changesets
from changesets.selectors.rows import from_micros
from entities.store import EntityKey, StoredEntity, entity_filters, load_json

# The key's hash as ``revision_key`` indexes it (migration 0041): the planner
# matches the expression, so it must be spelled the same way here.
KEY_HASH = keyhash.key_hash("{t}")

# One batch of the key walk: ``batch`` keys created at or before X, in key
# order, each with its newest revision at or before X (``after`` null: the key
# was deleted at X). The LIMIT sits on the walk itself, so the cost follows
# the batch, not the number of keys or the depth of history.
#
# The seek ``h`` runs on ``revision_key`` (hash of branch and key, then seq) and
# compares the real key as well, so a key with the same hash costs a row read
# and dropped, never a wrong answer. Times come from the revisions themselves
# (``Revision.at``): no changeset probes. They travel as epoch microseconds
# (``changesets.selectors.rows.from_micros`` says why).


def _as_of_sql(key_hash: str) -> str:
    """The as-of statement with ``key_hash`` (a template over table alias ``{t}``)."""
    return (
        _AS_OF_TEMPLATE.replace("{r_hash}", key_hash.format(t="r"))
        .replace("{c_hash}", key_hash.format(t="c"))
        .replace("{same_key}", keyhash.same_key("r", "c"))
    )


_AS_OF_TEMPLATE = """
SELECT c.namespace, c.kind, c.slug, h.after, h.after_version,
       (extract(epoch from c.at) * 1000000)::int8,
       (extract(epoch from h.at) * 1000000)::int8,
       h.changeset_id
FROM (
    SELECT DISTINCT ON (namespace, kind, slug) branch, namespace, kind, slug, at
    FROM {source} AS changesets_revision
    WHERE branch = '' AND op = 'create' AND seq <= %s AND {where}{live:changesets_revision}
    ORDER BY namespace, kind, slug, seq DESC
    LIMIT %s
) c
CROSS JOIN LATERAL (
    SELECT r.after, r.after_version, r.at, r.changeset_id
    FROM {source} r
    WHERE {r_hash} = {c_hash} AND {same_key} AND r.seq <= %s{live:r}
    ORDER BY r.seq DESC
    LIMIT 1
) h
ORDER BY c.namespace, c.kind, c.slug
"""
_AS_OF_SQL = _as_of_sql(KEY_HASH)


def _statement(where: str, seq: int) -> str:
    """The as-of statement for ``where``, over the revisions a read at ``seq`` sees."""
    cut = boundary.current()
    if cut is not None and seq <= cut.seq:
        raise boundary.gone("That point of the log is archived.", cut=cut, seq=seq)
    return boundary.sourced(_AS_OF_SQL, cut).format(where=where)


# Extra keys per batch, so a few keys deleted at X rarely cost a second round trip.
_SLACK = 32


def as_of_changeset(*, changeset_id: str, namespaces: Sequence[str] | None) -> Changeset | None:
    """The changeset named by ``as_of`` if the caller can see it, else None (404)."""
    return changeset_ids.find(visible_changesets(namespaces), changeset_id)


# ``as_of_time`` for a caller who reads only some namespaces, in one statement:
# ``b`` is the time's seq boundary (``atlas_seq_bound``, a bisection of seq:
# ``changesets.selectors.bounds.seq_upto``); the answer is the highest of, for each
# of her namespaces, its newest baseline changeset at or below it, each one
# backward seek on the namespace's position index (``changeset_ns1_seq``,
# ``changeset_ns2_seq``, migration 0037), and the newest wide batch (three
# namespaces or more, ``changeset_ns3_more``) she can see there. A namespace
# absent near the time costs the same seek as a busy one: before 0037 the
# statement read a window of the log before the boundary and then a GIN
# bitmap of every changeset of hers, which grew with the log (issue 18).
# The position indexes are keyed by the name's hash
# (``changesets.models.namespace_key``), rechecked by name. Each namespace is
# its own arm with its name as a literal, so the planner judges each by its
# own statistics (with one arm over ``unnest`` it took the
# seq index for a rare one too, and walked it). ``seq + 0`` keeps the wide arm
# on its bitmap (few rows) rather than a walk of the seq index
# (``changesets.selectors.by_namespace`` says why).
#
# The changeset table is partitioned by seq (migration 0038): with the boundary
# computed inside the statement, every arm was planned over every partition
# (8.6 ms of planning at 13 partitions, for a 1 ms answer). So the boundary is
# read first, and the arms run one partition at a time from the boundary's
# down (``seq`` between literals, so the planner prunes to that partition),
# until one finds a changeset: almost always the first.
_AS_OF_TIME_SCOPED = """
SELECT * FROM changesets_changeset WHERE seq BETWEEN %(low)s AND %(high)s
  AND seq = (SELECT max(found) FROM ({arms}) arms(found))
"""
_AS_OF_ARM = """
(SELECT seq FROM changesets_changeset
 WHERE hashtextextended(namespaces[{position}], 0) = hashtextextended(%({name})s, 0)
   AND namespaces[{position}] = %({name})s
   AND branch = '' AND seq BETWEEN %(low)s AND %(high)s ORDER BY seq DESC LIMIT 1)
"""
_AS_OF_WIDE_ARM = """
(SELECT seq FROM changesets_changeset WHERE namespaces[3] IS NOT NULL
   AND namespaces && %(ns)s::varchar(200)[] AND branch = ''
   AND seq BETWEEN %(low)s AND %(high)s AND seq + 0 <= %(high)s
 ORDER BY seq + 0 DESC LIMIT 1)
"""


def _ranges_down(bound: int) -> list[tuple[int, int]]:
    """The seq ranges to look in, newest first: the boundary's partition (cut at
    the boundary), then each one below it; one range when not partitioned."""
    parts = [p for p in partitions.partitions(parent=partitions.CHANGESETS) if p.lower <= bound]
    if not parts:
        return [(0, bound)]
    return [(p.lower, min(p.last_seq, bound)) for p in reversed(parts)]


def as_of_time(*, at: datetime, namespaces: Sequence[str] | None) -> Changeset | None:
    """The newest baseline changeset at or before ``at`` that the caller can see.

    Changesets the caller cannot see touched only namespaces they cannot read,
    so the state they see right after this one is the state at ``at``.

    Times compare at milliseconds, the precision responses show: ``at`` names
    its whole millisecond, so a changeset's displayed ``at`` includes it even
    when an older row stored microseconds (new rows store milliseconds:
    ``changesets.services.log_statement.log_clock``). Ties within a millisecond go to the
    highest seq.

    A seek, not a walk: ``at`` never runs backwards in seq order, so the time
    becomes a seq boundary (:func:`~changesets.selectors.bounds.seq_upto`) and the
    answer is the newest visible baseline changeset at or below it.
    """
    if namespaces is None:
        newest = Changeset.objects.filter(branch=BASELINE, seq__lte=seq_upto(at))
        return newest.order_by("-seq").first()
    if not namespaces:
        return None
    resolved = resolve(since=None, until=at)
    if resolved is None:  # nothing is that old
        return None
    bound = resolved["lte"]
    params: dict[str, Any] = {"ns": list(namespaces)}
    arms = [_AS_OF_WIDE_ARM]
    for i, name in enumerate(namespaces):
        params[f"n{i}"] = name
        arms += [_AS_OF_ARM.format(position=p, name=f"n{i}") for p in (1, 2)]
    sql = _AS_OF_TIME_SCOPED.format(arms=" UNION ALL ".join(arms))
    for low, high in _ranges_down(int(bound)):
        found = next(iter(Changeset.objects.raw(sql, {**params, "low": low, "high": high})), None)
        if found is not None:
            return found
    return None


# The branch header, named here as the pointer of the error (selectors know no HTTP).
BRANCH_POINTER = "/headers/X-Atlas-Branch"


def as_of_resolve(
    *,
    branch: str,
    namespaces: Sequence[str] | None,
    changeset_id: str | None = None,
    at: datetime | None = None,
    name: str = "as_of",
) -> Changeset:
    """The changeset an as-of read is pinned to, by id or by time (give one).

    1. As-of reads are baseline only: under a branch, 400.
    2. By id: the changeset must be visible to the caller (else 404, not
       visible = not found) and a baseline one (400: a branch changeset is
       no point in baseline's history).
    3. By time: the newest visible baseline changeset at or before ``at``
       (:func:`as_of_time`); none → 404.
    4. After an archive cut: a changeset at or before it, an unknown id that
       may be archived, or a time whose point is at or before it → 410
       (``changesets.archive.boundary``).

    ``name`` is the query parameter the errors point at (``/as_of``,
    ``/as_of_time``; a diff's ``/from``, ``/to_time``).
    """
    if branch:
        raise BadRequest(
            "As-of reads are baseline only; drop the branch header.", pointer=BRANCH_POINTER
        )
    if changeset_id is not None:
        changeset = as_of_changeset(changeset_id=changeset_id, namespaces=namespaces)
        if changeset is None:
            boundary.check_unknown_changeset(changeset_id, pointer=f"/{name}")
            raise NotFound("No such changeset.", pointer=f"/{name}")
        if changeset.branch:
            raise BadRequest(
                "As-of reads are baseline only; that changeset landed on a branch.",
                pointer=f"/{name}",
            )
        boundary.check_seq(changeset.seq, "That changeset is archived.", pointer=f"/{name}")
        return changeset
    if at is None:
        raise TypeError("as_of_resolve needs changeset_id or at")
    changeset = as_of_time(at=at, namespaces=namespaces)
    cut = boundary.current()
    if cut is not None and (changeset is None or changeset.seq <= cut.seq):
        # The point that time names lies at or before the cut (or before the log the
        # caller can see began): archived, whether or not a hot changeset is older.
        raise boundary.gone(
            "That time resolves to a point at or before the archive cut.",
            cut=cut,
            pointer=f"/{name}_time",
        )
    if changeset is None:
        raise NotFound("No changeset at or before that time.", pointer=f"/{name}_time")
    return changeset


def entities_as_of(
    *,
    seq: int,
    namespaces: Sequence[str] | None,
    namespace: str | None = None,
    kind: str | None = None,
    slug_prefix: str | None = None,
    after: EntityKey | None = None,
    limit: int = 50,
) -> list[StoredEntity]:
    """One keyset page of the baseline as it stood right after changeset ``seq``."""
    out: list[StoredEntity] = []
    batch = limit + _SLACK
    while True:
        where, params = entity_filters(
            "namespace",
            "kind",
            "slug",
            namespaces=namespaces,
            namespace=namespace,
            kind=kind,
            slug_prefix=slug_prefix,
            after=after,
        )
        with read_connection().cursor() as cursor:
            cursor.execute(_statement(where, seq), [seq, *params, batch, seq])
            rows = cursor.fetchall()
        out.extend(_entity(row) for row in rows if row[3] is not None)
        if len(out) >= limit or len(rows) < batch:
            return out[:limit]
        after = EntityKey(rows[-1][0], rows[-1][1], rows[-1][2])
        batch *= 4  # a run of deleted keys costs O(log n) round trips


def entity_as_of(*, seq: int, key: EntityKey) -> StoredEntity | None:
    """One entity as it stood right after changeset ``seq`` (None if absent then)."""
    sql = _statement("namespace = %s AND kind = %s AND slug = %s", seq)
    with read_connection().cursor() as cursor:
        cursor.execute(sql, [seq, key.namespace, key.kind, key.slug, 1, seq])
        row = cursor.fetchone()
    return _entity(row) if row and row[3] is not None else None


def _entity(row: Sequence[Any]) -> StoredEntity:
    """A row of the as-of statement (times as epoch microseconds) as an entity."""
    return StoredEntity(
        key=EntityKey(row[0], row[1], row[2]),
        content=load_json(row[3]),
        version=row[4],
        created_at=from_micros(row[5]),
        updated_at=from_micros(row[6]),
        changeset_id=row[7],
    )
