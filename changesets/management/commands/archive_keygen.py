"""Make a checkpoint signing key for the archive (Ed25519).

    manage.py archive_keygen

Prints ``ATLAS_ARCHIVE_SIGNING_KEY=<base64>`` (keep it secret: it signs the
archive's checkpoints) and the public key that ``GET /log/checkpoints``
publishes (give it to whoever audits the archive). Nothing is stored. The
same, without Atlas: ``openssl genpkey -algorithm ed25519`` (a PEM key is
accepted too; docs/retention.md).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from changesets.archive import signing


class Command(BaseCommand):
    help = "Print a new Ed25519 key for ATLAS_ARCHIVE_SIGNING_KEY and its public key."
    requires_system_checks: list[str] = []

    def handle(self, *args: Any, **options: Any) -> None:
        private = signing.new_private_key()
        public = signing.public_key_text(signing.load_private_key(private))
        self.stdout.write(f"ATLAS_ARCHIVE_SIGNING_KEY={private}")
        self.stdout.write(f"# public key (GET /api/v1/log/checkpoints shows it): {public}")
