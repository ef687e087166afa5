"""Read replicas (atlas.replicas) against a real streaming replica.

The module's fixture starts a private primary and a ``pg_basebackup`` hot
standby (tests/atlas/replica_cluster.py), points the ``default`` alias at the
primary and adds ``replica1`` for the standby for these tests only, and
migrates the primary. Lag is made deterministic by pausing the standby's WAL
replay (``pg_wal_replay_pause()``): whatever commits afterwards is on the
primary only. Without binaries to start the pair the module skips, saying why.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, transaction
from django.test import override_settings

from atlas import replicas
from atlas.settings import read_databases
from changesets.models import Revision
from tests.atlas import replica_cluster

REPLICA = "replica1"
STRONG = {"HTTP_X_ATLAS_CONSISTENCY": "strong"}
LAG = replicas.LAG_HEADER
NS = "acme.orders"
replica_db = pytest.mark.django_db(transaction=True, databases=["default", REPLICA])


def test_each_read_url_becomes_a_replica_alias_with_the_primarys_options():
    primary = {"CONN_MAX_AGE": 60, "OPTIONS": {"connect_timeout": 5, "keepalives": 1}}
    aliases = read_databases(" postgres://u@r1:5433/atlas, postgres://u@r2/atlas ,", primary)
    assert list(aliases) == ["replica1", "replica2"]
    assert aliases["replica1"]["HOST"] == "r1" and aliases["replica1"]["PORT"] == 5433
    assert aliases["replica2"]["OPTIONS"] == primary["OPTIONS"]
    assert aliases["replica2"]["CONN_MAX_AGE"] == 60
    assert aliases["replica1"]["TEST"] == {"MIRROR": "default"}
    assert read_databases("", primary) == {}


@override_settings(ATLAS_READ_DATABASE_ALIASES=[REPLICA])
def test_migrations_never_run_on_a_replica():
    router = replicas.ReplicaRouter()
    assert router.allow_migrate(REPLICA, "changesets") is False
    assert router.allow_migrate("default", "changesets") is None


# --- the real pair --------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair(django_db_setup, django_db_blocker) -> Iterator[replica_cluster.Pair]:
    started, why = replica_cluster.start()
    if started is None:
        pytest.skip(f"no streaming replica: {why}")
    default = connections["default"]
    saved = dict(default.settings_dict)
    with django_db_blocker.unblock():
        default.close()
        default.settings_dict.update(
            NAME="postgres", HOST="127.0.0.1", PORT=started.primary_port, USER="postgres"
        )
        default.settings_dict["PASSWORD"] = ""
        replica_settings: dict[str, Any] = {
            **default.settings_dict,
            "OPTIONS": dict(default.settings_dict["OPTIONS"]),
            "PORT": started.replica_port,
            # Never flushed or created by the test machinery: it is read-only.
            "TEST": {**default.settings_dict["TEST"], "MIRROR": "default"},
        }
        connections.settings[REPLICA] = replica_settings
        aliases = override_settings(ATLAS_READ_DATABASE_ALIASES=[REPLICA])
        aliases.enable()
        try:
            call_command("migrate", verbosity=0, database="default")
            yield started
        finally:
            aliases.disable()
            connections[REPLICA].close()
            del connections[REPLICA]
            del connections.settings[REPLICA]
            default.close()
            default.settings_dict.clear()
            default.settings_dict.update(saved)
            started.stop()


def _sql(alias: str, sql: str, params: list[Any] | None = None) -> Any:
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def caught_up() -> None:
    """Wait until the replica has replayed everything the primary has written so far."""
    target = _sql("default", "SELECT pg_current_wal_lsn()::text")
    for _ in range(600):
        if _sql(REPLICA, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]):
            return
        time.sleep(0.05)
    raise AssertionError("the replica did not catch up")


@pytest.fixture
def paused(pair) -> Iterator[None]:
    """Catch the replica up, then stop its replay (resumed after the test)."""
    caught_up()
    _sql(REPLICA, "SELECT pg_wal_replay_pause()::text")
    try:
        yield
    finally:
        _sql(REPLICA, "SELECT pg_wal_replay_resume()::text")
        caught_up()


def _put(client, slug: str, content: dict) -> dict:
    response = client.put(
        f"/api/v1/entities/{NS}/event/{slug}", {"content": content}, format="json"
    )
    assert response.status_code in (200, 201), response.content
    return response.json()


@pytest.fixture
def alice(pair, make_user, client_for):
    return client_for(make_user("alice", writer=[NS]))


@replica_db
def test_history_is_read_from_the_replica_and_says_how_far_it_lags(alice):
    _put(alice, "a", {"n": 1})
    _put(alice, "a", {"n": 2})
    caught_up()
    _sql(REPLICA, "SELECT pg_wal_replay_pause()::text")
    try:
        _put(alice, "a", {"n": 3})
        _put(alice, "b", {"n": 1})

        stale = alice.get(f"/api/v1/entities/{NS}/event/a/history")
        assert [r["after_version"] for r in stale.json()["results"]] == [2, 1]
        assert stale[LAG] == "2"

        strong = alice.get(f"/api/v1/entities/{NS}/event/a/history", **STRONG)
        assert [r["after_version"] for r in strong.json()["results"]] == [3, 2, 1]
        assert LAG not in strong
    finally:
        _sql(REPLICA, "SELECT pg_wal_replay_resume()::text")
    caught_up()
    fresh = alice.get(f"/api/v1/entities/{NS}/event/a/history")
    assert [r["after_version"] for r in fresh.json()["results"]] == [3, 2, 1]
    assert fresh[LAG] == "0"


@replica_db
def test_writes_and_reads_of_the_current_entity_use_the_primary(alice, paused):
    _put(alice, "a", {"n": 1})
    written = _put(alice, "a", {"n": 2})
    current = alice.get(f"/api/v1/entities/{NS}/event/a")
    assert current.json()["version"] == 2 and LAG not in current
    # As-of reads go to the replica, which has not seen these changesets: not there yet.
    as_of = alice.get(f"/api/v1/entities/{NS}/event/a", {"as_of": written["changeset"]["id"]})
    assert as_of.status_code == 404 and as_of[LAG] == "2"
    strong = alice.get(
        f"/api/v1/entities/{NS}/event/a", {"as_of": written["changeset"]["id"]}, **STRONG
    )
    assert strong.json()["version"] == 2


@replica_db
def test_a_read_after_a_write_in_the_same_request_goes_to_the_primary(pair, alice, write):
    _put(alice, "a", {"n": 1})
    caught_up()
    _sql(REPLICA, "SELECT pg_wal_replay_pause()::text")
    try:
        from django.contrib.auth import get_user_model

        actor = get_user_model().objects.get(username="alice")
        with replicas.serving(REPLICA) as state:
            assert Revision.objects.count() == 1  # the replica
            assert state.used and not state.pinned
            with transaction.atomic():
                assert Revision.objects.count() == 1  # inside a transaction: the primary
            assert state.pinned
        with replicas.serving(REPLICA) as state:
            write(actor, f"{NS}/event/b", {"n": 1})
            assert state.pinned
            assert Revision.objects.count() == 2  # its own write, from the primary
        with replicas.serving(REPLICA):
            assert Revision.objects.count() == 1  # a fresh request reads the replica again
    finally:
        _sql(REPLICA, "SELECT pg_wal_replay_resume()::text")
    caught_up()


@replica_db
def test_feed_traversal_across_a_paused_replay_never_skips_or_goes_back(alice):
    """A reader pulls one changeset a page, from the replica and (strong) the primary
    in turn, while the replica's replay is paused and then resumed."""
    for n in range(3):
        _put(alice, f"k{n}", {"n": n})
    caught_up()
    _sql(REPLICA, "SELECT pg_wal_replay_pause()::text")
    seen: list[int] = []
    cursor: str | None = None

    def pull(**headers: str) -> Any:
        nonlocal cursor
        params = {"limit": 1, **({"since": cursor} if cursor else {})}
        page = alice.get("/api/v1/changes", params, **headers)
        assert page.status_code == 200
        body = page.json()
        seen.extend(r["seq"] for r in body["records"])
        if not body["records"] and cursor:
            assert body["next_cursor"] == cursor  # an empty page keeps the reader in place
        cursor = body["next_cursor"]
        return page

    try:
        for n in range(3, 6):
            _put(alice, f"k{n}", {"n": n})
        for _ in range(3):
            assert pull()[LAG] == "3"  # the replica's three
        behind = pull()  # the replica has no more: empty page, same cursor
        assert behind.json()["records"] == [] and behind.json()["watermark"]["seq"] == 3
        pull(**STRONG)  # the primary moves the reader to seq 4
        ahead = pull()  # a cursor the replica has not reached: empty, same cursor
        assert ahead.json()["records"] == []
        assert seen == [1, 2, 3, 4]
    finally:
        _sql(REPLICA, "SELECT pg_wal_replay_resume()::text")
    caught_up()
    pull()
    pull()
    assert pull().json()["records"] == []
    assert seen == [1, 2, 3, 4, 5, 6]


@replica_db
def test_a_page_token_from_a_fresher_server_is_not_resumed_by_a_lagging_replica(alice):
    for n in range(2):
        _put(alice, f"k{n}", {"n": n})
    caught_up()
    _sql(REPLICA, "SELECT pg_wal_replay_pause()::text")
    try:
        for n in range(2, 4):
            _put(alice, f"k{n}", {"n": n})
        first = alice.get("/api/v1/changesets", {"page_size": 1}, **STRONG).json()
        assert [c["seq"] for c in first["results"]] == [4]
        # Resumed on the replica (seq 2), seq 3 would be skipped: the primary serves it.
        second = alice.get(
            "/api/v1/changesets", {"page_size": 1, "page_token": first["next_page_token"]}
        )
        assert [c["seq"] for c in second.json()["results"]] == [3]
        # A traversal begun on the replica continues there.
        stale = alice.get("/api/v1/changesets", {"page_size": 1})
        assert [c["seq"] for c in stale.json()["results"]] == [2] and stale[LAG] == "2"
        more = alice.get(
            "/api/v1/changesets", {"page_size": 1, "page_token": stale.json()["next_page_token"]}
        )
        assert [c["seq"] for c in more.json()["results"]] == [1] and more[LAG] == "2"
    finally:
        _sql(REPLICA, "SELECT pg_wal_replay_resume()::text")
    caught_up()


@replica_db
def test_the_admin_browses_the_log_on_the_replica(pair, alice, make_user, client):
    _put(alice, "a", {"n": 1})
    caught_up()
    client.force_login(make_user("root", superuser=True))
    page = client.get("/admin/changesets/changeset/")
    assert page.status_code == 200 and page[LAG] == "0"
    assert LAG not in client.get("/admin/changesets/changeset/", **STRONG)
