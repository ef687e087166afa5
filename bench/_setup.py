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
BENCH_DB = "atlas_bench"


def setup() -> None:
    import psycopg

    url = os.environ.get("DATABASE_URL")
    if not url:
        from atlas.embedded import database_url

        url = database_url()
    parts = urlsplit(url)
    admin_url = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DB]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + BENCH_DB))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "atlas.settings")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    # Post-commit tasks are enqueued (that cost is measured) into a broker no
    # worker reads, so a benchmark never floods the dev worker's queue.
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def write_section(title: str, body: str) -> None:
    """Replace (or append) one ``## title`` section of docs/benchmarks.md."""
    path = ROOT / "docs" / "benchmarks.md"
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
