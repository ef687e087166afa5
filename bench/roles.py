"""Role rows: what authorization costs PostgreSQL, per request and per write.

    .venv/bin/python bench/roles.py [--repeat 2000] [--grants 3,500]
    .venv/bin/python bench/roles.py --smoke        # CI size, scratch output

Every request of a user who is not a superuser loads her roles once
(``entities.access`` ``_roles_sql``: her and her groups' global permissions
and namespace grants), and every write reads the writer's role rows on the
namespaces it writes inside its lock statement (``guard_ctes``, the first of a
single write's two statements). For a user holding N namespace grants (one of
them, writer, on the namespace written) this times both statements as
``atlas.db.prepared_cursor`` runs them (prepared, one generic plan), N each
of ``--grants``, twice: before the tables have statistics (a new database, or
a server with autovacuum off) and after ``ANALYZE``. Per statement: the
server's CPU time (the backend process's counters, read with psutil, over
``--repeat`` executions, so scheduling noise does not count) and the wall time at the
client, median of three rounds.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

import psutil
from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import fresh_database, setup, write_section

# Dropped and made again by every run, so a name of its own beside the bench database.
DB = f"{os.environ.get('ATLAS_BENCH_DB') or 'atlas_bench'}_roles"
TITLE = "Role rows: authorization per request and per write"


def seed(grants: int) -> tuple[Any, str]:
    """A user with ``grants`` namespace grants, writer on the last (the one written);
    the namespace holds one entity. Other users' grants fill the table around hers."""
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType
    from guardian.models import UserObjectPermission

    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.services import role_grant
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory, UserFactory

    tag = uuid.uuid4().hex[:6]
    user = UserFactory(username=f"bench-roles-{tag}")
    ct = ContentType.objects.get_for_model(Namespace)
    read = Permission.objects.get(content_type=ct, codename="read_namespace")
    names = [f"bench.roles{tag}.{i:04d}" for i in range(grants)]
    Namespace.objects.bulk_create([Namespace(name=n) for n in names])
    UserObjectPermission.objects.bulk_create(
        UserObjectPermission(user=user, permission=read, content_type=ct, object_pk=n)
        for n in names[:-1]
    )
    UserObjectPermission.objects.bulk_create(
        UserObjectPermission(user=other, permission=read, content_type=ct, object_pk=f"x.{i}")
        for other in UserFactory.create_batch(10)
        for i in range(1000)
    )
    role_grant(namespace=Namespace.objects.get(name=names[-1]), principal=user, role="writer")
    root = SuperuserFactory(username=f"bench-roles-root-{tag}")
    key = EntityKey(names[-1], "item", "k")
    changeset_apply(store=baseline, actor=root, ops=[PutOp(key, {"n": 0})], rpc=Rpc.PUT_ENTITY)
    return user, names[-1]


def statements(user: Any, namespace: str) -> dict[str, tuple[str, dict[str, Any]]]:
    from entities import access
    from entities.store.baseline import _lock_sql

    fresh = type(user).objects.get(pk=user.pk)
    guard = access.write_guard(fresh, branch="")
    lock = access.guard_params(guard) | {"ns": namespace, "kind": "item", "slug": "k"}
    roles = {"user": user.pk, "codenames": list(access._CODENAME_ROLE)}
    return {
        "a request's role load": (access._roles_sql(), roles),
        "a write's lock statement (role rows inside)": (_lock_sql(False, 1), lock),
    }


def time_statement(sql: str, params: dict[str, Any], repeat: int) -> tuple[float | None, float]:
    """(server CPU ms, client wall ms) per execution, on a new connection each time:
    a new prepared statement, planned against the tables' statistics as they are.
    The server's CPU is None when the backend is not a process of this machine."""
    from django.db import connection

    from atlas.db import prepared_cursor

    connection.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    backend = psutil.Process(pid) if psutil.pid_exists(pid) else None

    def cpu() -> float:
        return sum(backend.cpu_times()[:2]) if backend is not None else 0.0

    with prepared_cursor() as cursor:
        for _ in range(10):
            cursor.execute(sql, params)
            cursor.fetchall()
        started_cpu, started = cpu(), time.perf_counter()
        for _ in range(repeat):
            cursor.execute(sql, params)
            cursor.fetchall()
        wall = (time.perf_counter() - started) / repeat * 1000
        server = (cpu() - started_cpu) / repeat * 1000 if backend is not None else None
        return server, wall


def measure(grant_counts: list[int], repeat: int, rounds: int) -> list[dict[str, Any]]:
    from django.db import connection

    rows = []
    for stats in (False, True):
        seeded = []
        for grants in grant_counts:
            seeded.append((grants, seed(grants)))
        if stats:
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
        for grants, (user, namespace) in seeded:
            for name, (sql, params) in statements(user, namespace).items():
                runs = [time_statement(sql, params, repeat) for _ in range(rounds)]
                rows.append(
                    {
                        "statement": name,
                        "grants": grants,
                        "statistics": stats,
                        "server_cpu_ms": _median([r[0] for r in runs]),
                        "wall_ms": statistics.median(r[1] for r in runs),
                    }
                )
    return rows


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--grants", default="3,500")
    args = parse_part_args(parser)
    grant_counts = [int(g) for g in args.grants.split(",")]
    repeat, rounds = (50, 1) if args.smoke else (args.repeat, 3)
    bench_env()
    # A database of its own, made again: "before statistics" must mean it.
    fresh_database(DB)
    setup(database=DB)
    rows = measure(grant_counts, repeat, rounds)
    write_json(args.json, {"repeat": repeat, "rows": rows})

    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value:.3f}"

    body = table(
        ["statement", "grants", "statistics", "server CPU, ms", "wall at the client, ms"],
        [
            [
                r["statement"],
                f"{r['grants']:,}",
                "analyzed" if r["statistics"] else "none yet",
                ms(r["server_cpu_ms"]),
                ms(r["wall_ms"]),
            ]
            for r in rows
        ],
    )
    cmd = "bench/roles.py" + (" --smoke" if args.smoke else "")
    text = header(cmd) + "\n" + __doc__.split("\n\n", 2)[2].strip() + "\n\n" + body
    write_section(TITLE, text)
    print(text)


if __name__ == "__main__":
    main()
