"""Atlas behind a pooler: a real PgBouncer in transaction mode, and Django's own pool.

docs/deploy.md, "Pooled (PgBouncer / RDS Proxy)". Three parts:

1. **Live scenarios.** gunicorn (``atlas/deploy/gunicorn.conf.py``, two
   workers of eight threads) serves Atlas on the test database, configured
   only through the environment as a deployment is, in two shapes: through
   PgBouncer in ``pool_mode = transaction`` with ``ATLAS_DB_POOLING=transaction``
   and four server connections for sixteen threads; and straight to PostgreSQL
   with Django's psycopg pool (``ATLAS_DB_POOL=1``). The same API,
   idempotency, concurrency and feed scenarios run against each, over HTTP.
   The journal relay runs as ``manage.py journal_relay`` through PgBouncer,
   polling, and listening on ``ATLAS_DIRECT_DATABASE_URL``.
2. **What the settings are for.** A witness that server-side prepared
   statements break behind PgBouncer 1.18 in transaction mode (why they are
   off), the settings each shape computes, and the pool's reset.
3. **The lease** (how an Idempotency-Key attempt holds its key without a
   session): what differs from the session lock, which tests/atlas/
   test_idempotency.py runs in both shapes.

Without the pgbouncer binary the PgBouncer parts skip, saying so (``make
pgbouncer`` installs it).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from atlas.api import idempotency
from atlas.models import IdempotencyRecord
from atlas.services import api_token_create
from atlas.settings import reset_pooled_session
from changesets.models import Changeset
from changesets.outbox import journal
from entities.api import views
from tests import pgbouncer
from tests.atlas.test_errors import assert_problem
from tests.changesets.worker_helpers import database_url_for_workers, wait_for

BASE_DIR = Path(__file__).resolve().parents[2]
API = "/api/v1"
ENTITY = f"{API}/entities/acme.orders/event/order.placed"
REPLAYED = "Idempotent-Replayed"
LOOPBACK = pgbouncer.LOOPBACK
THREADS = 8


# --- the live server --------------------------------------------------------------------


class Live:
    """gunicorn serving Atlas; ``call`` sends one request over a new connection."""

    def __init__(self, shape: str, port: int, bouncer: pgbouncer.PgBouncer | None) -> None:
        self.shape, self.port, self.bouncer = shape, port, bouncer

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=60)
        try:
            sent = {"Authorization": f"Token {token}", "Host": LOOPBACK, **(headers or {})}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                sent["Content-Type"] = "application/json"
            conn.request(method, path, body=data, headers=sent)
            return Answer(conn.getresponse(), path)
        finally:
            conn.close()


class Answer:
    def __init__(self, response: http.client.HTTPResponse, path: str) -> None:
        self.request = {"PATH_INFO": path.split("?")[0]}  # as assert_problem reads it
        self.status_code = response.status
        self.headers = {k.lower(): v for k, v in response.getheaders()}
        self.content = response.read()

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()]

    def has_header(self, name: str) -> bool:
        return name.lower() in self.headers

    def json(self) -> Any:
        return json.loads(self.content)


def _server_env(shape: str, bouncer: pgbouncer.PgBouncer | None) -> dict[str, str]:
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "atlas-pooling-test-secret",
        "ALLOWED_HOSTS": LOOPBACK,
        # The web tier enqueues nothing in these scenarios (no subscriptions).
        "CELERY_BROKER_URL": "memory://",
    }
    if shape == "pgbouncer":
        assert bouncer is not None
        env |= {"DATABASE_URL": bouncer.url(), "ATLAS_DB_POOLING": "transaction"}
    else:
        env |= {
            "DATABASE_URL": database_url_for_workers(),
            "ATLAS_DB_POOL": "1",
            "ATLAS_DB_POOL_MIN_SIZE": "1",
            "ATLAS_DB_POOL_MAX_SIZE": str(pgbouncer.POOL_SIZE),
        }
    return env


@contextlib.contextmanager
def _gunicorn(env: dict[str, str], log: Path) -> Iterator[int]:
    port = pgbouncer.free_port()
    argv = [sys.executable, "-m", "gunicorn", "-c", "atlas/deploy/gunicorn.conf.py", "atlas.wsgi"]
    argv += ["--bind", f"{LOOPBACK}:{port}", "--workers", "2", "--threads", str(THREADS)]
    argv += ["--log-level", "warning"]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
                conn.request("GET", "/healthz", headers={"Host": LOOPBACK})
                if conn.getresponse().status == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


@pytest.fixture(scope="module", params=["pgbouncer", "django-pool"])
def live(request, django_db_setup, tmp_path_factory) -> Iterator[Live]:
    """The live server in one shape, for the whole module (started once per shape)."""
    shape = request.param
    log = tmp_path_factory.mktemp(f"live-{shape}") / "gunicorn.log"
    with contextlib.ExitStack() as stack:
        bouncer = None
        if shape == "pgbouncer":
            bouncer = stack.enter_context(pgbouncer.running(connection.settings_dict))
        port = stack.enter_context(_gunicorn(_server_env(shape, bouncer), log))
        yield Live(shape, port, bouncer)
    # Both processes have exited, so their sessions end within moments: PostgreSQL's
    # DROP DATABASE (the end of the test run) waits for that.


@pytest.fixture
def token(transactional_db, make_user, namespace) -> str:
    """A writer's API token (committed: the live server reads it)."""
    user = make_user("wendy", writer=[namespace.name])
    return api_token_create(user=user, name="live")[1]


def in_parallel(count: int, send: Callable[[int], Answer]) -> list[Answer]:
    """``send(i)`` for i in range(count), all released together; their answers."""
    barrier = threading.Barrier(count)
    answers: list[Any] = [None] * count
    failures: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            answers[index] = send(index)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert failures == []
    return answers


# --- 1. live scenarios ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_entity_writes_reads_and_history(live, token):
    created = live.call("PUT", ENTITY, {"content": {"v": 1}}, token=token)
    assert created.status_code == 201, created.content
    assert created["ETag"] == '"1"'
    assert live.call("GET", ENTITY, token=token)["ETag"] == '"1"'
    patched = live.call(
        "PATCH", ENTITY, {"patch": {"w": 2}}, token=token, headers={"If-Match": '"1"'}
    )
    assert patched.status_code == 200, patched.content
    stale = live.call(
        "PATCH", ENTITY, {"patch": {"w": 3}}, token=token, headers={"If-Match": '"1"'}
    )
    assert_problem(stale, 412)
    ops = [
        {"op": "put", "namespace": "acme.orders", "kind": "event", "slug": f"s-{i}", "content": {}}
        for i in range(3)
    ]
    assert live.call("POST", f"{API}/batch", {"ops": ops}, token=token).status_code == 200
    history = live.call("GET", f"{ENTITY}/history", token=token).json()["results"]
    assert [r["after_version"] for r in history] == [2, 1]
    assert live.call("GET", ENTITY, token=token).json()["content"] == {"v": 1, "w": 2}
    assert Changeset.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_idempotency_key_replays_and_refuses(live, token):
    first = live.call(
        "PUT", ENTITY, {"content": {"v": 1}}, token=token, headers={"Idempotency-Key": "k"}
    )
    assert first.status_code == 201
    again = live.call(
        "PUT", ENTITY, {"content": {"v": 1}}, token=token, headers={"Idempotency-Key": "k"}
    )
    assert again.status_code == 201
    assert again.content == first.content
    assert again[REPLAYED] == "true"
    other = live.call(
        "PUT", ENTITY, {"content": {"v": 2}}, token=token, headers={"Idempotency-Key": "k"}
    )
    assert_problem(other, 422)
    record = IdempotencyRecord.objects.get()
    assert record.changeset_id == Changeset.objects.get().id
    assert record.lease_until is None, "a stored response ends the lease"


@pytest.mark.django_db(transaction=True)
def test_fifty_concurrent_identical_keyed_requests_write_one_changeset(live, token):
    def send(_: int) -> Answer:
        body = {"content": {"title": "Order placed"}}
        return live.call("PUT", ENTITY, body, token=token, headers={"Idempotency-Key": "race"})

    answers = in_parallel(50, send)
    assert Changeset.objects.count() == 1
    assert {a.status_code for a in answers} <= {201, 409}, [a.content for a in answers]
    originals = [a for a in answers if a.status_code == 201 and not a.has_header(REPLAYED)]
    assert len(originals) == 1
    for answer in answers:
        if answer.status_code == 201:
            assert answer.content == originals[0].content
        else:
            assert_problem(answer, 409)
    retry = send(0)
    assert retry[REPLAYED] == "true"
    assert retry.content == originals[0].content


@pytest.mark.django_db(transaction=True)
def test_concurrent_patches_lose_no_update(live, token):
    assert live.call("PUT", ENTITY, {"content": {}}, token=token).status_code == 201
    count = 20
    answers = in_parallel(
        count, lambda i: live.call("PATCH", ENTITY, {"patch": {f"f{i}": i}}, token=token)
    )
    assert [a.status_code for a in answers] == [200] * count
    final = live.call("GET", ENTITY, token=token)
    assert final.json()["content"] == {f"f{i}": i for i in range(count)}
    assert final["ETag"] == f'"{count + 1}"'
    assert Changeset.objects.count() == count + 1


@pytest.mark.django_db(transaction=True)
def test_if_match_race_has_one_winner(live, token):
    assert live.call("PUT", ENTITY, {"content": {"v": 0}}, token=token).status_code == 201
    count = 20
    answers = in_parallel(
        count,
        lambda i: live.call(
            "PUT", ENTITY, {"content": {"v": i + 1}}, token=token, headers={"If-Match": '"1"'}
        ),
    )
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [412] * (count - 1)
    winner = next(a for a in answers if a.status_code == 200)
    assert (
        live.call("GET", ENTITY, token=token).json()["content"]
        == winner.json()["entity"]["content"]
    )
    assert Changeset.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_feed_pages_through_every_changeset_in_seq_order(live, token):
    for i in range(7):
        path = f"{API}/entities/acme.orders/event/e-{i}"
        assert live.call("PUT", path, {"content": {"i": i}}, token=token).status_code == 201
    seqs: list[int] = []
    page = live.call("GET", f"{API}/changes?limit=3", token=token).json()
    while page["records"]:
        seqs += [r["seq"] for r in page["records"]]
        page = live.call("GET", f"{API}/changes?limit=3&since={page['next_cursor']}", token=token)
        page = page.json()
    expected = list(Changeset.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == expected
    assert len(seqs) == 7
    assert page["watermark"]["seq"] == expected[-1]


pgbouncer_shape_only = pytest.mark.parametrize("live", ["pgbouncer"], indirect=True)


@pgbouncer_shape_only
@pytest.mark.django_db(transaction=True)
def test_traffic_really_went_through_pgbouncer_in_transaction_mode(live, token):
    assert live.bouncer is not None
    config = {row["key"]: row["value"] for row in live.bouncer.admin("SHOW CONFIG")}
    assert config["pool_mode"] == "transaction"

    def transactions() -> int:
        stats = live.bouncer.admin("SHOW STATS")
        return next(
            int(r["total_xact_count"]) for r in stats if r["database"] == live.bouncer.dbname
        )

    before = transactions()
    assert live.call("PUT", ENTITY, {"content": {"v": 1}}, token=token).status_code == 201
    assert transactions() > before
    pools = [p for p in live.bouncer.admin("SHOW POOLS") if p["database"] == live.bouncer.dbname]
    assert pools and all(p["pool_mode"] == "transaction" for p in pools)


def _relay(env: dict[str, str], log: Path) -> subprocess.Popen:
    argv = [sys.executable, "manage.py", "journal_relay", "--report-seconds", "0"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            argv,
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pgbouncer_shape_only
@pytest.mark.parametrize("session", ["none: polls", "direct URL: listens"])
@pytest.mark.django_db(transaction=True)
def test_the_journal_relay_publishes_through_pgbouncer(live, token, session, tmp_path):
    assert live.bouncer is not None
    env = {**_server_env("pgbouncer", live.bouncer), "ATLAS_JOURNAL_RELAY_IN_WORKER": "0"}
    if session.startswith("direct"):
        # Only a NOTIFY can wake it within the test: the poll interval is far longer.
        env |= {"ATLAS_DIRECT_DATABASE_URL": database_url_for_workers()}
        env |= {"ATLAS_JOURNAL_RELAY_POLL_SECONDS": "600"}
        says = "listening on atlas_journal"
    else:
        env |= {"ATLAS_JOURNAL_RELAY_POLL_SECONDS": "0.2"}
        says = "polling every 0.2 s"
    log = tmp_path / "relay.log"
    relay = _relay(env, log)
    try:
        try:
            wait_for(lambda: says in log.read_text(), timeout=60, what=says)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the relay said:\n{log.read_text()}") from None
        for i in range(3):
            path = f"{API}/entities/acme.orders/event/r-{i}"
            assert live.call("PUT", path, {"content": {}}, token=token).status_code == 201
        try:
            wait_for(lambda: not journal.outstanding().exists(), timeout=30, what="publishing")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the relay said:\n{log.read_text()}") from None
        assert relay.poll() is None, log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(relay.pid, signal.SIGTERM)
        relay.wait(20)
    assert Changeset.objects.count() == 3


# --- 2. what the settings are for ---------------------------------------------------------


@pytest.fixture(scope="module")
def bouncer(django_db_setup) -> Iterator[pgbouncer.PgBouncer]:
    with pgbouncer.running(connection.settings_dict) as running:
        yield running


def test_server_side_prepared_statements_break_behind_pgbouncer_in_transaction_mode(bouncer):
    """Why ATLAS_DB_PREPARED_STATEMENTS is off under transaction pooling (PgBouncer 1.18
    has no protocol-level prepared statements): two clients on one server connection."""
    single = bouncer.url("single")
    with (
        psycopg.connect(single, autocommit=True) as a,
        psycopg.connect(single, autocommit=True) as b,
    ):
        a.execute("SELECT 1", prepare=True)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            b.execute("SELECT 2", prepare=True)
        # What Atlas does there instead (prepare_threshold None): unnamed statements.
        assert a.execute("SELECT %s::int", [3], prepare=False).fetchone() == (3,)
        assert b.execute("SELECT %s::int", [4], prepare=False).fetchone() == (4,)


def _settings_under(**env: str) -> dict[str, Any]:
    code = (
        "import json; from atlas import settings as s; d = s.DATABASES['default'];"
        "o = dict(d['OPTIONS']); o['pool'] = sorted(o['pool']) if 'pool' in o else None;"
        "print(json.dumps({'options': o, 'max_age': d['CONN_MAX_AGE'],"
        " 'no_named_cursors': d.get('DISABLE_SERVER_SIDE_CURSORS', False),"
        " 'prepared': s.ATLAS_DB_PREPARED_STATEMENTS}))"
    )
    environment = {**os.environ, "DATABASE_URL": "postgres://u@db.invalid/atlas", **env}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=environment, capture_output=True, check=True
    )
    return json.loads(out.stdout)


def test_transaction_pooling_keeps_nothing_in_the_session():
    pooled = _settings_under(ATLAS_DB_POOLING="transaction")
    assert pooled["options"]["prepare_threshold"] is None
    assert "options" not in pooled["options"], "a pooler refuses startup options"
    assert pooled["no_named_cursors"] is True
    assert pooled["prepared"] is False
    direct = _settings_under()
    assert direct["options"]["prepare_threshold"] == 5
    assert "idle_in_transaction_session_timeout" in direct["options"]["options"]
    assert direct["no_named_cursors"] is False


def test_parallel_query_is_off_unless_asked_for():
    # A Gather's workers cost more to start than a page's statement (docs/deploy.md).
    assert "max_parallel_workers_per_gather=0" in _settings_under()["options"]["options"]
    allowed = _settings_under(ATLAS_DB_PARALLEL="1")["options"]["options"]
    assert "max_parallel_workers_per_gather" not in allowed


@pytest.mark.django_db
def test_the_sessions_atlas_opens_run_no_parallel_workers():
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_parallel_workers_per_gather")
        assert cursor.fetchone()[0] == "0"


def test_djangos_pool_is_configured_with_a_reset_and_no_persistent_connections():
    pooled = _settings_under(ATLAS_DB_POOL="1", ATLAS_DB_CONN_MAX_AGE="60")
    assert pooled["options"]["pool"] == ["max_lifetime", "max_size", "min_size", "reset", "timeout"]
    assert pooled["max_age"] == 0


def test_bad_pooling_value_is_refused():
    with pytest.raises(subprocess.CalledProcessError) as failed:
        _settings_under(ATLAS_DB_POOLING="statement")
    assert b"ATLAS_DB_POOLING" in failed.value.stderr


@pytest.mark.django_db(transaction=True)
def test_the_pool_reset_ends_session_locks_and_listens():
    from psycopg_pool import ConnectionPool

    url = database_url_for_workers()
    with ConnectionPool(url, min_size=1, max_size=1, reset=reset_pooled_session) as pool:
        with pool.connection() as conn:
            conn.autocommit = True
            conn.execute("SELECT pg_advisory_lock(42)")
            conn.execute("LISTEN atlas_journal")
            pid = conn.info.backend_pid
        with pool.connection() as conn:
            assert conn.info.backend_pid == pid, "the same session, returned and lent again"
            locks = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s", [pid]
            ).fetchone()[0]
            channels = conn.execute("SELECT count(*) FROM pg_listening_channels()").fetchone()[0]
    assert (locks, channels) == (0, 0)


# --- 3. the lease --------------------------------------------------------------------------


@pytest.fixture
def leases(settings) -> None:
    settings.ATLAS_DB_POOLING = "transaction"


@pytest.fixture
def api(client_for, writer):
    return client_for(writer)


def put(api: Any, content: dict[str, Any], key: str, **headers: str) -> Any:
    return api.put(
        ENTITY, {"content": content}, format="json", headers={"Idempotency-Key": key, **headers}
    )


class Killed(BaseException):
    """The process is killed outright: the attempt's lease is never ended."""


@pytest.fixture
def killed_outright(monkeypatch) -> Callable[..., None]:
    """The next write's process dies before (or right after) its commit, leaving its lease."""

    def arm(*, after_commit: bool) -> None:
        real = views.changeset_apply

        def die(**kwargs: Any) -> Any:
            if after_commit:
                real(**kwargs)
            raise Killed

        monkeypatch.setattr(views, "changeset_apply", die)
        monkeypatch.setattr(idempotency, "_end_lease", lambda record: None)

    return arm


def _lease_runs_out() -> None:
    IdempotencyRecord.objects.update(lease_until=timezone.now() - timedelta(seconds=1))


def test_a_claim_holds_a_lease_while_it_runs(leases, api, monkeypatch, settings):
    settings.ATLAS_IDEMPOTENCY_LEASE_SECONDS = 600
    real = views.changeset_apply
    seen: dict[str, Any] = {}

    def look(**kwargs: Any) -> Any:
        seen["record"] = IdempotencyRecord.objects.get()
        seen["now"] = timezone.now()
        return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", look)
    assert put(api, {"v": 1}, "k").status_code == 201
    lease = seen["record"].lease_until - seen["now"]
    assert timedelta(seconds=590) < lease <= timedelta(seconds=600)
    assert IdempotencyRecord.objects.get().lease_until is None


def test_a_killed_attempt_is_in_progress_until_its_lease_runs_out(
    leases, api, monkeypatch, killed_outright
):
    killed_outright(after_commit=False)
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k")
    monkeypatch.undo()
    busy = put(api, {"v": 1}, "k")
    assert_problem(busy, 409)
    assert busy.json()["type"] != idempotency.ResponseLost.type
    assert_problem(put(api, {"v": 2}, "k"), 422)
    _lease_runs_out()
    retry = put(api, {"v": 1}, "k")
    assert retry.status_code == 201
    assert not retry.has_header(REPLAYED)
    assert Changeset.objects.count() == 1
    assert IdempotencyRecord.objects.get().changeset_id == Changeset.objects.get().id


def test_a_killed_attempt_whose_write_committed_is_lost_once_its_lease_runs_out(
    leases, api, monkeypatch, killed_outright
):
    killed_outright(after_commit=True)
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k")
    monkeypatch.undo()
    assert put(api, {"v": 1}, "k").json()["type"] != idempotency.ResponseLost.type
    _lease_runs_out()
    body = assert_problem(put(api, {"v": 1}, "k"), 409)
    assert body["changeset_id"] == str(Changeset.objects.get().id)
    assert Changeset.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_an_attempt_outliving_its_lease_is_superseded_and_writes_nothing(
    leases, make_user, namespace, client_for, monkeypatch
):
    """The fence: a retry takes over a slow attempt's key, and the slow attempt's
    write, arriving before the retry's, rolls back; the retry's stands."""
    api = client_for(make_user("wendy", writer=[namespace.name]))
    real = views.changeset_apply
    seen: dict[str, Any] = {}
    retry_claimed, first_done = threading.Event(), threading.Event()

    def retry() -> None:  # another worker, with its own session and context
        try:
            seen["retry"] = put(api, {"v": 1}, "k")
        finally:
            connection.close()

    def slow(**kwargs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            _lease_runs_out()  # the first attempt has been running too long
            seen["thread"] = threading.Thread(target=retry)
            seen["thread"].start()
            assert retry_claimed.wait(timeout=60)  # the retry took the key over
        else:
            retry_claimed.set()
            assert first_done.wait(timeout=60)
        return real(**kwargs)

    monkeypatch.setattr(views, "changeset_apply", slow)
    first = put(api, {"v": 1}, "k")
    first_done.set()
    seen["thread"].join(timeout=60)
    monkeypatch.undo()
    body = assert_problem(first, 409)
    assert body["detail"] == idempotency.MSG_SUPERSEDED
    assert seen["retry"].status_code == 201, seen["retry"].content
    assert seen["retry"].json()["status"] == "created"
    changeset = Changeset.objects.get()  # the retry's only
    record = IdempotencyRecord.objects.get()
    assert record.changeset_id == changeset.id
    replay = put(api, {"v": 1}, "k")
    assert replay[REPLAYED] == "true"
    assert replay.content == seen["retry"].content


def test_a_record_left_by_a_session_lock_attempt_is_taken_over(api, monkeypatch, settings):
    """Switching ATLAS_DB_POOLING on a running deployment: a dead record without a lease."""
    settings.ATLAS_DB_POOLING = ""
    monkeypatch.setattr(views, "changeset_apply", lambda **kwargs: _raise(Killed()))
    with pytest.raises(Killed):
        put(api, {"v": 1}, "k")
    monkeypatch.undo()
    assert IdempotencyRecord.objects.get().lease_until is None
    settings.ATLAS_DB_POOLING = "transaction"
    assert_problem(put(api, {"v": 2}, "k"), 422)
    retry = put(api, {"v": 1}, "k")
    assert retry.status_code == 201
    assert not retry.has_header(REPLAYED)
    assert Changeset.objects.count() == 1


def _raise(exc: BaseException) -> Any:
    raise exc
