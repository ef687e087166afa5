"""Years later, with only the files and the public key: verification needs no database.

``manage.py verify_archive`` runs with ``DATABASE_URL`` pointing at a port
nothing listens on, and ``python -m changesets.archive.offline`` runs
without Django at all.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from changesets.archive import signing
from tests.changesets.archive.conftest import cut, public_key
from tests.reliability.harness import BASE_DIR, child_env

pytestmark = pytest.mark.django_db
UNREACHABLE = "postgres://nobody@127.0.0.1:9/nothing-listens-here"


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=BASE_DIR, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def copied(seed, archive_dir, tmp_path):
    """The archive as an auditor gets it: a copy of the folder, the database out of reach."""
    seeded = seed(2)
    cut(seeded.seq_of(5) + 1)
    copy = tmp_path / "auditor-copy"
    shutil.copytree(archive_dir, copy)
    return copy


def test_verify_archive_needs_no_database(copied):
    env = child_env(UNREACHABLE)
    ok = _run("manage.py", "verify_archive", str(copied), "--public-key", public_key(),
              "--no-progress", env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: 1 checkpoint(s)") and "trusted" in ok.stdout
    other = signing.public_key_text(signing.load_private_key(signing.new_private_key()))
    wrong = _run("manage.py", "verify_archive", str(copied), "--public-key", other,
                 "--no-progress", env=env)  # fmt: skip
    assert wrong.returncode == 1 and "signature does not verify" in wrong.stderr


def test_the_offline_verifier_runs_without_django(copied):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(BASE_DIR)}
    ok = _run("-m", "changesets.archive.offline", str(copied), "--public-key", public_key(),
              env=env)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok:")
    imported = _run("-c", "import sys, changesets.archive.offline; print('django' in sys.modules)",
                    env=env)  # fmt: skip
    assert imported.stdout.strip() == "False"


def test_verify_archive_reads_the_configured_storage_too(copied, archive_dir):
    out = StringIO()
    call_command("verify_archive", "--no-progress", stdout=out)
    assert out.getvalue().startswith("ok: 1 checkpoint(s)") and "embedded" in out.getvalue()


def test_archive_keygen_prints_a_key_that_signs_and_its_public_half(capsys):
    out = StringIO()
    call_command("archive_keygen", stdout=out)
    first, second = out.getvalue().splitlines()
    key = first.removeprefix("ATLAS_ARCHIVE_SIGNING_KEY=")
    public = second.rsplit(" ", 1)[-1]
    body = {"seq": 1}
    signed = {**body, "signature": signing.sign(body, signing.load_private_key(key))}
    assert signing.verify(signed, signing.load_public_key(public))
