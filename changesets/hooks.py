"""Work that must commit or roll back together with a changeset.

Some callers need a row of their own written in the write's transaction, so
that it exists exactly when the changeset does: the ``Idempotency-Key``
record notes which changeset its request wrote, so a retry after a crash
can tell "nothing was written, run it again" from "written, the response was
lost". The write service is the only place that sees that transaction, and it
must not know about HTTP; callers register a callback for the duration of
their call instead.

A context variable, not a global, so concurrent requests (threads) and
nested calls never see each other's callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

WriteHook = Callable[[Any], None]

_hooks: ContextVar[tuple[WriteHook, ...]] = ContextVar("atlas_write_hooks", default=())


@contextmanager
def in_write_transaction(hook: WriteHook) -> Iterator[None]:
    """Call ``hook(changeset)`` inside every write transaction started in this block.

    The hook runs after the changeset row is inserted and before commit; an
    exception it raises rolls the whole write back.
    """
    token = _hooks.set((*_hooks.get(), hook))
    try:
        yield
    finally:
        _hooks.reset(token)


def has_write_hooks() -> bool:
    """Whether a write now must keep its transaction open for hooks (the write
    service's unlocked path commits in its log statement, so it cannot)."""
    return bool(_hooks.get())


def run_write_hooks(changeset: Any) -> None:
    """Called by the write service inside its transaction, once per changeset."""
    for hook in _hooks.get():
        hook(changeset)
