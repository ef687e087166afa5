"""Shared fixtures: users with roles, API clients, and a write helper.

Everything runs against real PostgreSQL (the embedded cluster, or
``DATABASE_URL``). Celery runs tasks eagerly here; tests that need a real
worker say so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from atlas.celery import app as celery_app
from atlas.services import api_token_create
from changesets.archive import boundary
from changesets.models import Rpc
from changesets.ops import DeleteOp, PatchOp, PutOp
from changesets.outbox import journal
from changesets.selectors import changeset_ids
from changesets.services.apply import ApplyResult, changeset_apply
from entities.services import role_grant
from entities.store import EntityKey, baseline
from tests.entities.factories import (
    NamespaceFactory,
    StaffFactory,
    SuperuserFactory,
    UserFactory,
)

celery_app.conf.task_always_eager = True
celery_app.conf.task_eager_propagates = True


@pytest.fixture(autouse=True)
def _no_archive_cut_cached():
    """Every test starts on a log with no archive cut, known without a query: the cut is
    cached per process (``changesets.archive.boundary``), and a test's rolled-back cut
    must not leak into the next. The archiver drops the cache when it moves reads."""
    boundary.prime(None)
    yield
    boundary.prime(None)


@pytest.fixture(autouse=True)
def _no_changeset_id_map():
    """Every test starts with no map of changeset ids to partitions, known without a
    query (``changesets.selectors.changeset_ids``), so a test's statement counts do
    not depend on whether an earlier test filled the map; its own tests fill it."""
    changeset_ids.prime()
    yield
    changeset_ids.prime()


@pytest.fixture
def not_eager():
    """Celery as deployed (tasks published, not run in place) for one test."""
    from tests.changesets.worker_helpers import celery_configured

    with celery_configured(task_always_eager=False):
        yield


@pytest.fixture
def publish_committed() -> Callable[[], list[str]]:
    """Do the post-commit work of every changeset committed so far, now.

    A write publishes nothing itself: the journal relay is the one path from a
    commit to a worker (docs/feed.md), and no relay runs in these tests. A test
    that needs the hooks run and the pumps woken calls this where a worker
    would have run the relay's task; it returns each entry's outcome.
    """

    def run() -> list[str]:
        ids = list(journal.outstanding().values_list("pk", flat=True))
        return [journal.journal_publish(changeset_id=pk) for pk in ids]

    return run


@pytest.fixture
def locked_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write takes the locked path (BEGIN, lock, log, COMMIT), even a single
    write outside a transaction: for tests that act between the log statement and
    COMMIT, which the unlocked path (one autocommit statement) does not have."""
    from changesets.services import apply

    monkeypatch.setattr(apply, "_may_write_unlocked", lambda *args: False)


@pytest.fixture
def namespace(db):
    """An unprotected namespace ``acme.orders``."""
    return NamespaceFactory(name="acme.orders")


@pytest.fixture
def protected_namespace(db):
    return NamespaceFactory(name="acme.core", protected=True)


@pytest.fixture
def make_user(db) -> Callable[..., Any]:
    """``make_user("alice", reader=["acme.orders"], writer=[...], maintainer=[...])``.

    ``superuser=True`` holds every role; ``staff=True`` only opens the admin (no role).
    """

    def make(
        username: str, *, superuser: bool = False, staff: bool = False, **roles: list[str]
    ) -> Any:
        factory = SuperuserFactory if superuser else StaffFactory if staff else UserFactory
        user = factory(username=username)
        for role, names in roles.items():
            for name in names:
                role_grant(namespace=NamespaceFactory(name=name), principal=user, role=role)
        return user

    return make


@pytest.fixture
def staff(db):
    """The operator: a superuser (``is_staff`` alone holds no namespace role)."""
    return SuperuserFactory(username="root")


@pytest.fixture
def writer(make_user, namespace):
    return make_user("wendy", writer=[namespace.name])


@pytest.fixture
def client_for() -> Callable[[Any], APIClient]:
    """An APIClient authenticated with an API token of the user's (the real auth path)."""
    keys: dict[Any, str] = {}  # one token per user and test: keys cannot be read back

    def make(user: Any | None) -> APIClient:
        client = APIClient()
        if user is not None:
            if user.pk not in keys:
                keys[user.pk] = api_token_create(user=user, name="test")[1]
            client.credentials(HTTP_AUTHORIZATION=f"Token {keys[user.pk]}")
        return client

    return make


@pytest.fixture
def write() -> Callable[..., ApplyResult]:
    """Write through the service: ``write(actor, "ns/kind/slug", {...})``; None deletes."""

    def apply(
        actor: Any, path: str, content: dict | None, *, patch: bool = False, **kw
    ) -> ApplyResult:
        key = EntityKey(*path.split("/"))
        if content is None:
            op, rpc = DeleteOp(key), Rpc.DELETE_ENTITY
        elif patch:
            op, rpc = PatchOp(key, content), Rpc.PATCH_ENTITY
        else:
            op, rpc = PutOp(key, content), Rpc.PUT_ENTITY
        return changeset_apply(store=baseline, actor=actor, ops=[op], rpc=rpc, **kw)

    return apply
