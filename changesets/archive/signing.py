"""Ed25519 signatures of archive checkpoints (``cryptography``), and the bytes they sign.

Pure Python (no Django): the offline verifier uses it. What is signed is the
checkpoint body (everything but ``signature``) encoded canonically: JSON with
sorted keys, no whitespace, UTF-8 (``canonical``). A checkpoint file is that
body plus ``"signature"`` (base64 of the 64-byte Ed25519 signature), so
anyone holding the public key checks it with a few lines of any language
(``docs/retention.md`` shows Python and OpenSSL).

Keys travel as base64 of their 32 raw bytes (``ATLAS_ARCHIVE_SIGNING_KEY`` for
the private key; ``GET /log/checkpoints`` publishes the public one). A PEM
private key (``openssl genpkey -algorithm ed25519``) is accepted too.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "Ed25519"


class BadKey(ValueError):
    """A signing or public key that cannot be read."""


def canonical(body: dict[str, Any]) -> bytes:
    """The bytes a checkpoint's signature covers."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def new_private_key() -> str:
    """A fresh signing key, as ``ATLAS_ARCHIVE_SIGNING_KEY`` takes it (base64 of 32 bytes)."""
    raw = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    return base64.b64encode(raw).decode()


def load_private_key(text: str) -> Ed25519PrivateKey:
    """``ATLAS_ARCHIVE_SIGNING_KEY``: base64 of the 32-byte seed, or a PEM private key."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except ValueError as exc:
            raise BadKey(f"not a PEM private key ({exc})") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise BadKey("the PEM key is not an Ed25519 key")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadKey("not base64") from exc
    if len(raw) != 32:
        raise BadKey(f"an Ed25519 private key is 32 bytes, this is {len(raw)}")
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """Base64 of the 32 raw bytes of the public key."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def load_public_key(text: str) -> Ed25519PublicKey:
    """A public key as :func:`public_key_text` writes it, or PEM (``-----BEGIN PUBLIC KEY``)."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode())
        except ValueError as exc:
            raise BadKey(f"not a PEM public key ({exc})") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise BadKey("the PEM key is not an Ed25519 key")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadKey("not base64") from exc
    if len(raw) != 32:
        raise BadKey(f"an Ed25519 public key is 32 bytes, this is {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def sign(body: dict[str, Any], key: Ed25519PrivateKey) -> str:
    """Base64 of the signature of ``body`` (which must not hold ``signature``)."""
    if "signature" in body:
        raise ValueError("sign the body, not a signed checkpoint")
    return base64.b64encode(key.sign(canonical(body))).decode()


def verify(checkpoint: dict[str, Any], public_key: Ed25519PublicKey) -> bool:
    """Whether ``checkpoint`` (a body plus ``signature``) is signed by ``public_key``."""
    body = {k: v for k, v in checkpoint.items() if k != "signature"}
    try:
        signature = base64.b64decode(str(checkpoint.get("signature", "")), validate=True)
        public_key.verify(signature, canonical(body))
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True
