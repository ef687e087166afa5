"""The server's half of provenance: the ``context`` a request's changeset records.

One place builds it from a request (API views and the admin's writes alike),
so every surface records the same thing (API.md "Provenance"):

- ``request_id``: the request's id (:mod:`atlas.middleware` takes a
  well-formed ``X-Request-ID`` or makes one, and echoes it);
- ``ip``: the peer address, or the client ``X-Forwarded-For`` names when the
  peer is a proxy in ``ATLAS_TRUSTED_PROXIES``;
- ``user_agent``: the ``User-Agent`` header, cut to :data:`MAX_USER_AGENT`;
- ``auth``: ``token``, ``session`` (or ``dev-header``, the development-only
  author header); ``system`` is what a write without a request records;
- ``token_id``: the ``ApiToken``'s primary key, never the key. The id, not the
  prefix: the prefix is a few characters of the key, not unique, and meant
  for people telling their keys apart; the id names exactly one token, for
  ever (ids are not reused), and says nothing about the key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import uuid6
from django.http import HttpRequest

from atlas import conf
from atlas.api.auth import DevAuthorHeaderAuthentication
from atlas.models import ApiToken
from changesets import provenance

HEADER = "X-Request-ID"
REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")
MAX_USER_AGENT = 256
AUTH_DEV_HEADER = "dev-header"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-ID`` when well formed (1–200 of ``[A-Za-z0-9._:-]``),
    else a new UUIDv7: an id that cannot smuggle anything into logs or the chain."""
    if header and REQUEST_ID_RE.fullmatch(header):
        return header
    return str(uuid6.uuid7())


@lru_cache(maxsize=8)
def _networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def trusted_networks() -> tuple[Network, ...]:
    return _networks(tuple(conf.get("ATLAS_TRUSTED_PROXIES")))


def _address(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address: Address, networks: Sequence[Network]) -> bool:
    return any(address in network for network in networks)


def client_ip(peer: str, forwarded_for: str | None, networks: Sequence[Network]) -> str:
    """The client's address: ``peer``, unless ``peer`` is a trusted proxy; then the
    right-most address of ``X-Forwarded-For`` that is not a trusted proxy.

    Each proxy appends the address it received the request from, so only the
    entries added by trusted proxies can be believed; everything left of the
    first untrusted one (reading from the right) may be the client's invention.
    If every entry is a trusted proxy, the left-most is the furthest known. A
    malformed entry ends the walk: the last address known good (the trusted hop
    that passed it on) is the client as far as anyone can tell.
    """
    current = _address(peer)
    if current is None:
        return peer
    if not forwarded_for or not _trusted(current, networks):
        return str(current)
    for entry in reversed(forwarded_for.split(",")):
        hop = _address(entry)
        if hop is None:
            break
        current = hop
        if not _trusted(hop, networks):
            break
    return str(current)


def _auth(request: Any) -> dict[str, Any]:
    token = getattr(request, "auth", None)
    if isinstance(token, ApiToken):
        return {"auth": provenance.AUTH_TOKEN, "token_id": token.pk}
    authenticator = getattr(request, "successful_authenticator", None)
    if isinstance(authenticator, DevAuthorHeaderAuthentication):
        return {"auth": AUTH_DEV_HEADER}
    return {"auth": provenance.AUTH_SESSION}


def request_context(request: Any) -> dict[str, Any]:
    """The ``context`` of a write made by ``request`` (a DRF request or a Django one)."""
    django_request: HttpRequest = getattr(request, "_request", request)
    meta = django_request.META
    request_id = getattr(django_request, "atlas_request_id", None) or request_id_from(
        meta.get("HTTP_X_REQUEST_ID")
    )
    user_agent = meta.get("HTTP_USER_AGENT", "").replace("\x00", "")[:MAX_USER_AGENT]
    return {
        "request_id": request_id,
        "ip": client_ip(
            meta.get("REMOTE_ADDR", ""), meta.get("HTTP_X_FORWARDED_FOR"), trusted_networks()
        ),
        "user_agent": user_agent,
        **_auth(request),
    }
