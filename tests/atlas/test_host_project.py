"""Atlas inside another Django project, installed from a wheel built here (docs/embedding.md).

``tests/host_project`` is a minimal host: its own settings (no ``ATLAS_*``),
its own app and view, Atlas's API included under its own prefix, Atlas's
admin pages under its own admin. This test builds Atlas's wheel
(``pip wheel . --no-deps``, no build isolation: offline once ``make venv``
ran), installs it into a fresh virtualenv whose only other packages are the
shared virtualenv's (a ``.pth`` line, so nothing is downloaded), and runs the
host's ``manage.py`` there in subprocesses: ``migrate``, then
``embedding_report`` (writes through the host's view, reads through Atlas's
API, opens admin pages) whose JSON report is checked here. The host runs
from its own folder, so ``atlas`` can only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import psycopg
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
HOST = ROOT / "tests" / "host_project"
STEP_TIMEOUT = 120  # seconds per subprocess; the whole test takes well under a minute

# What the copy the wheel is built from leaves out (pyproject.toml picks the packages).
NOT_PACKAGED = (".*", "build", "dist", "*.egg-info", "__pycache__", "tests", "bench", "docs")

pytestmark = pytest.mark.slow


def run(args: list[str], **kwargs) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=STEP_TIMEOUT, **kwargs)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def host_database() -> dict[str, str]:
    """A fresh database on the tests' PostgreSQL server for the host project, dropped after."""
    settings = connection.settings_dict
    server = {
        "host": settings["HOST"] or "",
        "port": str(settings["PORT"] or ""),
        "user": settings["USER"] or "",
        "password": settings["PASSWORD"] or "",
    }
    name = f"atlas_host_project_{os.getpid()}"

    def admin(sql: str) -> None:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as conn:
            conn.execute(sql)

    admin(f'DROP DATABASE IF EXISTS "{name}"')
    admin(f'CREATE DATABASE "{name}"')
    yield {f"HOST_DB_{k.upper()}": v for k, v in server.items()} | {"HOST_DB_NAME": name}
    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def host_python(tmp_path: Path) -> Path:
    """A fresh virtualenv with Atlas's wheel installed, and the shared one's packages."""
    # Built from a copy: setuptools builds in the source tree, and a stale build/ there
    # could carry deleted files into the wheel.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_PACKAGED))
    run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(tmp_path / "dist")])  # fmt: skip
    [wheel] = (tmp_path / "dist").glob("atlas-*.whl")
    venv = tmp_path / "venv"
    run(
        [getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)]
    )
    python = venv / "bin" / "python"
    purelib = Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    )
    (purelib / "shared_packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)])
    return python


def test_a_host_project_runs_atlas_from_its_wheel(host_python, host_database, tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE", "DATABASE_URL"}
    }
    env |= host_database
    manage = [str(host_python), "manage.py"]
    run([*manage, "migrate", "--noinput", "-v", "0"], cwd=HOST, env=env)
    report = json.loads(run([*manage, "embedding_report"], cwd=HOST, env=env).splitlines()[-1])

    # Atlas came from the wheel in the fresh virtualenv, not from this checkout.
    assert Path(report["atlas_file"]).is_relative_to(tmp_path / "venv"), report["atlas_file"]
    # The host's view wrote its row and a changeset in its own transaction, as its user...
    status, placed = report["place"]
    assert status == 201
    # ...and when its own row failed, Atlas's write rolled back with it.
    assert report["duplicate"] == "rolled back"
    assert report["changesets"] == [["clerk", "placed in the shop"]]
    assert report["entity"] == [["o-1", {"total": 42, "status": "placed"}, 1]]
    # History and the changeset through Atlas's API under the host's prefix.
    status, history = report["history"]
    assert status == 200
    [revision] = history["results"]
    assert (revision["author"], revision["op"], revision["after"]) == (
        "clerk",
        "create",
        {"total": 42, "status": "placed"},
    )
    assert revision["changeset_id"] == placed["changeset_id"]
    status, changeset = report["changeset"]
    assert (status, changeset["comment"], changeset["rpc"]) == (
        200,
        "placed in the shop",
        "PutEntity",
    )
    assert report["anonymous"] == 401
    assert report["schema"] == 200
    # Atlas's admin pages under the host's admin, next to the host's own.
    assert {path: status for path, (status, _) in report["admin"].items()} == dict.fromkeys(
        report["admin"], 200
    )
    assert report["admin"]["/admin/changesets/changeset/"][1], "the changeset is listed"
    # Host code cannot write entity rows behind the write service's back.
    assert "entity rows change only through the write service" in report["direct_write"]
