"""Point Django at a throw-away benchmark database on the same server.

The changeset log is append-only, so benchmarks never write into the
database you use: they create (or reuse) ``atlas_bench`` beside it, migrate
it, and work there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# ATLAS_BENCH_DB lets a caller (the CI smoke test) use a database of its own.
BENCH_DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench"


def server_url() -> str:
    """The URL of the server to benchmark on (DATABASE_URL, else the embedded one)."""
    url = os.environ.get("ATLAS_BENCH_SERVER_URL") or os.environ.get("DATABASE_URL")
    if not url:
        from atlas.embedded import database_url

        url = database_url()
    # Remembered, so a second setup() in this process (or a child) finds the server
    # even after DATABASE_URL has been pointed at a benchmark database.
    os.environ["ATLAS_BENCH_SERVER_URL"] = url
    return url


def database_url(name: str) -> str:
    """The URL of database ``name`` on the benchmark server, creating the database if needed."""
    import psycopg

    parts = urlsplit(server_url())
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(parts._replace(path="/" + name))


def fresh_database(name: str) -> str:
    """Database ``name`` on the benchmark server, dropped (whatever holds it open) and
    made again, empty: for a script whose figures need a new one every run."""
    import psycopg

    # The path, not the last "/": an embedded server's URL names its socket in the query.
    admin = urlunsplit(urlsplit(server_url())._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return database_url(name)


def setup(settings: str | None = None, database: str | None = None) -> None:
    """Point Django at a benchmark database (``atlas_bench`` unless told), migrate it.

    ``settings`` overrides DJANGO_SETTINGS_MODULE (default: the environment's,
    else ``atlas.settings``); ``bench.settings`` adds the peers and the plain model.
    """
    os.environ["DATABASE_URL"] = database_url(database or BENCH_DB)
    if settings:
        os.environ["DJANGO_SETTINGS_MODULE"] = settings
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "atlas.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # Post-commit tasks are enqueued (that cost is measured) into a broker no
    # worker reads, so a benchmark never floods the dev worker's queue.
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def doc_path() -> Path:
    """docs/benchmarks.md, or ATLAS_BENCH_DOC (the smoke test writes to a scratch file)."""
    override = os.environ.get("ATLAS_BENCH_DOC")
    return Path(override) if override else ROOT / "docs" / "benchmarks.md"


def write_section(title: str, body: str) -> None:
    """Replace (or append) one ``## title`` section of docs/benchmarks.md."""
    path = doc_path()
    text = (
        path.read_text()
        if path.exists()
        else "# Benchmarks\n\nNumbers from `bench/`; rerun to refresh.\n"
    )
    header = f"## {title}\n"
    start = text.find(header)
    if start == -1:
        text = text.rstrip("\n") + "\n\n" + header + body.rstrip("\n") + "\n"
    else:
        end = text.find("\n## ", start + len(header))
        end = len(text) if end == -1 else end + 1
        text = (
            text[:start]
            + header
            + body.rstrip("\n")
            + "\n"
            + ("\n" + text[end:] if end < len(text) else "")
        )
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
