"""Crashes and faults (issue 7, items 5-7; docs/reliability.md).

- Push fan-out while Celery workers and beat are SIGKILLed (real Redis, real
  ``celery worker`` / ``celery beat`` processes; skips loudly without Redis).
- A process that dies right after commit, before the post-commit publish,
  and two ``recover_batches`` finishing the leftovers at once.
- PostgreSQL restarted under an HTTP write load, on a throw-away cluster of
  the test's own (never the shared embedded one, never port 5432); a keyed
  request that met the outage can be retried with its key.
- A transaction that stalls after drawing seq (holding the log head) is ended
  by PostgreSQL's ``idle_in_transaction_session_timeout``; the other writers go
  on, the stalled request gets a 503 and leaves nothing behind.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import requests
from django.db import connection

from changesets.hooks import in_write_transaction
from changesets.models import (
    BASELINE,
    Changeset,
    JournalEntry,
    JournalPhase,
    LogHead,
    Revision,
    Rpc,
)
from changesets.ops import PutOp
from changesets.outbox.subscriptions import subscription_create, subscription_lag
from changesets.services.apply import changeset_apply
from entities.store import EntityKey, baseline
from tests.changesets.worker_helpers import real_broker, receiver_factory, worker_factory
from tests.reliability.harness import (
    BASE_DIR,
    Api,
    Beat,
    ThrowawayPostgres,
    child_env,
    database_url_of_tests,
    gunicorn,
    latency_summary,
    load,
    manage,
    percentile,
    principal,
    publishing,
    record,
    sized,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def all_event_ids() -> list[str]:
    return [
        f"{r.changeset_id}:{r.namespace}/{r.kind}/{r.slug}"
        for r in Revision.objects.filter(branch=BASELINE).order_by("seq", "id")
    ]


# --- 5. push fan-out under faults --------------------------------------------------------------


def test_push_fan_out_survives_sigkilled_workers_and_beat(settings):
    """N changesets, 3 subscribers (one failing 10 % with 500s and timeouts), the Celery
    worker SIGKILLed every 20 s (bounded: once) and beat once. After draining, every
    receiver de-duplicating by event_id holds exactly the committed records."""
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    total = sized(200, 5000)
    kill_every = 20.0
    timeout = 1.0  # the workers' webhook timeout; the flaky receiver stalls past it
    ns = "rel.push"
    staff, _ = principal("root", superuser=True)
    principal("pusher", writer_of=(ns,))  # creates the namespace
    rng = random.Random(5)
    arrivals: dict[str, list[tuple[float, Any]]] = {"a": [], "b": [], "flaky": []}
    lock = threading.Lock()

    faults: Counter[str] = Counter()

    def responder(name: str, flaky: bool):
        def respond(n: int, delivery: Any) -> int:
            with lock:
                arrivals[name].append((time.time(), delivery))
                roll = rng.random()
                if flaky and roll < 0.10:
                    faults["500" if roll < 0.05 else "stalled past the timeout"] += 1
            if flaky and roll < 0.05:
                return 500
            if flaky and roll < 0.10:
                time.sleep(timeout + 0.5)  # the pump gives up first: a timeout
            return 200

        return respond

    with (
        real_broker() as broker,
        receiver_factory() as make_receiver,
        worker_factory(broker) as start_worker,
    ):
        receivers = {
            "a": make_receiver(respond=responder("a", False)),
            "b": make_receiver(respond=responder("b", False)),
            "flaky": make_receiver(respond=responder("flaky", True)),
        }
        subs = {}
        for name, receiver in receivers.items():
            subs[name] = subscription_create(actor=None, name=name, url=receiver.url)
            receiver.secret = subs[name].secret
        worker_env = {"beat": False, "ATLAS_WEBHOOK_TIMEOUT_SECONDS": str(timeout)}
        beat = Beat(broker, ATLAS_WEBHOOK_TIMEOUT_SECONDS=str(timeout)).start()
        worker = start_worker(**worker_env)
        written = [0]
        errors: list[BaseException] = []

        def write_all() -> None:
            try:
                for i in range(total):
                    width = 1 + i % 2
                    ops = [
                        PutOp(EntityKey(ns, "item", f"i{i}-{j}"), {"i": i}) for j in range(width)
                    ]
                    changeset_apply(store=baseline, actor=staff, ops=ops, rpc=Rpc.BATCH_MUTATE)
                    written[0] += 1
                    time.sleep(0.01)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connection.close()

        writer = threading.Thread(target=write_all, daemon=True)
        started = time.monotonic()
        writer.start()
        kills, beat_kills = 0, 0
        next_kill = started + kill_every
        deadline = started + sized(240, 1500)

        def drained() -> bool:
            if writer.is_alive():
                return False
            if JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).exists():
                return False
            for sub in subs.values():
                sub.refresh_from_db()
                if subscription_lag(sub):
                    return False
            return True

        try:
            while time.monotonic() < deadline:
                now = time.monotonic()
                bounded_kill = not kills and written[0] >= total // 2
                if (sized(bounded_kill, now >= next_kill)) and kills < 200:
                    worker.kill()  # SIGKILL, worker and pool children
                    kills += 1
                    if not beat_kills:
                        beat.kill()
                        beat_kills += 1
                        beat = Beat(broker, ATLAS_WEBHOOK_TIMEOUT_SECONDS=str(timeout)).start()
                    worker = start_worker(**worker_env)
                    next_kill = time.monotonic() + kill_every
                if drained():
                    break
                time.sleep(0.5)
            drain_seconds = time.monotonic() - started
            assert not errors, errors
            assert drained(), "the subscriptions did not drain in time"
        finally:
            beat.stop()

    expected = all_event_ids()
    committed = Changeset.objects.filter(branch=BASELINE).count()
    assert committed == total
    ats = dict(
        (str(cid), at.timestamp())
        for cid, at in Changeset.objects.filter(branch=BASELINE).values_list("id", "at")
    )
    figures: dict[str, Any] = {}
    for name, receiver in receivers.items():
        accepted = receiver.accepted()
        ids = [r["event_id"] for d in accepted for r in d.records]
        assert set(ids) == set(expected), f"{name}: lost or unexpected records"
        assert all(d.signature_ok for d in receiver.deliveries), name
        # New records arrive in seq order (a redelivery repeats earlier ones).
        first_seen = list(dict.fromkeys(ids))
        assert first_seen == expected, f"{name}: first arrivals out of seq order"
        first_arrival: dict[str, float] = {}
        for at, delivery in arrivals[name]:
            if 200 <= delivery.status < 300:
                for r in delivery.records:
                    first_arrival.setdefault(r["event_id"], at)
        lags = [first_arrival[e] - ats[e.split(":", 1)[0]] for e in expected if e in first_arrival]
        figures[name] = {
            "deliveries": len(receiver.deliveries),
            "records_accepted": len(ids),
            "duplicate_rate": round((len(ids) - len(expected)) / len(expected), 4),
            "lag_p50_s": round(percentile(lags, 50), 2),
            "lag_p99_s": round(percentile(lags, 99), 2),
            "lag_max_s": round(max(lags), 2),
        }
    record(
        "push_fan_out_under_faults",
        changesets=total,
        records=len(expected),
        worker_sigkills=kills,
        beat_sigkills=beat_kills,
        seconds_to_drain=round(drain_seconds, 1),
        receivers=figures,
        flaky_faults=dict(faults),
    )


# --- 6. a crash between commit and enqueue ----------------------------------------------------


def test_a_crash_after_commit_before_publish_is_finished_by_recover_batches(settings, tmp_path):
    """Each request's process dies right after COMMIT, before the journal task is
    published (gunicorn worker ``os._exit`` in the post-commit hook). The client gets
    no answer, but the changeset is whole in the log with its journal entry. Two
    ``recover_batches`` at once then finish every entry exactly once (hooks ran once
    per changeset) and the subscription receives every record."""
    settings.ATLAS_ALLOW_PRIVATE_WEBHOOKS = True
    n = sized(20, 100)
    ns = "rel.crash"
    _, token = principal("crasher", writer_of=(ns,))
    db = database_url_of_tests()
    with receiver_factory() as make_receiver:
        receiver = make_receiver()
        sub = subscription_create(actor=None, name="crash", url=receiver.url)
        receiver.secret = sub.secret
        with (
            publishing() as pub,
            gunicorn(db, workers=2, hooks="crash_after_commit", env=pub) as server,
        ):
            api = Api(server.url, token, timeout=30)
            outcomes: Counter[str] = Counter()
            for i in range(n):
                try:
                    response = api.put(
                        f"/api/v1/entities/{ns}/item/c{i}", json={"content": {"i": i}}
                    )
                    outcomes[f"http {response.status_code}"] += 1
                except requests.ConnectionError:
                    outcomes["connection dropped"] += 1
                api.close()
                api = Api(server.url, token, timeout=30)
            api.close()
            restarts = server.log().count("exited with code 17") or None
        assert outcomes == {"connection dropped": n}, outcomes
        assert Changeset.objects.filter(branch=BASELINE).count() == n
        outstanding = JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).count()
        assert outstanding == n, "each changeset is committed, its post-commit work not done"
        report = manage(db, "recover_batches", "--report-only")
        assert report.returncode == 0 and f"{n} outstanding journal entries" in report.stdout

        # Two recover_batches at once; each hook run is logged (slowed so they overlap).
        hook_log = tmp_path / "hooks.log"
        env = child_env(db, CELERY_TASK_ALWAYS_EAGER="1", ATLAS_ALLOW_PRIVATE_WEBHOOKS="1")
        argv = [sys.executable, "-m", "tests.reliability.harness", "manage"]
        argv += ["--hook-log", str(hook_log), "--hook-sleep", "0.05", "--"]
        argv += ["recover_batches", "--no-progress", "--wait", "60"]
        runs = [
            subprocess.Popen(
                argv, cwd=BASE_DIR, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for _ in range(2)
        ]
        outputs = [run.communicate(timeout=300)[0].decode(errors="replace") for run in runs]
        assert [run.returncode for run in runs] == [0, 0], outputs

    lines = hook_log.read_text().split()
    hook_runs = Counter(lines[1::2])
    pids = Counter(lines[0::2])
    ids = {str(c) for c in Changeset.objects.filter(branch=BASELINE).values_list("id", flat=True)}
    assert set(hook_runs) == ids and set(hook_runs.values()) == {1}, "a hook ran twice or never"
    assert not JournalEntry.objects.filter(phase=JournalPhase.COMMITTED).exists()
    assert receiver.event_ids() == set(all_event_ids())
    published = [int(o.split("Published ")[1].split(";")[0]) for o in outputs]
    assert sum(published) == n, outputs
    record(
        "crash_between_commit_and_publish",
        requests=n,
        client_outcomes=dict(outcomes),
        worker_exits_logged=restarts,
        outstanding_after_crashes=outstanding,
        published_by_each_recover_batches=published,
        hook_runs_by_process=sorted(pids.values()),
        hooks_run_twice=0,
        records_delivered=len(receiver.event_ids()),
    )


# --- 7. PostgreSQL restarted under load ---------------------------------------------------------


SETUP_SCRIPT = """
from atlas.services import api_token_create
from tests.entities.factories import NamespaceFactory, UserFactory
from entities.services import role_grant
user = UserFactory(username="loader")
role_grant(namespace=NamespaceFactory(name="rel.pg"), principal=user, role="writer")
print("TOKEN", api_token_create(user=user, name="loader")[1])
"""


@pytest.fixture(scope="module")
def throwaway_database() -> Iterator[tuple[ThrowawayPostgres, str, str]]:
    """A PostgreSQL cluster of this module's own, migrated, with a writer and its token."""
    pg = ThrowawayPostgres().init()
    try:
        pg.start()
        pg.create_database("atlas_reliability")
        url = pg.url("atlas_reliability")
        migrated = manage(url, "migrate", "--noinput", timeout=600)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        setup = manage(url, "shell", "-c", SETUP_SCRIPT)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        yield pg, url, setup.stdout.split("TOKEN ")[1].split()[0]
    finally:
        pg.destroy()


def _classify(response: requests.Response) -> str:
    if response.status_code in (200, 201):
        return str(response.status_code)
    if response.status_code == 503:
        body = response.json()
        assert response.headers["Content-Type"].startswith("application/problem+json")
        assert body["status"] == 503 and body["type"], body
        assert response.headers.get("Retry-After") == "5"
        return "503"
    return f"unexpected {response.status_code}: {response.text[:300]}"


def test_postgresql_restarted_under_write_load(throwaway_database):
    """Writes over HTTP while the database is stopped and started again: every
    response is a 2xx or a 503 problem+json (or a dropped connection), none hangs,
    the service recovers by itself, every acknowledged write is in the log, the hash
    chain verifies and every changeset is whole."""
    seconds = sized(14.0, 75.0)
    restarts_at = sized([4.0], [10.0, 30.0, 50.0])
    down_for = sized(3.0, 5.0)
    client_timeout = 20.0
    pg, url, token = throwaway_database

    events: list[tuple[float, str]] = []
    acknowledged: list[str] = []
    lock = threading.Lock()
    env = {"ATLAS_DB_CONNECT_TIMEOUT": "2", "CELERY_TASK_ALWAYS_EAGER": "1"}
    with gunicorn(url, workers=2, threads=4, env=env) as server:
        sessions = [Api(server.url, token, timeout=client_timeout) for _ in range(6)]

        def step(n: int, i: int) -> str:
            api = sessions[n]
            try:
                if i % 3 == 2:
                    ops = [
                        {
                            "op": "put",
                            "namespace": "rel.pg",
                            "kind": "item",
                            "slug": f"b{n}-{i}-{j}",
                            "content": {"i": i, "j": j},
                        }
                        for j in range(3)
                    ]
                    response = api.post("/api/v1/batch", json={"ops": ops})
                else:
                    slug = f"s{n}-{i % 10}"  # creates, then updates of the same keys
                    response = api.put(
                        f"/api/v1/entities/rel.pg/item/{slug}", json={"content": {"i": i}}
                    )
            except requests.Timeout:
                outcome = "hang"
            except requests.ConnectionError:
                outcome = "connection error"
            else:
                outcome = _classify(response)
                if outcome in ("200", "201"):
                    with lock:
                        acknowledged.append(response.json()["changeset"]["id"])
            with lock:
                events.append((time.monotonic(), outcome))
            return outcome

        started = time.monotonic()
        downs: list[tuple[float, float]] = []

        def chaos() -> None:
            for at in restarts_at:
                time.sleep(max(0.0, started + at - time.monotonic()))
                stopped = time.monotonic()
                pg.stop("fast")  # terminates every session: transactions in flight abort
                time.sleep(down_for)
                pg.start()
                downs.append((stopped, time.monotonic()))

        chaos_thread = threading.Thread(target=chaos, daemon=True)
        chaos_thread.start()
        result = load(step, threads=len(sessions), max_count=1_000_000, max_seconds=seconds)
        chaos_thread.join(120)
        # Afterwards, with the database back: the service answers again by itself.
        after = Api(server.url, token, timeout=client_timeout)
        probe = after.put("/api/v1/entities/rel.pg/item/after", json={"content": {"ok": 1}})
        ready = after.get("/readyz")
        after.close()
        for api in sessions:
            api.close()
    assert not result.errors, result.errors[:3]
    assert result.hung == 0
    assert probe.status_code == 201 and ready.status_code == 200, (probe.text, ready.text)
    acknowledged.append(probe.json()["changeset"]["id"])
    counts = Counter(outcome for _, outcome in events)
    unexpected = {
        k: v for k, v in counts.items() if k not in ("200", "201", "503", "connection error")
    }
    assert not unexpected, unexpected
    assert counts["503"] >= 1, f"no request met the outage: {counts}"
    assert len(downs) == len(restarts_at)
    # Recovery: the first success after each restart.
    recovery = []
    for _stopped, back in downs:
        firsts = [t for t, o in events if t > back and o in ("200", "201")]
        assert firsts, "no success after the database came back"
        recovery.append(round(firsts[0] - back, 2))
    outage_outcomes = Counter(o for t, o in events if any(s <= t <= b + 1 for s, b in downs))

    verify = manage(url, "verify_log", "--no-progress")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with psycopg.connect(url) as conn:
        half = conn.execute(
            "SELECT c.id FROM changesets_changeset c LEFT JOIN changesets_revision r"
            " ON r.changeset_id = c.id GROUP BY c.id, c.op_count"
            " HAVING count(r.id) <> c.op_count"
        ).fetchall()
        stored = {str(r[0]) for r in conn.execute("SELECT id FROM changesets_changeset")}
        # The entity table is the fold of the log: each key's last revision.
        folded = {
            (ns, kind, slug): (version, content)
            for ns, kind, slug, version, content in conn.execute(
                "SELECT DISTINCT ON (namespace, kind, slug) namespace, kind, slug,"
                " after_version, after FROM changesets_revision WHERE branch = ''"
                " ORDER BY namespace, kind, slug, seq DESC"
            )
            if version is not None
        }
        table = {
            (ns, kind, slug): (version, content)
            for ns, kind, slug, version, content in conn.execute(
                "SELECT namespace_id, kind, slug, version, content FROM entities_entity"
            )
        }
        drift = sorted(k for k in folded.keys() | table.keys() if folded.get(k) != table.get(k))
        n_changesets = len(stored)
    assert half == [], f"changesets whose revisions do not match op_count: {half}"
    assert drift == [], f"entities that disagree with their last revision: {drift}"
    missing = set(acknowledged) - stored
    assert not missing, f"acknowledged writes missing from the log: {sorted(missing)[:5]}"
    record(
        "postgresql_restart_under_load",
        seconds=round(result.seconds, 1),
        restarts=len(downs),
        database_down_seconds_each=down_for,
        requests=len(events),
        outcomes=dict(counts),
        outcomes_during_outages=dict(outage_outcomes),
        recovery_after_restart_seconds=recovery,
        changesets=n_changesets,
        request_latency=latency_summary(result.latencies),
        verify_log="ok",
    )


def test_an_idempotency_key_that_met_a_database_outage_can_be_retried(throwaway_database):
    """A keyed PUT is inside its write transaction when PostgreSQL stops: the client
    gets a 503 and nothing is written. Once the database is back, the client retries
    with the same key, as API.md invites after a 5xx. The retry should run (nothing was
    written), not answer 409 for a day."""
    pg, url, token = throwaway_database
    key = f"outage-{time.time_ns()}"
    path = "/api/v1/entities/rel.pg/item/idempotent-outage"
    env = {"ATLAS_DB_CONNECT_TIMEOUT": "2", "CELERY_TASK_ALWAYS_EAGER": "1"}
    with gunicorn(url, workers=1, threads=2, hooks="slow_write=3", env=env) as server:
        api = Api(server.url, token, timeout=30)
        answer: list[Any] = []

        def send() -> None:
            answer.append(
                api.put(path, json={"content": {"n": 1}}, headers={"Idempotency-Key": key})
            )

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.5)  # the key is claimed; the write lingers in its transaction
        pg.stop("fast")
        sender.join(30)
        time.sleep(1)
        pg.start()
        assert answer and answer[0].status_code == 503, answer
        with psycopg.connect(url) as conn:
            written = conn.execute(
                "SELECT count(*) FROM changesets_revision WHERE slug = 'idempotent-outage'"
            ).fetchone()[0]
        assert written == 0, "the first attempt wrote nothing"
        retry = api.put(path, json={"content": {"n": 1}}, headers={"Idempotency-Key": key})
        api.close()
    # Nothing was written by the first attempt, so the retry must do the write.
    assert retry.status_code == 201, (retry.status_code, retry.text)
    assert "Idempotent-Replayed" not in retry.headers
    with psycopg.connect(url) as conn:
        written = conn.execute(
            "SELECT count(*) FROM changesets_revision WHERE slug = 'idempotent-outage'"
        ).fetchone()[0]
    assert written == 1


# --- A stalled transaction holding the log head ---------------------------------------------


def test_database_sessions_get_the_idle_timeout_and_keepalives_from_the_environment():
    """The settings reach every new session (docs/api.md, Settings)."""
    script = (
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SHOW idle_in_transaction_session_timeout')\n"
        "    print('TIMEOUT', c.fetchone()[0])\n"
        "p = connection.connection.info.get_parameters()\n"
        "print('KEEPALIVES', p.get('keepalives'), p.get('keepalives_idle'),"
        " p.get('keepalives_interval'), p.get('keepalives_count'))\n"
    )
    url = database_url_of_tests()
    default = manage(url, "shell", "-c", script)
    assert default.returncode == 0, default.stderr
    assert "TIMEOUT 1min" in default.stdout
    assert "KEEPALIVES 1 30 10 3" in default.stdout
    tuned = manage(
        url,
        "shell",
        "-c",
        script,
        ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS="7",
        ATLAS_DB_KEEPALIVES_IDLE_SECONDS="11",
    )
    assert "TIMEOUT 7s" in tuned.stdout, tuned.stdout + tuned.stderr
    assert "KEEPALIVES 1 11 10 3" in tuned.stdout
    off = manage(
        url,
        "shell",
        "-c",
        script,
        ATLAS_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS="0",
        ATLAS_DB_KEEPALIVES_IDLE_SECONDS="0",
    )
    assert "TIMEOUT 0" in off.stdout, off.stdout + off.stderr
    assert "KEEPALIVES None None None None" in off.stdout


def test_a_transaction_stalled_after_drawing_seq_is_ended_and_writers_go_on(make_user, client_for):
    """A keyed PUT stalls inside its write transaction right after drawing seq (the
    log head's row lock held), on a session whose idle timeout is 1 s. PostgreSQL
    ends it; a writer queued behind the log head commits long before the stall
    would have ended; the stalled request answers 503 problem+json and leaves no
    changeset, no revision and no seq behind; the log verifies; a retry with the
    same key runs the write."""
    stall_seconds, timeout_ms = 6.0, 1000
    user = make_user("stalled", writer=["rel.stall"])
    path = "/api/v1/entities/rel.stall/item/stalled"
    drawn = threading.Event()
    answer: list[Any] = []
    failures: list[BaseException] = []

    def hold_the_head(changeset: Any) -> None:
        drawn.set()  # the changeset row exists: seq is drawn, the head is locked
        time.sleep(stall_seconds)  # a paused process: the session idles in its transaction

    def stalled_request() -> None:
        try:
            with connection.cursor() as cursor:  # this thread's own session
                cursor.execute(f"SET idle_in_transaction_session_timeout = {timeout_ms}")
            api = client_for(user)
            with in_write_transaction(hold_the_head):
                answer.append(
                    api.put(
                        path,
                        {"content": {"n": 1}},
                        format="json",
                        headers={"Idempotency-Key": "stall-1"},
                    )
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)
        finally:
            connection.close()

    LogHead.objects.get_or_create(pk=1)  # a transactional test starts from flushed tables
    head_before = LogHead.objects.get(pk=1).seq
    staller = threading.Thread(target=stalled_request, daemon=True)
    staller.start()
    assert drawn.wait(30), failures
    started = time.monotonic()
    other = changeset_apply(
        store=baseline,
        actor=user,
        ops=[PutOp(EntityKey("rel.stall", "item", "other"), {"n": 2})],
        rpc=Rpc.PUT_ENTITY,
    )
    waited = time.monotonic() - started
    staller.join(stall_seconds + 30)
    assert not staller.is_alive() and failures == [], failures

    assert waited < stall_seconds - 2, f"the writer waited {waited:.1f} s for the stalled one"
    response = answer[0]
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response["Retry-After"] == "5"
    assert response.json()["status"] == 503
    assert not Revision.objects.filter(slug="stalled").exists()
    assert other.changeset is not None and other.changeset.seq == head_before + 1
    assert LogHead.objects.get(pk=1).seq == head_before + 1, "the stalled seq rolled back"
    verify = manage(database_url_of_tests(), "verify_log", "--no-progress")
    assert verify.returncode == 0, verify.stdout + verify.stderr

    retry = client_for(user).put(
        path, {"content": {"n": 1}}, format="json", headers={"Idempotency-Key": "stall-1"}
    )
    assert retry.status_code == 201, retry.content
    assert Revision.objects.filter(slug="stalled").count() == 1
    record(
        "stalled_transaction_ended",
        idle_in_transaction_session_timeout_ms=timeout_ms,
        stall_seconds=stall_seconds,
        other_writer_waited_seconds=round(waited, 2),
        stalled_request="503",
        retry_with_same_key="201",
    )
