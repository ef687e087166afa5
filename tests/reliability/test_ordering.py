"""Concurrency and ordering (issue 7, items 1-4; docs/reliability.md).

Bounded sizes run in ``make test``; ``ATLAS_STRESS=1`` (``make stress``) runs
the full sizes. Every test commits for real against pytest-django's test
database, with writers in other *processes* and readers over real HTTP
(gunicorn) where the item asks for it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from changesets.models import BASELINE, Changeset, Revision, Rpc
from changesets.ops import PutOp
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.reliability.harness import (
    Api,
    collect_writers,
    database_url_of_tests,
    gunicorn,
    latency_summary,
    load,
    principal,
    publishing,
    record,
    sized,
    start_writer,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def tail_feed(api: Api, stop: threading.Event, out: list[dict], *, limit: int, deadline: float):
    """Follow /changes until ``stop`` is set and a page after that comes back empty."""
    cursor = None
    pages = 0
    while time.monotonic() < deadline:
        done = stop.is_set()  # read before the page: an empty page after it means caught up
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["since"] = cursor
        response = api.get("/api/v1/changes", params=params)
        assert response.status_code == 200, response.text
        page = response.json()
        out.extend(page["records"])
        cursor = page["next_cursor"]
        pages += 1
        if not page["records"]:
            if done:
                return pages
            time.sleep(0.05)
    raise AssertionError("the feed reader did not catch up in time")


def group_by_changeset(records: list[dict]) -> list[tuple[str, int, int]]:
    """``(changeset_id, seq, records)`` in read order; a changeset's records must be adjacent."""
    groups: list[tuple[str, int, int]] = []
    for r in records:
        if groups and groups[-1][0] == r["changeset_id"]:
            cid, seq, n = groups[-1]
            assert r["seq"] == seq
            groups[-1] = (cid, seq, n + 1)
        else:
            groups.append((r["changeset_id"], r["seq"], 1))
    return groups


# --- 1. feed completeness ---------------------------------------------------------------------


def test_feed_completeness_with_writer_processes_pauses_and_rollbacks(tmp_path):
    """N writer processes × M changesets, pausing 0-50 ms inside each transaction (mostly
    before drawing seq, 10 % right after it, i.e. holding the log head's lock) and 2 %
    rolling back after drawing seq, while a reader tails GET /changes over HTTP: the ids
    read equal the ids committed, each exactly once, whole; per entity, versions arrive
    strictly increasing by 1."""
    writers, per_writer = sized((4, 150), (8, 2000))
    ns = "rel.feed"
    _, token = principal("root", superuser=True)
    principal("feeder", writer_of=(ns,))
    db = database_url_of_tests()
    folder = tmp_path
    keys = [f"k{n:02d}" for n in range(40)]  # shared across writers: row contention too
    records: list[dict] = []
    stop = threading.Event()
    reader_outcome: list[Any] = []
    started = time.monotonic()

    with publishing() as pub, gunicorn(db, workers=2, env=pub) as server:
        api = Api(server.url, token)

        def reader() -> None:
            try:
                reader_outcome.append(
                    tail_feed(api, stop, records, limit=37, deadline=time.monotonic() + 3000)
                )
            except BaseException as exc:  # noqa: BLE001 - judged below
                reader_outcome.append(exc)

        tail = threading.Thread(target=reader, daemon=True)
        tail.start()
        children = [
            start_writer(
                db,
                {
                    "writer": n,
                    "count": per_writer,
                    "actor": "feeder",
                    "namespace": ns,
                    "keys": keys,
                    "width_max": 3,
                    "pause_ms": [0, 50],
                    "after_seq_fraction": 0.1,
                    "rollback": 0.02,
                    "delete": 0.03,
                    "seed": 1000 + n,
                    "max_seconds": sized(240, 1500),
                },
                folder,
                **pub,
            )
            for n in range(writers)
        ]
        run = collect_writers(children, timeout=sized(300, 1800))
        write_seconds = time.monotonic() - started
        stop.set()
        tail.join(sized(120, 600))
        assert not tail.is_alive(), "the reader hung"
        api.close()
    assert reader_outcome and not isinstance(reader_outcome[0], BaseException), reader_outcome

    committed = {c["id"]: c for c in run.committed}
    assert len(committed) == writers * per_writer, "each writer commits its full count"
    db_rows = list(
        Changeset.objects.filter(branch=BASELINE)
        .order_by("seq")
        .values_list("id", "seq", "op_count")
    )
    # Writers committed what the database holds, no more (rolled-back attempts left nothing).
    assert {str(cid) for cid, _, _ in db_rows} == set(committed)
    assert [seq for _, seq, _ in db_rows] == list(range(1, len(db_rows) + 1)), "seq has gaps"
    groups = group_by_changeset(records)
    read_counts = Counter(cid for cid, _, _ in groups)
    assert [cid for cid, n in read_counts.items() if n > 1] == [], "read twice, or split"
    assert set(read_counts) == set(committed), "ids read != ids committed"
    assert [(cid, seq, n) for cid, seq, n in groups] == [
        (str(cid), seq, n) for cid, seq, n in db_rows
    ], "every changeset once, whole, in seq order"
    # Per entity, versions strictly increase by one (deletes carry no version and
    # a re-created key continues after its last version).
    per_key: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r["version"] is not None:
            per_key[f"{r['namespace']}/{r['kind']}/{r['slug']}"].append(r["version"])
    for name, versions in per_key.items():
        assert versions == list(range(1, len(versions) + 1)), f"{name}: {versions[:20]}"
    # What the writers were told matches what the feed says.
    feed_versions = {
        (r["changeset_id"], f"{r['namespace']}/{r['kind']}/{r['slug']}"): r["version"]
        for r in records
    }
    for cid, item in committed.items():
        for name, version in item["versions"].items():
            assert feed_versions[(cid, name)] == version

    record(
        "feed_completeness",
        writers=writers,
        changesets_per_writer=per_writer,
        committed=len(committed),
        rolled_back=len(run.rolled_back),
        records_read=len(records),
        pages_read=reader_outcome[0],
        entities=len(per_key),
        seconds=round(write_seconds, 1),
        write_latency=latency_summary([c["seconds"] for c in run.committed]),
    )


# --- 2. an in-flight writer -------------------------------------------------------------------


def release(control: Path, what: str) -> None:
    """Tell the held writer what to do (atomically: it must never read a half-written file)."""
    tmp = control / "release.tmp"
    tmp.write_text(what)
    tmp.rename(control / "release")


POLL = 0.5  # the reader's poll interval, seconds


def _lock_waiters() -> int:
    """Backends of this database waiting for a lock right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    "where,outcome",
    [
        ("after_seq", "commit"),
        ("after_seq", "rollback"),
        ("before_seq", "commit"),
        ("before_seq", "rollback"),
    ],
)
def test_an_in_flight_writer_is_never_passed_by_the_feed(where, outcome, client_for, tmp_path):
    """One write transaction stays open for ``hold`` seconds while others commit.

    ``after_seq``: it has drawn its seq, so it holds the log head's row lock and
    every other writer *waits* behind it (none commits during the hold).
    ``before_seq``: it holds only its entity rows; the others commit, the feed
    moves on without it, and it takes a seq after theirs when it commits.
    Either way the feed never skips it: once committed it is read within two
    poll intervals; rolled back, the feed moves on within 5 s.
    """
    from tests.reliability.harness import BASE_DIR, child_env

    hold, others = sized((5.0, 100), (30.0, 1000))
    ns = "rel.hold"
    staff, _ = principal("root", superuser=True)
    writer, _ = principal("holder", writer_of=(ns,))
    reader = client_for(staff)
    changeset_apply(
        store=baseline,
        actor=writer,
        ops=[PutOp(EntityKey(ns, "item", "warm"), {})],
        rpc=Rpc.PUT_ENTITY,
    )
    control = tmp_path
    import subprocess
    import sys

    spec = {"control": str(control), "actor": "holder", "key": f"{ns}/item/held", "where": where}
    held = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability.harness", "hold", "--spec", json.dumps(spec)],
        cwd=BASE_DIR,
        env=child_env(database_url_of_tests(), CELERY_TASK_ALWAYS_EAGER="1"),
        start_new_session=True,
    )
    records: list[dict] = []
    marks: list[tuple[float, int]] = []
    cursor: list[str | None] = [None]

    def poll() -> dict:
        params: dict[str, Any] = {"limit": 1000}
        if cursor[0] is not None:
            params["since"] = cursor[0]
        response = reader.get("/api/v1/changes", params)
        assert response.status_code == 200, response.content
        page = response.json()
        records.extend(page["records"])
        cursor[0] = page["next_cursor"]
        marks.append((time.monotonic(), page["watermark"]["seq"]))
        return page

    try:
        wait_until(lambda: (control / "held").exists(), timeout=60, what="the writer to stop")
        held_seq = json.loads((control / "held").read_text())["seq"]
        poll()
        base_seq = marks[-1][1]  # the watermark when the hold began
        if where == "after_seq":
            assert held_seq == base_seq + 1

        committed_others: list[Any] = []
        errors: list[BaseException] = []

        def other_writer(n: int, count: int) -> None:
            try:
                for i in range(count):
                    result = changeset_apply(
                        store=baseline,
                        actor=writer,
                        ops=[PutOp(EntityKey(ns, "item", f"o{n}-{i}"), {"i": i})],
                        rpc=Rpc.PUT_ENTITY,
                    )
                    committed_others.append((time.monotonic(), result.changeset.seq))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        threads = [
            threading.Thread(target=other_writer, args=(n, others // 4), daemon=True)
            for n in range(4)
        ]
        hold_started = time.monotonic()
        for t in threads:
            t.start()
        waiting = 0
        while time.monotonic() - hold_started < hold:
            time.sleep(POLL)
            page = poll()
            waiting = max(waiting, _lock_waiters())
            # The feed never passes a seq the in-flight writer holds.
            if where == "after_seq":
                assert page["watermark"]["seq"] == base_seq, "the watermark passed the held seq"
                assert not page["records"], "a record after the held seq was visible"
        during_hold = len(committed_others)
        release(control, outcome)
        wait_until(lambda: (control / "done").exists(), timeout=60, what="the held writer")
        done = json.loads((control / "done").read_text())
        # Wall clock of the child's commit, as this process's monotonic clock.
        done_at = time.monotonic() - (time.time() - done["at"])

        # Tail until every other writer is done and the feed caught up.
        deadline = time.monotonic() + sized(60, 300)
        seen_held_at = None
        first_after_rollback = None
        while time.monotonic() < deadline:
            page = poll()
            now = time.monotonic()
            cids = {r["changeset_id"] for r in page["records"]}
            if done["outcome"] == "committed" and seen_held_at is None and done["id"] in cids:
                seen_held_at = now
            if (
                done["outcome"] == "rolled_back"
                and first_after_rollback is None
                and page["watermark"]["seq"] > base_seq
            ):
                first_after_rollback = now
            if not any(t.is_alive() for t in threads) and not page["records"]:
                break
            time.sleep(POLL)
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert not any(t.is_alive() for t in threads)
    finally:
        if not (control / "release").exists():
            release(control, "rollback")
        held.wait(60)

    assert done["outcome"] == ("committed" if outcome == "commit" else "rolled_back")
    db_ids = [
        str(cid)
        for cid in Changeset.objects.filter(branch=BASELINE)
        .order_by("seq")
        .values_list("id", flat=True)
    ]
    groups = group_by_changeset(records)
    assert [cid for cid, _, _ in groups] == db_ids, "the feed skipped or repeated a changeset"
    figures: dict[str, Any] = {
        "where": where,
        "outcome": outcome,
        "hold_seconds": hold,
        "others": others,
        "others_committed_during_hold": during_hold,
        "max_backends_waiting_for_a_lock": waiting,
        "poll_interval": POLL,
    }
    if where == "after_seq":
        assert during_hold == 0, "nobody can commit while a drawn seq is uncommitted"
        assert waiting >= 1, "the other writers should have been waiting for the head lock"
    if done["outcome"] == "committed":
        assert seen_held_at is not None, "the held changeset never reached the feed"
        lag = seen_held_at - done_at
        figures["delivered_after_commit_seconds"] = round(lag, 3)
        assert lag <= 2 * POLL + 0.25, f"delivered {lag:.2f}s after its commit"
        held_row = Changeset.objects.get(pk=done["id"])
        if where == "after_seq":
            assert held_row.seq == held_seq == base_seq + 1
        else:  # it drew its seq at commit time: after everything committed during the hold
            assert held_row.seq > max((s for _, s in committed_others[:during_hold]), default=0)
    else:
        assert first_after_rollback is not None
        moved_on = first_after_rollback - done_at
        figures["feed_moved_on_after_rollback_seconds"] = round(moved_on, 3)
        assert moved_on <= 5.0
        if where == "after_seq":  # the rolled-back draw left no gap: the next writer got it
            assert min(seq for _, seq in committed_others) == held_seq
        assert not Revision.objects.filter(slug="held").exists()
    if committed_others:
        first_other = min(t for t, _ in committed_others)
        figures["first_other_commit_after_hold_start_seconds"] = round(
            first_other - hold_started, 3
        )
    record("in_flight_writer", **figures)


# --- 3. lost-update freedom over HTTP --------------------------------------------------------


def test_read_modify_write_with_if_match_loses_no_update():
    """Clients GET an entity, add one to its counter and PUT it back with If-Match:
    per entity, successful writes == final version - initial version, the counter
    equals the initial value plus the successes, and contention produced 412s."""
    clients, seconds = sized((8, 8.0), (16, 60.0))
    ns = "rel.rmw"
    _, token = principal("rmw", writer_of=(ns,))
    entities = [f"e{n}" for n in range(10)]
    db = database_url_of_tests()
    with publishing() as pub, gunicorn(db, workers=2, threads=8, env=pub) as server:
        setup = Api(server.url, token)
        initial: dict[str, int] = {}
        for slug in entities:
            response = setup.put(
                f"/api/v1/entities/{ns}/counter/{slug}", json={"content": {"n": 0}}
            )
            assert response.status_code == 201, response.text
            initial[slug] = response.json()["entity"]["version"]
        sessions = [Api(server.url, token) for _ in range(clients)]
        successes: Counter[str] = Counter()
        written_versions: dict[str, list[int]] = defaultdict(list)
        lock = threading.Lock()

        def step(n: int, i: int) -> str:
            api = sessions[n]
            rng = random.Random(n * 100_003 + i)
            # Skewed choice: half the traffic on two entities, so contention is certain.
            slug = entities[rng.randrange(2)] if rng.random() < 0.5 else rng.choice(entities)
            path = f"/api/v1/entities/{ns}/counter/{slug}"
            got = api.get(path)
            assert got.status_code == 200, got.text
            etag = got.headers["ETag"]
            assert etag.startswith('"'), etag
            value = got.json()["content"]["n"]
            put = api.put(
                path, json={"content": {"n": value + 1, "by": n}}, headers={"If-Match": etag}
            )
            if put.status_code == 200:
                version = put.json()["entity"]["version"]
                assert put.headers["ETag"] == f'"{version}"'
                assert version == int(etag.strip('"')) + 1
                with lock:
                    successes[slug] += 1
                    written_versions[slug].append(version)
                return "ok"
            assert put.status_code == 412, (put.status_code, put.text)
            assert put.headers["Content-Type"].startswith("application/problem+json")
            return "412"

        result = load(step, threads=clients, max_count=10_000_000, max_seconds=seconds)
        finals = {}
        for slug in entities:
            body = setup.get(f"/api/v1/entities/{ns}/counter/{slug}").json()
            finals[slug] = (body["version"], body["content"]["n"])
        for api in [setup, *sessions]:
            api.close()

    assert not result.errors, result.errors[:3]
    assert result.hung == 0
    outcomes = Counter(result.outcomes)
    for slug in entities:
        version, counter = finals[slug]
        assert successes[slug] == version - initial[slug], slug
        assert counter == successes[slug], slug
        assert sorted(written_versions[slug]) == list(range(initial[slug] + 1, version + 1))
        # The log agrees: one revision per successful write, each moving the counter by one.
        revisions = list(Revision.objects.filter(namespace=ns, slug=slug).order_by("seq"))
        assert len(revisions) == successes[slug] + 1
        assert all(r.after["n"] == r.before["n"] + 1 for r in revisions[1:])
    assert outcomes["412"] >= 1, "no contention was observed"
    record(
        "lost_update_freedom",
        clients=clients,
        seconds=round(result.seconds, 1),
        entities=len(entities),
        successful_writes=outcomes["ok"],
        precondition_failures_412=outcomes["412"],
        rmw_cycle=latency_summary(result.latencies),
    )


# --- 4. the cost of commit ordering ----------------------------------------------------------


def test_ordering_cost_by_number_of_writers(tmp_path):
    """Changesets/s and write latency for 1, 2, 4 and 8 concurrent HTTP writers (PUTs of
    their own keys against gunicorn, so no row contention: only the log head orders
    them), with how long each write waited for the log head's lock and held it. A
    measurement: nothing is asserted about speed."""
    seconds = sized(1.0, 20.0)
    ns = "rel.cost"
    _, token = principal("cost", writer_of=(ns,))
    db = database_url_of_tests()
    stats = tmp_path
    levels = []
    with (
        publishing() as pub,
        gunicorn(db, workers=2, threads=4, hooks=f"time_seq={stats}", env=pub) as server,
    ):
        warm = Api(server.url, token)
        for n in range(8):
            assert warm.put(f"/api/v1/entities/{ns}/item/warm{n}", json={"content": {}}).ok
        warm.close()
        for writers in (1, 2, 4, 8):
            for f in stats.glob("seq-*.txt"):
                f.unlink()
            sessions = [Api(server.url, token) for _ in range(writers)]

            def step(n: int, i: int, sessions=sessions, writers=writers) -> int:
                path = f"/api/v1/entities/{ns}/item/c{writers}-{n}-{i}"
                response = sessions[n].put(path, json={"content": {"n": n, "i": i}})
                assert response.status_code == 201, response.text
                return response.status_code

            result = load(step, threads=writers, max_count=1_000_000, max_seconds=seconds)
            for api in sessions:
                api.close()
            assert not result.errors, result.errors[:3]
            waits, holds = [], []
            for f in stats.glob("seq-*.txt"):
                for line in f.read_text().split("\n"):
                    kind, _, value = line.partition(" ")
                    if kind == "wait":
                        waits.append(float(value))
                    elif kind == "hold":
                        holds.append(float(value))
            levels.append(
                {
                    "writers": writers,
                    "changesets": len(result.outcomes),
                    "changesets_per_second": round(len(result.outcomes) / result.seconds, 1),
                    "latency": latency_summary(result.latencies),
                    "head_lock_wait": latency_summary(waits),
                    "head_lock_held": latency_summary(holds),
                }
            )
    record("ordering_cost", transport="HTTP PUT, gunicorn 2 workers x 4 threads", levels=levels)
    assert all(level["changesets"] > 0 for level in levels)
