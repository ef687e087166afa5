"""Idempotency under load (issue 7, item 8; docs/reliability.md), over HTTP against gunicorn.

- N POSTs, each retried 3 times with the same key and body: exactly N
  changesets; every retry replays the first response byte for byte with
  ``Idempotent-Replayed: true``.
- 50 identical requests with one key at once: exactly one changeset, no 5xx
  (the others are replays, or 409 while the first still runs).
- The same key with another body or another endpoint: 422. The same key from
  two users: two independent requests.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest

from changesets.models import Changeset
from tests.reliability.harness import (
    Api,
    database_url_of_tests,
    gunicorn,
    latency_summary,
    load,
    principal,
    publishing,
    record,
    sized,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NS = "rel.idem"
RETRIES = 3


def batch_body(n: int) -> dict:
    return {
        "ops": [
            {"op": "put", "namespace": NS, "kind": "item", "slug": f"p{n}-{j}", "content": {"n": n}}
            for j in range(2)
        ],
        "comment": f"request {n}",
    }


def test_retried_posts_write_once_and_replay_byte_identical():
    total = sized(100, 1000)
    clients = 8
    _, token = principal("idem", writer_of=(NS,))
    db = database_url_of_tests()
    with publishing() as pub, gunicorn(db, workers=2, threads=4, env=pub) as server:
        sessions = [Api(server.url, token) for _ in range(clients)]
        counter = iter(range(total))
        lock = threading.Lock()

        def step(c: int, i: int) -> tuple[int, int]:
            with lock:
                n = next(counter)
            key = f"load-{n}-{uuid.uuid4().hex}"
            body = batch_body(n)
            responses = [
                sessions[c].post("/api/v1/batch", json=body, headers={"Idempotency-Key": key})
                for _ in range(1 + RETRIES)
            ]
            first, retries = responses[0], responses[1:]
            assert first.status_code == 200, first.text
            assert "Idempotent-Replayed" not in first.headers
            assert first.json()["changeset"] is not None
            for retry in retries:
                assert retry.status_code == first.status_code
                assert retry.content == first.content, "a replay must be byte-identical"
                assert retry.headers["Idempotent-Replayed"] == "true"
                assert retry.headers["Content-Type"] == first.headers["Content-Type"]
            return first.status_code, len(retries)

        result = load(step, threads=clients, max_count=total, max_seconds=sized(120, 900))
        for api in sessions:
            api.close()
    assert not result.errors, result.errors[:3]
    assert result.hung == 0 and len(result.outcomes) == total
    assert Changeset.objects.count() == total, "exactly one changeset per key"
    assert Changeset.objects.filter(op_count=2).count() == total
    record(
        "idempotent_retries",
        posts=total,
        retries_each=RETRIES,
        requests=total * (1 + RETRIES),
        changesets=Changeset.objects.count(),
        seconds=round(result.seconds, 1),
        post_plus_retries=latency_summary(result.latencies),
    )


def test_concurrent_identical_requests_with_one_key_and_key_reuse():
    same_time = 50
    alice, alice_token = principal("alice", writer_of=(NS,))
    _, bob_token = principal("bob", writer_of=(NS,))
    db = database_url_of_tests()
    with publishing() as pub, gunicorn(db, workers=2, threads=8, env=pub) as server:
        # 50 identical requests with one key, released together.
        key = f"burst-{uuid.uuid4().hex}"
        body = batch_body(10_000)
        barrier = threading.Barrier(same_time, timeout=30)
        sessions = [Api(server.url, alice_token) for _ in range(same_time)]
        responses: list = [None] * same_time

        def fire(i: int) -> None:
            sessions[i].get("/healthz")  # connect first, so the POSTs really start together
            barrier.wait()
            responses[i] = sessions[i].post(
                "/api/v1/batch", json=body, headers={"Idempotency-Key": key}
            )

        threads = [threading.Thread(target=fire, args=(i,)) for i in range(same_time)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a request hung"
        for api in sessions:
            api.close()
        statuses = Counter(r.status_code for r in responses)
        assert not [s for s in statuses if s >= 500], statuses
        assert set(statuses) <= {200, 409}, statuses
        oks = [r for r in responses if r.status_code == 200]
        assert oks, statuses
        assert len({r.content for r in oks}) == 1, "every 200 carries the same bytes"
        assert sum("Idempotent-Replayed" not in r.headers for r in oks) <= 1
        for r in responses:
            if r.status_code == 409:
                assert r.headers["Content-Type"].startswith("application/problem+json")
        burst_changesets = Changeset.objects.filter(comment="request 10000").count()
        assert burst_changesets == 1

        # The same key with another body, or at another endpoint: 422.
        api = Api(server.url, alice_token)
        other_body = api.post(
            "/api/v1/batch", json=batch_body(10_001), headers={"Idempotency-Key": key}
        )
        other_endpoint = api.put(
            f"/api/v1/entities/{NS}/item/x", json={"content": {}}, headers={"Idempotency-Key": key}
        )
        assert other_body.status_code == 422, other_body.text
        assert other_endpoint.status_code == 422, other_endpoint.text
        for r in (other_body, other_endpoint):
            assert r.headers["Content-Type"].startswith("application/problem+json")
            assert r.json()["status"] == 422
        api.close()

        # The same key from two users: independent.
        shared = f"shared-{uuid.uuid4().hex}"
        results = {}
        for name, token, n in (("alice", alice_token, 20_000), ("bob", bob_token, 20_001)):
            user_api = Api(server.url, token)
            results[name] = user_api.post(
                "/api/v1/batch", json=batch_body(n), headers={"Idempotency-Key": shared}
            )
            user_api.close()
        for r in results.values():
            assert r.status_code == 200, r.text
            assert "Idempotent-Replayed" not in r.headers
        authors = {
            c.author_name
            for c in Changeset.objects.filter(comment__in=["request 20000", "request 20001"])
        }
        assert authors == {"alice", "bob"}
    assert alice  # the users exist for the run
    record(
        "idempotent_concurrency",
        identical_concurrent_requests=same_time,
        statuses=dict(statuses),
        changesets_written=burst_changesets,
        replays_among_200=sum("Idempotent-Replayed" in r.headers for r in oks),
        other_body="422",
        other_endpoint="422",
        two_users_same_key="independent (2 changesets)",
    )
