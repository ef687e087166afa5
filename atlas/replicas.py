"""Read replicas: which database a request's reads go to, and how far behind it is.

``ATLAS_READ_DATABASE_URLS`` names streaming replicas of the primary (settings
make them aliases ``replica1``, ...). The log's read endpoints — history,
changeset lists, namespace revisions, as-of reads, blame, diff, feed pulls and
the admin's log browsing — are marked with :func:`replica_read`;
:class:`ReplicaReadMiddleware` picks a replica for such a request and
:class:`ReplicaRouter` sends that request's reads of the log's tables there.
Everything else reads the primary:

- writes, and every read inside a transaction on the primary or after one
  in the same request (the request is pinned to the primary the moment a
  statement runs inside a transaction there, or a log model is written: a
  transaction on the primary is a write path, and a write path reads its own
  writes; ``_watch_primary`` sees the write path's raw SQL, the router its
  models);
- identity and authorization (users, tokens, sessions, grants): only the
  log's apps (``LOG_APPS``) are routed, and the role lookup runs on the
  primary's prepared cursor, so a revoked grant never lingers on a replica;
- a request with ``X-Atlas-Consistency: strong``, or under ``X-Atlas-Branch``
  (a branch is a workspace its users write and read back), and reads by id of
  what a write just returned (a changeset, the current entity).

Why a replica's answers are never inconsistent, only late: ``seq`` is drawn
under the log head's row lock, held until commit (invariant 6), so commit
records reach the WAL in seq order and a replica replaying the WAL always
holds a prefix of the log — every changeset up to some seq and none after.
Reading the same prefix twice gives the same answer; reading a longer one
(the primary) extends it. Two things cross servers and need care:

1. A feed cursor names a seq. On a replica that has not replayed it, "seq >
   cursor" finds nothing, and the view answers an empty page with the same
   cursor: never an error, never a step back (``changesets.api.feed``).
2. A page token from a fresher server could name a position the replica has
   not reached, and the rows between would be skipped. When replicas are
   configured each token records ``r``, the head seq of the server that
   served the page, read after its rows; a replica whose head (read before
   the request's first read) is below ``r`` hands the request to the primary
   (:func:`need_replayed`).

``X-Atlas-Replica-Lag-Seq`` on a response that read a replica is the primary's
head seq read after the view minus the replica's head seq read before it: an
upper bound on how many committed changesets (of every branch) the response
may be missing. It costs one primary-key read on each side.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

# The apps whose tables the read endpoints read: the log, entities, branches.
LOG_APPS = frozenset({"changesets", "entities", "branches"})
LAG_HEADER = "X-Atlas-Replica-Lag-Seq"
CONSISTENCY_META = "HTTP_X_ATLAS_CONSISTENCY"
BRANCH_META = "HTTP_X_ATLAS_BRANCH"
# The admin's read-only log pages (the revert preview reads the primary: it is a precondition).
ADMIN_URL_NAMES = frozenset(
    {
        "changesets_changeset_changelist",
        "changesets_changeset_change",
        "changesets_revision_changelist",
        "changesets_revision_change",
        "changesets_revision_entity_history",
        "changesets_revision_entity_as_of",
    }
)
_HEAD_SQL = "SELECT seq FROM changesets_loghead WHERE id = 1"
_MARK = "atlas_replica_read"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class ReadState:
    """One request's choice: the replica, what it had replayed, whether it was used."""

    alias: str
    # The replica's head seq, read before the view: it holds at least this prefix.
    replayed: int
    # Set once the request must read the primary (a write, a transaction, a token).
    pinned: bool = False
    # Some read went to the replica: the response carries the lag header.
    used: bool = False


_state: ContextVar[ReadState | None] = ContextVar("atlas_read_state", default=None)


def read_aliases() -> list[str]:
    return list(getattr(settings, "ATLAS_READ_DATABASE_ALIASES", []))


def head_seq(alias: str) -> int:
    """The log head's seq on ``alias`` (0 before the first changeset)."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_HEAD_SQL)
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def _replica_alias() -> str | None:
    """The replica this request may read now, or None (the primary)."""
    state = _state.get()
    if state is None or state.pinned:
        return None
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        state.pinned = True  # a transaction on the primary: read its own writes from now on
        return None
    state.used = True
    return state.alias


@contextmanager
def serving(alias: str) -> Iterator[ReadState]:
    """Read the log from replica ``alias`` inside the block, as a replica request does
    (for code outside a request: scripts, tests)."""
    state = ReadState(alias=alias, replayed=head_seq(alias))
    token = _state.set(state)
    try:
        with connections[DEFAULT_DB_ALIAS].execute_wrapper(_watch_primary):
            yield state
    finally:
        _state.reset(token)


def _watch_primary(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
    """Pin the request to the primary at its first statement inside a transaction there.

    The write path runs raw SQL (no model, so the router never sees it): a
    statement on the primary inside a transaction is how a write shows itself.
    Every later read of the request then sees what it wrote.
    """
    state = _state.get()
    if state is not None and not state.pinned and context["connection"].in_atomic_block:
        state.pinned = True
    return execute(sql, params, many, context)


def wrote() -> None:
    """The request wrote on the primary: read its own writes from now on.

    For the write service's unlocked single write, which commits in one
    autocommit statement, so no statement of it runs inside a transaction for
    :func:`_watch_primary` to see.
    """
    state = _state.get()
    if state is not None:
        state.pinned = True


def read_connection() -> BaseDatabaseWrapper:
    """The connection for a read-only raw SQL statement of a log read (the admin's)."""
    return connections[_replica_alias() or DEFAULT_DB_ALIAS]


def need_replayed(seq: int) -> None:
    """The request needs every changeset up to ``seq``: the primary, if the replica lags."""
    state = _state.get()
    if state is not None and not state.pinned and seq > state.replayed:
        state.pinned = True


def served_seq() -> int:
    """The head seq of the server this request reads now, read now (for page tokens)."""
    state = _state.get()
    alias = state.alias if state is not None and not state.pinned else DEFAULT_DB_ALIAS
    return head_seq(alias)


class ReplicaRouter:
    """Reads of the log's apps go to the request's replica; all else to the primary."""

    def db_for_read(self, model: type, **hints: Any) -> str | None:
        if model._meta.app_label not in LOG_APPS:  # type: ignore[attr-defined]
            return None
        return _replica_alias()

    def db_for_write(self, model: type, **hints: Any) -> str:
        # Django also asks this for reads meant to precede a write (get_or_create,
        # select_for_update). A token's last-used stamp is no reason to leave the replica.
        state = _state.get()
        if state is not None and model._meta.app_label in LOG_APPS:  # type: ignore[attr-defined]
            state.pinned = True  # read-your-writes for the rest of the request
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        same = {DEFAULT_DB_ALIAS, *read_aliases()}
        return True if {obj1._state.db, obj2._state.db} <= same else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db in read_aliases() else None


def replica_read(when: Callable[[HttpRequest], bool] | None = None) -> Callable[[F], F]:
    """Mark a view method as servable by a replica (``when(request)`` may narrow it)."""

    def mark(func: F) -> F:
        setattr(func, _MARK, when or (lambda request: True))
        return func

    return mark


def has_as_of(request: HttpRequest) -> bool:
    return bool(request.GET.get("as_of") or request.GET.get("as_of_time"))


def wants_strong(request: HttpRequest) -> bool:
    return request.META.get(CONSISTENCY_META, "").strip().lower() == "strong"


def _eligible(request: HttpRequest, view_func: Any) -> bool:
    if request.method not in ("GET", "HEAD") or wants_strong(request):
        return False
    match = getattr(request, "resolver_match", None)
    if match is not None and match.url_name in ADMIN_URL_NAMES:
        return True
    if request.META.get(BRANCH_META):
        return False
    cls, actions = getattr(view_func, "cls", None), getattr(view_func, "actions", None)
    if cls is None:
        return False
    method = request.method.lower()
    name = (actions.get(method) or actions.get("get")) if actions else method
    rule = getattr(getattr(cls, name or "", None), _MARK, None)
    return bool(rule and rule(request))


class ReplicaReadMiddleware:
    """Chooses a replica for an eligible request and puts the lag on its response.

    After the authentication middleware, so the session and user are read from
    the primary. A replica that cannot be reached leaves the request on the
    primary (logged), rather than failing a read the primary can answer.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not read_aliases():
            return self.get_response(request)
        token = _state.set(None)
        try:
            with connections[DEFAULT_DB_ALIAS].execute_wrapper(_watch_primary):
                response = self.get_response(request)
            state = _state.get()
            if state is not None and state.used:
                self._put_lag(response, state)
            return response
        finally:
            _state.reset(token)

    @staticmethod
    def _put_lag(response: HttpResponse, state: ReadState) -> None:
        try:
            primary = head_seq(DEFAULT_DB_ALIAS)
        except DatabaseError:  # the primary is away: the replica's answer stands, unmeasured
            logger.warning("primary unreachable; no %s", LAG_HEADER, exc_info=True)
            return
        response.headers[LAG_HEADER] = str(max(0, primary - state.replayed))

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> None:
        aliases = read_aliases()
        if not aliases or not _eligible(request, view_func):
            return None
        alias = random.choice(aliases)
        try:
            replayed = head_seq(alias)
        except DatabaseError:
            logger.warning("replica %s unreachable; reading the primary", alias, exc_info=True)
            return None
        _state.set(ReadState(alias=alias, replayed=replayed))
        return None
