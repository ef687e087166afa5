"""What other layouts of the log would cost a single write, on the same rows (issue 16, item 6).

    .venv/bin/python bench/log_layouts.py [--smoke] [--writes 20000] [--keys 2000]
        [--doc PATH] [--json PATH]

``bench/log_bytes.py`` says where today's bytes go; this script weighs the
layouts that would move them before anyone builds one. Issue 16 asks for at
most twice the smallest peer's bytes per single-entity write, and each lever
left changes every read path, so its worth should be known first:

1. A fresh database (``<ATLAS_BENCH_DB or atlas_bench>_layouts``) gets
   ``--writes`` single-entity updates through the write service over ``--keys``
   keys of ``bench/writes_vs_peers.py``'s document, twice: with the system's
   provenance (a service write) and with what a token-authenticated HTTP
   request records (``atlas.api.provenance.request_context``: request id, IP,
   user agent, auth kind, token id). The journal is published, as the relay
   publishes it.
2. For each of the two, every layout is built as plain tables from those rows,
   inserted in seq order (the order the writes made them, so each index
   splits its pages as it did), with the indexes the layout needs, then
   ``VACUUM``. A layout's bytes per write are its tables' whole size (heap,
   indexes, TOAST) over the writes. The layouts, each on top of the one before:

   - ``today``: the changeset row and the revision row, with today's indexes
     (``LIKE … INCLUDING INDEXES`` of the log tables; since migration 0041 they
     include the hashed history this script weighed as a layout of its own:
     ``revision_key`` in place of ``revision_history`` and ``revision_asof``);
   - ``one row``: a single-entity changeset's columns on its revision row (the
     changeset's own indexes over the same columns; its seq index is the
     revision's seq-led unique one, and its id gets a unique index of its own);
   - ``no revision id``: without the revision's own id and primary key (a
     revision named by its seq and key, which ``revision_seq_entity`` already
     makes unique);
   - ``provenance as columns``: the request's context as typed columns (IP as
     ``inet``, auth kind as a small code, token id, request id as ``uuid``, the
     user agent as an id into a table of the agents seen), not a JSON object.

Partitioning is left out on both sides (plain tables hold what the partitions
would), so ``today`` here is near, not equal to, ``bench/log_bytes.py``'s figure
for the same writes (967 B against 927-957 B on 2026-12-07).
Writes its section of docs/benchmarks.md (``--doc``/``ATLAS_BENCH_DOC``).
"""

from __future__ import annotations

import os
import time

import log_bytes
from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import fresh_database, setup, write_section

TITLE = "Other layouts of the log, on the same rows (issue 16, item 6)"
DB = (os.environ.get("ATLAS_BENCH_DB") or "atlas_bench") + "_layouts"
CALLERS = {"service": "layouts.service", "http": "layouts.http"}

# Each layout as SQL over ``{ns}``'s rows: the tables it makes (named ``{p}_…``).
_TODAY = """
CREATE TABLE {p}_cs (LIKE changesets_changeset INCLUDING DEFAULTS INCLUDING INDEXES);
CREATE TABLE {p}_rev (LIKE changesets_revision INCLUDING DEFAULTS INCLUDING INDEXES);
INSERT INTO {p}_cs SELECT c.* FROM changesets_changeset c
  WHERE c.namespaces = ARRAY[%(ns)s]::varchar[] ORDER BY c.seq;
INSERT INTO {p}_rev SELECT * FROM changesets_revision WHERE namespace = %(ns)s ORDER BY seq, id;
"""
# The changeset's columns a single-entity changeset cannot derive from its revision
# (``namespaces`` is the revision's namespace, ``op_count`` 1, ``message`` and
# ``prev_hash`` are NULL today), and their indexes over the merged row.
_ONE_ROW = """
{agents}
CREATE TABLE {p}_one (LIKE changesets_revision INCLUDING DEFAULTS INCLUDING INDEXES);
ALTER TABLE {p}_one ADD COLUMN author_id int, ADD COLUMN author_name varchar(150) NOT NULL,
  ADD COLUMN comment text NOT NULL, ADD COLUMN rpc varchar(32) NOT NULL, ADD COLUMN hash bytea,
  ADD COLUMN metadata jsonb, ADD COLUMN context jsonb{columns};
CREATE INDEX ON {p}_one (author_name, seq);
CREATE INDEX ON {p}_one (hashtextextended(namespace, 0), seq);
CREATE INDEX ON {p}_one (rpc, seq) WHERE rpc NOT IN ('PutEntity', 'PatchEntity', 'BatchMutate');
CREATE INDEX ON {p}_one (branch, seq) WHERE branch <> '';
CREATE UNIQUE INDEX ON {p}_one (changeset_id);
{drop}
INSERT INTO {p}_one SELECT r.*, c.author_id, c.author_name, c.comment, c.rpc, c.hash,
  c.metadata, {context}
  FROM changesets_revision r JOIN changesets_changeset c USING (seq)
  WHERE r.namespace = %(ns)s ORDER BY r.seq, r.id;
"""
_NO_REVISION_ID = "ALTER TABLE {p}_one DROP CONSTRAINT {p}_one_pkey, ALTER COLUMN id DROP NOT NULL;"
# The context's members as typed columns; the user agent by id, into a table of the
# agents seen (counted with the layout).
_AGENTS = """
CREATE TABLE {p}_agent (id serial PRIMARY KEY, agent text UNIQUE NOT NULL);
INSERT INTO {p}_agent (agent) SELECT DISTINCT context->>'user_agent' FROM changesets_changeset
  WHERE namespaces = ARRAY[%(ns)s]::varchar[] AND context ? 'user_agent';
"""
_CONTEXT_COLUMNS = (
    ", ADD COLUMN ctx_ip inet, ADD COLUMN ctx_auth smallint, ADD COLUMN ctx_token int,"
    " ADD COLUMN ctx_request uuid, ADD COLUMN ctx_agent int"
)
_CONTEXT_VALUES = (
    "NULL, nullif(c.context->>'ip', '')::inet,"
    " CASE c.context->>'auth' WHEN 'token' THEN 1 WHEN 'session' THEN 2 ELSE 0 END,"
    " (c.context->>'token_id')::int, (c.context->>'request_id')::uuid,"
    " (SELECT a.id FROM {p}_agent a WHERE a.agent = c.context->>'user_agent')"
)


def _one_row(drop: str = "", *, columns: bool = False) -> str:
    return (
        _ONE_ROW.replace("{agents}", _AGENTS if columns else "")
        .replace("{columns}", _CONTEXT_COLUMNS if columns else "")
        .replace("{context}", _CONTEXT_VALUES if columns else "c.context")
        .replace("{drop}", drop)
    )


# A layout: its label, the SQL that makes it (from nothing), the tables it counts
# (first, the one with a row per write).
LAYOUTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("today", _TODAY, ("rev", "cs")),
    ("one row", _one_row(), ("one",)),
    ("no revision id", _one_row(_NO_REVISION_ID), ("one",)),
    (
        "provenance as columns",
        _one_row(_NO_REVISION_ID, columns=True),
        ("one", "agent"),
    ),
]


def _write(writes: int, keys: int) -> float:
    from django.contrib.auth import get_user_model

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline

    root = get_user_model().objects.create_superuser("layouts-root", password=None)
    agent = log_bytes.USER_AGENTS["an API client (python-httpx)"]
    started = time.monotonic()
    for caller, namespace in CALLERS.items():
        Namespace.objects.get_or_create(name=namespace)
        for i in range(writes):
            key = EntityKey(namespace, "item", f"k{i % keys:05d}")
            context = log_bytes.http_context(agent) if caller == "http" else None
            changeset_apply(
                store=baseline,
                actor=root,
                rpc=Rpc.PUT_ENTITY,
                ops=[PutOp(key, log_bytes.small(i))],
                context=context,
            )
            if i % 5000 == 4999:
                print(f"  {namespace}: {i + 1:,} writes", flush=True)
    return time.monotonic() - started


def _measure(writes: int) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, int]]]:
    """Bytes per write of each layout, for each caller; and the rows each layout's
    first table holds (every write's, or the layout lost some)."""
    from django.db import connection

    out: dict[str, dict[str, float]] = {}
    rows: dict[str, dict[str, int]] = {}
    with connection.cursor() as cursor:
        for caller, namespace in CALLERS.items():
            out[caller], rows[caller] = {}, {}
            for n, (label, sql, tables) in enumerate(LAYOUTS):
                prefix = f"l{n}_{caller}"
                cursor.execute(sql.replace("{p}", prefix), {"ns": namespace})
                names = [f"{prefix}_{t}" for t in tables]
                for name in names:
                    cursor.execute(f"VACUUM {name}")
                cursor.execute(
                    "SELECT " + " + ".join(["pg_total_relation_size(%s)"] * len(names)), names
                )
                out[caller][label] = cursor.fetchone()[0] / writes
                cursor.execute(f"SELECT count(*) FROM {names[0]}")
                rows[caller][label] = cursor.fetchone()[0]
                print(f"  {caller}: {label}: {out[caller][label]:,.0f} B a write", flush=True)
    return out, rows


def _report(writes: int, keys: int, seconds: float, m: dict[str, dict[str, float]]) -> str:
    lines = [header("bench/log_layouts.py" + (" --smoke" if writes < 1000 else "")), ""]
    lines.append(
        f"{writes:,} single-entity updates over {keys:,} keys through the write service, with"
        " the system's provenance and with an HTTP request's, then each layout built as plain"
        f" tables from those rows in seq order (the script's docstring); writing took"
        f" {seconds:.0f} s. Bytes per single-entity write: the layout's tables, whole, over the"
        " writes; each layout is the one above it and its change."
    )
    lines.append("")
    rows = []
    for label, *_ in LAYOUTS:
        service, http = m["service"][label], m["http"][label]
        rows.append(
            [
                label,
                f"{service:,.0f}",
                f"{service - m['service']['today']:+,.0f}",
                f"{http:,.0f}",
                f"{http - m['http']['today']:+,.0f}",
            ]
        )
    lines.append(table(["layout", "service write", "vs today", "HTTP write", "vs today"], rows))
    return "\n".join(lines)


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--writes", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=2_000)
    args = parse_part_args(parser)
    if args.smoke:
        args.writes, args.keys = 200, 20
    bench_env()
    fresh_database(DB)
    setup(database=DB)
    seconds = _write(args.writes, args.keys)
    log_bytes._publish()
    measured, rows = _measure(args.writes)
    section = _report(args.writes, args.keys, seconds, measured)
    write_section(TITLE, section)
    print(section)
    write_json(args.json, {"measured": measured, "rows": rows, "seconds": seconds})


if __name__ == "__main__":
    main()
