"""Run one ``bench/<script>.py --smoke`` in a child process, on databases of its own.

The bench scripts that write a section of docs/benchmarks.md and a JSON of their
results are tested the same way: a child with its own ``ATLAS_BENCH_DB`` on the
tests' server, the doc and the JSON in a scratch folder, its databases dropped
afterwards whatever happened.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from tests.reliability.harness import child_env, database_url_of_tests

ROOT = Path(__file__).resolve().parents[2]


def run_smoke(
    script: str,
    tmp_path: Path,
    *,
    extra_databases: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> tuple[Any, str]:
    """``bench/<script>.py --smoke``'s JSON and the doc section it wrote. It must exit 0.

    ``extra_databases``: suffixes of databases the script makes beside its own
    (``_scale_2k``), dropped with it.
    """
    name = unique_name(script)
    url = database_url_of_tests()
    doc, out = tmp_path / "benchmarks.md", tmp_path / f"{script}.json"
    child = child_env(url, ATLAS_BENCH_DB=name, ATLAS_BENCH_SERVER_URL=url, **(env or {}))
    try:
        run = subprocess.run(
            [sys.executable, f"bench/{script}.py", "--smoke", "--doc", str(doc),
             "--json", str(out)],
            cwd=ROOT, env=child, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    finally:
        drop_databases(name, *(name + suffix for suffix in extra_databases))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text()), doc.read_text()


def unique_name(script: str) -> str:
    """A bench database name of this run's own: two test runs on one server (a
    developer's and CI's, say) never drop or populate each other's."""
    return f"atlas_bench_{script}_{uuid.uuid4().hex[:8]}"


def drop_databases(*names: str, prefix: str | None = None) -> None:
    """Drop ``names``, and every database whose name starts with ``prefix``, on the
    tests' server (the bench scripts name theirs after ``ATLAS_BENCH_DB``)."""
    # The path, not the last "/": the embedded server's URL names its socket folder
    # in the query (?host=/…/.atlas/pgdata).
    admin = urlunsplit(urlsplit(database_url_of_tests())._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        found = list(names)
        if prefix:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", [prefix]
            )
            found += [row[0] for row in rows]
        for database in dict.fromkeys(found):
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
