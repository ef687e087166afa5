"""Model fields of the log that store one thing and show another.

``ChainHashField``: a chain hash is stored as its 32 bytes (``bytea``, 33 B on
disk) and read and written as its 64-character lowercase hex text (what the
chain hashes, ``GET /log/head`` shows and anyone anchors). Only the storage
is binary: every model instance, ``values_list`` and ``Model.objects.raw``
row holds the hex text, so the chain, the API, the admin and the archive
read hashes as they always have. Raw SQL that selects a hash column gets the
bytes; it says ``encode(col, 'hex')`` (or converts in Python), and raw SQL
that writes one says ``decode(%s, 'hex')``.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

HASH_BYTES = 32


def to_hex(value: bytes | memoryview | None) -> str | None:
    """A stored hash (bytes from a cursor) as the hex text everything else uses."""
    return None if value is None else bytes(value).hex()


class ChainHashField(models.BinaryField):
    """A SHA-256 chain hash: ``bytea`` in the table, hex text in Python; NULL is "none".

    The empty string (what the ``varchar`` columns held for "no hash yet")
    is stored as NULL, so a code path that still says ``""`` means the same.
    """

    description = "A chain hash (32 bytes stored, hex text in Python)"
    # What the instance attribute holds, for django-stubs' mypy plugin (it adds
    # ``None`` for ``null=True``): the hex text, not BinaryField's bytes.
    _pyi_private_set_type: str | bytes | None
    _pyi_private_get_type: str  # type: ignore[assignment]  # (not BinaryField's bytes)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> str | None:
        return to_hex(value)

    def to_python(self, value: Any) -> str | None:
        if value is None or value == "":
            return None
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value).hex()
        try:
            raw = bytes.fromhex(value)
        except (TypeError, ValueError) as error:
            raise ValidationError(f"{value!r} is not a hex chain hash") from error
        if len(raw) != HASH_BYTES:
            raise ValidationError(f"a chain hash is {HASH_BYTES} bytes, not {len(raw)}")
        return raw.hex()

    def get_prep_value(self, value: Any) -> bytes | None:
        value = super().get_prep_value(value)
        if value is None or value == "":
            return None
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        return bytes.fromhex(value)

    def value_to_string(self, obj: Any) -> str:
        """Serialized (``dumpdata``) as the hex text, not BinaryField's base64."""
        return str(self.value_from_object(obj) or "")


# Between two pointers of a ``PointerListField``: a pointer's "~" is always followed
# by "0" or "1" (RFC 6901 escapes), so "~2" never occurs inside one.
POINTER_SEPARATOR = "~2"


class PointerListField(models.TextField):
    """A list of RFC 6901 pointers, stored as one text joined by ``~2``.

    A revision's ``changed`` pointers (migration 0035): a ``text[]`` of one
    pointer took about 33 bytes, its array header most of it; the same pointer
    joined is the pointer and a byte. The empty list is the empty text. SQL
    that wants the array says ``string_to_array(changed, '~2')``.
    """

    description = "RFC 6901 pointers (a list in Python, one text stored)"
    # What the instance attribute holds, for django-stubs' mypy plugin: the list.
    _pyi_private_set_type: list[str] | str  # type: ignore[assignment]  # (not TextField's)
    _pyi_private_get_type: list[str]  # type: ignore[assignment]

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> list[str]:
        return self.to_python(value)

    def to_python(self, value: Any) -> list[str]:
        # A list: a ``text[]`` column, read by a migration test at a schema before 0035.
        if isinstance(value, list):
            return value
        return split_pointers(value)

    def get_prep_value(self, value: Any) -> str:
        if isinstance(value, str):
            return value
        return POINTER_SEPARATOR.join(value or [])


def split_pointers(value: str | None) -> list[str]:
    """A stored ``changed`` text as its list of pointers."""
    return value.split(POINTER_SEPARATOR) if value else []
