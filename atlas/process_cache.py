"""A value each process keeps for a while instead of asking the database on every read.

Used where a read needs something that changes rarely and where a stale answer
is safe for a known reason, which the user states: the archive cut
(``changesets.archive.boundary``), the map of changeset ids to partitions
(``changesets.selectors.changeset_ids``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Expiring(Generic[T]):
    """``load()``'s answer, kept for ``seconds()`` (asked after each load, so a
    setting or a patched constant takes effect on the next one), thread-safe."""

    def __init__(self, load: Callable[[], T], seconds: Callable[[], float]) -> None:
        self._load = load
        self._seconds = seconds
        self._lock = threading.Lock()
        self._kept: tuple[float, T] | None = None

    def get(self) -> T:
        now = time.monotonic()
        with self._lock:
            kept = self._kept
        if kept is not None and kept[0] > now:
            return kept[1]
        value = self._load()
        ttl = self._seconds()
        with self._lock:
            self._kept = (now + ttl, value)
        return value

    def forget(self) -> None:
        """The next :meth:`get` loads again."""
        with self._lock:
            self._kept = None

    def prime(self, value: T, *, seconds: float = float("inf")) -> None:
        """Keep ``value`` for ``seconds`` without loading (tests set a known answer)."""
        with self._lock:
            self._kept = (time.monotonic() + seconds, value)
