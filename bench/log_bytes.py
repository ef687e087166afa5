"""Where the bytes of a write go: the log's rows, column by column, and each index's share.

    .venv/bin/python bench/log_bytes.py [--smoke] [--writes 20000] [--keys 2000]
        [--batches 5] [--doc PATH] [--json PATH]

Issue 16 asks for the log's bytes per single-entity write (changeset + revision
+ journal entry + their index share) at most twice the smallest peer's;
``bench/writes_vs_peers.py`` (part 7) gives the totals beside the peers. This
script says which column and which index each byte is in, so a change to the
schema can be weighed before it is made:

1. A fresh database (``atlas_bench_bytes``) gets ``--writes`` single-entity
   updates through the write service, spread over ``--keys`` keys, of the
   documents ``writes_vs_peers`` writes (about 150 bytes of JSON, one member
   changing), then the same count of a 2 KB document with one member changing
   (where the before image's share shows), then ``--batches`` batches of
   1,000 ops (revision bytes per batch op).
2. The journal is published as the relay would publish it (``journal.publish``),
   then ``VACUUM ANALYZE``, so what is measured is what stays.
3. Per table: rows, ``avg(pg_column_size(row))``, each column's average, and
   each index's bytes per row (``pg_relation_size``, summed over the
   partitions of a partitioned index, divided by the table's rows).

Writes its section of docs/benchmarks.md (``--doc``/``ATLAS_BENCH_DOC``).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import fresh_database, setup, write_section

TITLE = "Where a write's bytes go (issue 16, item 6)"
DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_bytes"
TABLES = ("changesets_changeset", "changesets_revision", "changesets_journalentry")
SMALL, LARGE, BATCH = "bench.small", "bench.large", "bench.batch"


def small(n: int) -> dict[str, Any]:
    """``bench/writes_vs_peers.py``'s document."""
    return {"n": n, "payload": "x" * 100, "tags": ["alpha", "beta"], "ok": True}


def large(n: int) -> dict[str, Any]:
    """About 2 KB: twenty members of 88 characters that never change, and ``n``.

    The texts are digests (as incompressible as real prose or ids are to pglz), so a
    row over the TOAST threshold is not shrunk by compression the way a run of one
    letter would be.
    """
    return {"n": n, **{f"field_{i:02d}": _text(i) for i in range(20)}}


def _text(i: int) -> str:
    import base64
    import hashlib

    return base64.b64encode(hashlib.sha512(str(i).encode()).digest())[:88].decode()


def _write(args: argparse.Namespace) -> dict[str, float]:
    from django.contrib.auth import get_user_model

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline

    root = get_user_model().objects.create_superuser("bytes-root", password=None)
    for name in (SMALL, LARGE, BATCH):
        Namespace.objects.get_or_create(name=name)
    seconds: dict[str, float] = {}
    for namespace, make in ((SMALL, small), (LARGE, large)):
        started = time.monotonic()
        for i in range(args.writes):
            key = EntityKey(namespace, "item", f"k{i % args.keys:05d}")
            changeset_apply(
                store=baseline, actor=root, rpc=Rpc.PUT_ENTITY, ops=[PutOp(key, make(i))]
            )
            if i % 5000 == 4999:
                print(f"  {namespace}: {i + 1:,} writes", flush=True)
        seconds[namespace] = time.monotonic() - started
    started = time.monotonic()
    for b in range(args.batches):
        ops = [PutOp(EntityKey(BATCH, "item", f"k{i:05d}"), small(b)) for i in range(1000)]
        changeset_apply(store=baseline, actor=root, rpc=Rpc.BATCH_MUTATE, ops=ops)
    seconds[BATCH] = time.monotonic() - started
    return seconds


def _publish() -> int:
    from changesets.models import JournalEntry
    from changesets.outbox import journal

    ids = list(
        JournalEntry.objects.filter(phase="committed").values_list("changeset_id", flat=True)
    )
    for start in range(0, len(ids), 500):
        journal.publish(ids[start : start + 500])
    return len(ids)


def _columns(cursor: Any, relation: str, where: str) -> list[tuple[str, float]]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
        " ORDER BY ordinal_position",
        [relation],
    )
    names = [row[0] for row in cursor.fetchall()]
    sums = ", ".join(f'avg(coalesce(pg_column_size("{n}"), 0))::float' for n in names)
    cursor.execute(f"SELECT {sums} FROM {relation} WHERE {where}")
    return list(zip(names, cursor.fetchone(), strict=True))


def _indexes(cursor: Any, relation: str) -> list[tuple[str, int]]:
    """Each index of ``relation`` and its bytes, summed over a partitioned one's partitions."""
    cursor.execute(
        "SELECT i.indexrelid::regclass::text,"
        # A plain index is not in a partition tree of its own: its own size then.
        " GREATEST(pg_relation_size(i.indexrelid), (SELECT coalesce(sum(pg_relation_size("
        " p.relid)), 0) FROM pg_partition_tree(i.indexrelid) p))::bigint"
        " FROM pg_index i WHERE i.indrelid = %s::regclass ORDER BY 2 DESC",
        [relation],
    )
    return [(name, int(size)) for name, size in cursor.fetchall()]


def _measure() -> dict[str, Any]:
    from django.db import connection

    out: dict[str, Any] = {}
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cases = {
            "changeset, single write": ("changesets_changeset", "op_count = 1"),
            "revision, 150 B document": ("changesets_revision", f"namespace = '{SMALL}'"),
            "revision, 2 KB document": ("changesets_revision", f"namespace = '{LARGE}'"),
            "revision, batch op": ("changesets_revision", f"namespace = '{BATCH}'"),
            "journal entry": ("changesets_journalentry", "TRUE"),
        }
        for what, (relation, where) in cases.items():
            cursor.execute(
                f"SELECT count(*), coalesce(avg(pg_column_size(t.*)), 0)::float"
                f" FROM {relation} t WHERE {where}"
            )
            rows, row_bytes = cursor.fetchone()
            out[what] = {"table": relation, "rows": rows, "row": row_bytes}
            out[what]["columns"] = _columns(cursor, relation, where) if rows else []
        for relation in TABLES:
            cursor.execute(f"SELECT count(*) FROM {relation}")
            total_rows = cursor.fetchone()[0]
            out[relation] = {
                "rows": total_rows,
                "indexes": [
                    (name, size / max(total_rows, 1)) for name, size in _indexes(cursor, relation)
                ],
            }
    return out


# What ``atlas.api.provenance.request_context`` records for a write over HTTP, with the
# user agent of an API client and of a browser; these service writes store the
# system context instead.
USER_AGENTS = {
    "an API client (python-httpx)": "python-httpx/0.28.1",
    "a browser": (
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)"
        " Chrome/131.0 Safari/537.36"
    ),
}


def http_context(user_agent: str) -> dict[str, Any]:
    """What ``request_context`` records for a token-authenticated PUT from
    ``user_agent`` (a new request id each call)."""
    from django.test import RequestFactory

    from atlas.api.provenance import request_context
    from atlas.models import ApiToken

    request = RequestFactory().put(
        "/api/v1/entities/bench/item/k", HTTP_USER_AGENT=user_agent, REMOTE_ADDR="203.0.113.7"
    )
    request.auth = ApiToken(pk=1234)  # what token authentication leaves on a request
    return request_context(request)


def _contexts() -> dict[str, float]:
    """The stored size of each context, as ``pg_column_size`` of its jsonb; an HTTP
    write's as ``request_context`` builds it for a token-authenticated PUT."""
    from django.db import connection

    from changesets import provenance

    shapes: dict[str, dict[str, Any]] = {"a service write (these)": provenance.stored_context(None)}
    for who, agent in USER_AGENTS.items():
        shapes[f"an HTTP write from {who}"] = http_context(agent)
    out = {}
    with connection.cursor() as cursor:
        for what, context in shapes.items():
            cursor.execute("SELECT pg_column_size(%s::jsonb)", [provenance.as_text(context)])
            out[what] = float(cursor.fetchone()[0])
    return out


def _per_write(m: dict[str, Any], revision: str) -> dict[str, float]:
    """A single-entity write's bytes: its changeset, its revision, a journal entry kept."""
    parts = {
        "changeset": ("changeset, single write", "changesets_changeset"),
        "revision": (revision, "changesets_revision"),
        "journal": ("journal entry", "changesets_journalentry"),
    }
    out = {}
    for name, (case, relation) in parts.items():
        rows = m[case]["rows"]
        # A journal that keeps nothing once published costs nothing per write.
        share = rows / max(m["changeset, single write"]["rows"], 1) if name == "journal" else 1.0
        index = sum(size for _, size in m[relation]["indexes"]) if rows else 0.0
        out[name] = share * (m[case]["row"] + index)
    out["total"] = sum(out.values())
    return out


def _report(args: argparse.Namespace, m: dict[str, Any], seconds: dict[str, float]) -> str:
    lines = [header("bench/log_bytes.py" + (" --smoke" if args.smoke else "")), ""]
    lines.append(
        f"{args.writes:,} single-entity updates over {args.keys:,} keys per document size, then"
        f" {args.batches} batches of 1,000 ops, through the write service; the journal published"
        " as the relay publishes it, then `VACUUM ANALYZE`. Row bytes are"
        " `avg(pg_column_size(row))`; an index's bytes per row are its size (over every"
        " partition) divided by all the table's rows."
    )
    lines.append("")
    rows = []
    for label, revision in (
        ("150 B document", "revision, 150 B document"),
        ("2 KB document", "revision, 2 KB document"),
    ):
        per = _per_write(m, revision)
        rows.append(
            [
                label,
                f"{per['changeset']:,.0f}",
                f"{per['revision']:,.0f}",
                f"{per['journal']:,.0f}",
                f"**{per['total']:,.0f}**",
            ]
        )
    lines.append("Bytes per single-entity write (rows + index share):")
    lines.append("")
    lines.append(table(["document", "changeset", "revision", "journal", "total"], rows))
    lines.append("")
    batch = m["revision, batch op"]
    index = sum(size for _, size in m["changesets_revision"]["indexes"])
    lines.append(
        f"A batch op's revision: {batch['row']:,.0f} B row + {index:,.0f} B of indexes."
        f" Writing took {seconds[SMALL]:.0f} s and {seconds[LARGE]:.0f} s for the two sizes."
    )
    contexts = m.get("contexts", {})
    if contexts:
        single = _per_write(m, "revision, 150 B document")["total"]
        system = contexts["a service write (these)"]
        rows = [
            [what, f"{size:.0f}", f"{single - system + size:,.0f}"]
            for what, size in contexts.items()
        ]
        lines += [
            "",
            "The changeset's `context` (provenance) depends on the caller: these writes go"
            " through the service and store the system's. A write over HTTP stores its"
            " request's (request id, client IP, user agent, auth kind, token id), so it costs"
            " the difference more (150 B document; `pg_column_size` of each context as a value,"
            " about 3 B over what a row stores of it):",
            "",
            table(["context of", "context bytes", "bytes per single write"], rows),
        ]
    for case in (
        "changeset, single write",
        "revision, 150 B document",
        "revision, 2 KB document",
        "journal entry",
    ):
        entry = m[case]
        lines += [
            "",
            f"**{case}** ({entry['rows']:,} rows, {entry['row']:.0f} B a row on average):",
            "",
        ]
        cols = [[name, f"{size:.1f}"] for name, size in entry["columns"] if size]
        lines.append(table(["column", "bytes"], cols) if cols else "(no rows kept)")
    for relation in TABLES:
        if not m[relation]["rows"]:  # (sizes are then the bytes left, not bytes per row)
            left = sum(size for _, size in m[relation]["indexes"])
            lines += ["", f"**{relation} indexes**: the table holds no rows; its indexes"
                      f" keep {left / 1024:,.0f} KiB of pages for the next ones."]  # fmt: skip
            continue
        lines += ["", f"**{relation} indexes** (bytes per row of the table):", ""]
        idx = [[name, f"{size:.1f}"] for name, size in m[relation]["indexes"]]
        lines.append(table(["index", "bytes"], idx) if idx else "(none)")
    return "\n".join(lines)


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000)
    parser.add_argument("--batches", type=int, default=5)
    args = parse_part_args(parser)
    if args.smoke:
        args.writes, args.keys, args.batches = 300, 30, 1
    bench_env()
    fresh_database(DB)
    setup(database=DB)
    seconds = _write(args)
    published = _publish()
    print(f"  published {published:,} journal entries", flush=True)
    measured = _measure()
    measured["contexts"] = _contexts()
    section = _report(args, measured, seconds)
    write_section(TITLE, section)
    print(section)
    write_json(args.json, {"measured": measured, "seconds": seconds})


if __name__ == "__main__":
    main()
