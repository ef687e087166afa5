"""Webhook plumbing: where a delivery may go, how it is signed, how it is sent.

Shared by the subscription services (a URL is vetted when it is saved) and
the pump (it is vetted again, and pinned, when a delivery is sent), so
neither imports the other for it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import ipaddress
import secrets
import socket
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import urlsplit

from standardwebhooks import Webhook

from atlas import conf
from changesets.models import Subscription

SIGNATURE_HEADER = "X-Atlas-Signature"  # deprecated: kept beside the Standard Webhooks headers
DELIVERY_HEADER = "X-Atlas-Delivery"
WEBHOOK_ID_HEADER = "webhook-id"
WEBHOOK_TIMESTAMP_HEADER = "webhook-timestamp"
WEBHOOK_SIGNATURE_HEADER = "webhook-signature"
USER_AGENT = "Atlas-Webhook/1"
SECRET_BYTES = 32
SECRET_PREFIX = "whsec_"


class UnsafeAddress(Exception):
    """A webhook host resolved to an address deliveries may not go to."""


# IPv6 ranges that carry an IPv4 address in their last 32 bits, or that are never a
# public destination whatever they embed.
NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: check the IPv4 inside
NAT64_LOCAL_USE = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: local use only
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291, deprecated: never public
TEREDO = ipaddress.ip_network("2001::/32")  # RFC 4380: check server and client IPv4


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address stands for (mapped, NAT64, 6to4, Teredo)."""
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in NAT64_WELL_KNOWN:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def _public(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether deliveries may go to ``ip``: globally reachable, not multicast, and,
    for IPv6, not a wrapper around an IPv4 address that is not (NAT64
    ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo ``2001::/32``, IPv4-mapped), nor
    in a range never meant as a public destination (local-use NAT64
    ``64:ff9b:1::/48``, IPv4-compatible ``::/96``)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in NAT64_LOCAL_USE or ip in IPV4_COMPATIBLE:
            return False
        embedded = _embedded_ipv4(ip)
        if ip.ipv4_mapped is not None:
            return all(_public(v4) for v4 in embedded)
        if not all(_public(v4) for v4 in embedded):
            return False
    return ip.is_global and not ip.is_multicast


def resolve_webhook_host(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, vetted against the private-address rule.

    Raises :class:`UnsafeAddress` when any of them is loopback, private,
    link-local or otherwise non-public and private webhooks are not allowed,
    and ``OSError`` when the name does not resolve.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # typeshed types a sockaddr's first item ``str | int`` (AF_CAN and the like);
    # for the IP families a TCP lookup returns it is the address text.
    addresses = list(dict.fromkeys(cast(str, info[4][0]) for info in infos))
    if not conf.get("ATLAS_ALLOW_PRIVATE_WEBHOOKS"):
        for address in addresses:
            if not _public(ipaddress.ip_address(address.split("%", 1)[0])):
                raise UnsafeAddress(address)
    return addresses


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and the base64 of 32 random bytes (the key)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def sign(secret: str, body: bytes) -> str:
    """The deprecated ``X-Atlas-Signature`` value: ``sha256=<hex HMAC-SHA256 of the body>``,
    keyed by the secret string's own bytes (``whsec_`` prefix included)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class HttpOutcome:
    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post_json(url: str, body: bytes, headers: dict[str, str], *, timeout: float) -> HttpOutcome:
    """POST ``body`` to ``url``; never raises for network trouble.

    The host is resolved and vetted once (:func:`resolve_webhook_host`) and the
    connection goes to that vetted address, so a DNS answer that changes
    between the check and the connect cannot redirect a delivery to a private
    address. Redirects are not followed (a 3xx is a failure), proxies from the
    environment are not used, and ``timeout`` bounds the connect and each read.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = resolve_webhook_host(host, port)
    except UnsafeAddress as exc:
        return HttpOutcome(None, f"refused: {host} resolves to non-public address {exc}")
    except (OSError, UnicodeError) as exc:
        return HttpOutcome(None, f"cannot resolve {host}: {exc}")

    def connect(_address: Any, conn_timeout: Any = None, source_address: Any = None) -> Any:
        error: OSError | None = None
        for address in addresses:  # each vetted address in turn, as create_connection would
            try:
                return socket.create_connection((address, port), conn_timeout, source_address)
            except OSError as exc:
                error = exc
        raise error or OSError(f"no address for {host}")

    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(
            host, port, timeout=timeout, context=ssl.create_default_context()
        )
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn._create_connection = connect  # type: ignore[attr-defined]  # pin the vetted address
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        excerpt = response.read(512).decode("utf-8", "replace")
        if 200 <= response.status < 300:
            return HttpOutcome(response.status)
        return HttpOutcome(response.status, f"HTTP {response.status}: {excerpt}".strip())
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        return HttpOutcome(None, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


# --- signing -----------------------------------------------------------------------------


def _webhook(secret: str) -> Webhook:
    """The Standard Webhooks signer for a stored secret.

    ``whsec_<base64>`` secrets (issued since Standard Webhooks signing) key the
    HMAC with the base64-decoded bytes, as the spec says. Older secrets (64 hex
    characters, no prefix) key it with their own ASCII bytes, the same key
    ``X-Atlas-Signature`` always used, so existing receivers need no new secret.
    """
    if secret.startswith(SECRET_PREFIX):
        return Webhook(secret)
    return Webhook(secret.encode())


def signing_secrets(subscription: Subscription, *, now: datetime) -> list[str]:
    """The secrets a delivery at ``now`` is signed with: the current one, and the
    previous one while its rotation overlap lasts."""
    found = [subscription.secret]
    expires = subscription.previous_secret_expires_at
    if subscription.previous_secret and expires is not None and expires > now:
        found.append(subscription.previous_secret)
    return found


def signature_headers(
    subscription: Subscription, delivery: str, body: bytes, *, now: datetime
) -> dict[str, str]:
    """Standard Webhooks headers (one ``v1,`` signature per live secret, space-separated)
    and the deprecated ``X-Atlas-Signature`` (current secret only)."""
    timestamp = datetime.fromtimestamp(int(now.timestamp()), tz=UTC)
    text = body.decode()
    signatures = [
        _webhook(secret).sign(msg_id=delivery, timestamp=timestamp, data=text)
        for secret in signing_secrets(subscription, now=now)
    ]
    return {
        WEBHOOK_ID_HEADER: delivery,
        WEBHOOK_TIMESTAMP_HEADER: str(int(timestamp.timestamp())),
        WEBHOOK_SIGNATURE_HEADER: " ".join(signatures),
        SIGNATURE_HEADER: sign(subscription.secret, body),
        DELIVERY_HEADER: delivery,
    }
