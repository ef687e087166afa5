"""The archive's files through Django's storage API (``STORAGES["atlas_archive"]``), and its key.

Any Django storage works: the default is a local folder (``FileSystemStorage``);
S3 and compatible services come with django-storages (``docs/retention.md``).
The archiver only ever creates files under names nobody used before, or
deletes one it replaced, so a storage needs no overwrite or rename support.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import IO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.files import File
from django.core.files.storage import FileSystemStorage, InvalidStorageError, Storage, storages

from atlas import conf
from changesets.archive import signing

ALIAS = "atlas_archive"


class NotConfigured(Exception):
    """The archive cannot run as configured (no signing key, a bad key)."""


def archive_storage() -> Storage:
    """``STORAGES["atlas_archive"]``; a host project without one gets a local folder."""
    try:
        return storages[ALIAS]
    except InvalidStorageError:
        return FileSystemStorage(location=conf.get("ATLAS_ARCHIVE_DIR"))


def describe(storage: Storage | None = None) -> str:
    """Where the archive is, for people: ``ATLAS_ARCHIVE_LOCATION``, else from the storage."""
    configured = conf.get("ATLAS_ARCHIVE_LOCATION")
    if configured:
        return str(configured)
    storage = storage or archive_storage()
    if isinstance(storage, FileSystemStorage):
        return Path(storage.location).resolve().as_uri()
    bucket = getattr(storage, "bucket_name", None)
    if bucket:
        prefix = getattr(storage, "location", "") or ""
        return f"s3://{bucket}/{prefix}".rstrip("/")
    return f"{type(storage).__module__}.{type(storage).__qualname__}"


class StorageSource:
    """A Django storage as the offline verifier's :class:`~changesets.archive.offline.Source`."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage or archive_storage()

    def names(self, folder: str) -> list[str]:
        try:
            _, files = self.storage.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(f"{folder}/{name}" for name in files)

    def open(self, name: str) -> IO[bytes]:
        return self.storage.open(name, "rb")

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)


def save(name: str, handle: IO[bytes], storage: Storage | None = None) -> None:
    """Store ``handle``'s bytes under exactly ``name`` (a leftover of a crashed try goes first)."""
    storage = storage or archive_storage()
    if storage.exists(name):
        storage.delete(name)
    handle.seek(0)
    saved = storage.save(name, File(handle, name=name))
    if saved != name:  # pragma: no cover - a storage that renamed despite the delete
        storage.delete(saved)
        raise OSError(f"the archive storage stored {name!r} as {saved!r}")


def save_bytes(name: str, data: bytes, storage: Storage | None = None) -> None:
    with tempfile.TemporaryFile() as handle:
        handle.write(data)
        save(name, handle, storage)


def delete(name: str, storage: Storage | None = None) -> None:
    storage = storage or archive_storage()
    if storage.exists(name):
        storage.delete(name)


def signing_key() -> Ed25519PrivateKey:
    """The checkpoint signing key from ``ATLAS_ARCHIVE_SIGNING_KEY`` (refuses without one)."""
    text = str(conf.get("ATLAS_ARCHIVE_SIGNING_KEY") or "")
    if not text.strip():
        raise NotConfigured(
            "ATLAS_ARCHIVE_SIGNING_KEY is not set: make one with `manage.py archive_keygen`"
            " (docs/retention.md)"
        )
    try:
        return signing.load_private_key(text)
    except signing.BadKey as exc:
        raise NotConfigured(f"ATLAS_ARCHIVE_SIGNING_KEY cannot be read: {exc}") from exc


def public_key() -> str | None:
    """The configured key's public half (base64), or None without a usable key."""
    try:
        return signing.public_key_text(signing_key())
    except NotConfigured:
        return None
