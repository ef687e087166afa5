"""The requests of bench/keys_blame_diff.py: a token-authenticated test client, and one
request or a walk of every page, as bench/_scale_measure.py's size servers call them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

USER = "superuser"


@dataclass
class Fetched:
    """What one request (or a walk of pages) returned, as the size server reports it."""

    status_code: int
    info: dict[str, Any] = field(default_factory=dict)


def client() -> tuple[Any, dict[str, str]]:
    """A test client and the token header of a superuser (as a request authenticates)."""
    from django.contrib.auth.models import User
    from django.test import Client

    from atlas.services import api_token_create

    user, _ = User.objects.get_or_create(
        username="bench-kbd-reader", defaults={"is_staff": True, "is_superuser": True}
    )
    token = api_token_create(user=user, name="keys bench")[1]
    return Client(), {"HTTP_AUTHORIZATION": f"Token {token}"}


def fetch(http: Any, headers: dict[str, str], urls: list[str]) -> Fetched:
    """GET ``urls[0]``; with ``"walk"`` after it, every next page too.

    A refused request raises: the benchmark must not time error pages.
    """
    url, walk = urls[0], "walk" in urls[1:]
    pages = rows = size = 0
    while True:
        response = http.get(url, **headers)
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {response.content[:300]!r}")
        body = response.json()
        pages += 1
        size += len(response.content)
        rows += len(body.get("results", body.get("keys", body.get("patch", []))))
        token = body.get("next_page_token")
        if not walk or not token:
            return Fetched(200, {"pages": pages, "rows": rows, "bytes": size})
        url = f"{urls[0]}&page_token={token}"
