"""The timing loop of bench/keys_blame_diff.py: requests through Django's test client,
interleaved, with each request's SQL time and the plan of its slowest statement."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import summary
from _sqltime import slowest_plan, sql_timer


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


def fetch(http: Any, headers: dict[str, str], urls: list[str]) -> dict[str, Any]:
    """GET ``urls[0]``; with ``"walk"`` after it, every next page too. What came back."""
    url, walk = urls[0], "walk" in urls[1:]
    pages = rows = 0
    while True:
        response = http.get(url, **headers)
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {response.content[:300]!r}")
        body = response.json()
        pages += 1
        rows += len(body.get("results", body.get("keys", body.get("patch", []))))
        token = body.get("next_page_token")
        if not walk or not token:
            return {"pages": pages, "rows": rows, "bytes": len(response.content)}
        url = f"{urls[0]}&page_token={token}"


def time_requests(
    requests: dict[str, Callable[[int], list[str]]], repeat: int, seconds: float
) -> dict[str, dict[str, Any]]:
    """Each request once untimed (its first call after the database was opened:
    reported as "first"), then ``repeat`` rounds, each running every request once in
    turn (a load spike hits them all alike); then each slowest statement's plan."""
    from django.db import connection

    http, headers = client()
    first: dict[str, float] = {}
    seen: dict[str, dict[str, Any]] = {}
    for label, urls in requests.items():
        started = time.perf_counter()
        seen[label] = fetch(http, headers, urls(0))
        first[label] = (time.perf_counter() - started) * 1000
    wall: dict[str, list[float]] = {label: [] for label in requests}
    sql: dict[str, list[float]] = {label: [] for label in requests}
    count: dict[str, int] = {}
    deadline = time.monotonic() + seconds * len(requests)
    for i in range(1, repeat + 1):
        for label, urls in requests.items():
            with sql_timer() as timer:
                started = time.perf_counter()
                fetch(http, headers, urls(i))
                wall[label].append((time.perf_counter() - started) * 1000)
            sql[label].append(timer.ms)
            count[label] = len(timer.statements)
        if time.monotonic() > deadline:
            break
    out: dict[str, dict[str, Any]] = {}
    for label, urls in requests.items():
        with sql_timer() as timer:
            fetch(http, headers, urls(1))
        slowest, plan = slowest_plan(timer.statements)
        out[label] = {
            **summary(wall[label]),
            "first": first[label],
            "sql_p50": statistics.median(sql[label]),
            "python_p50": statistics.median(
                w - s for w, s in zip(wall[label], sql[label], strict=True)
            ),
            "statements": count.get(label, 0),
            "slowest_ms": slowest.ms if slowest else 0.0,
            "plan": plan,
            "url": urls(1)[0],
            **seen[label],
        }
        print(
            f"  {label:52} p50 {out[label]['p50']:8.2f} ms  SQL {out[label]['sql_p50']:7.2f} ms"
            f"  {out[label]['statements']:3} statements  {out[label]['rows']:6} rows",
            flush=True,
        )
    connection.close()
    return out
