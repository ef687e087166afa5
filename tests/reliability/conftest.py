"""Fixtures for the bad-input and leak harnesses (items 10-13 of the reliability issue).

Fuzzers create subscriptions with whatever URLs they generate; nothing they do may
reach the network. Not autouse: the concurrency and fault harnesses beside these
deliver webhooks to receivers on loopback on purpose. Modules opt in with
``pytestmark = pytest.mark.usefixtures("no_network")``.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest


@pytest.fixture
def no_network(monkeypatch):
    """Host names never reach a resolver (every one "resolves" to 127.0.0.1), no
    webhook is ever delivered, and subscription pumps are not even queued."""

    def loopback(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[tuple]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", loopback)
    monkeypatch.setattr("changesets.outbox.pumps.enqueue_pump", lambda *args, **kwargs: None)

    def no_delivery(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a bad-input or leak test tried to deliver a webhook")

    monkeypatch.setattr("changesets.outbox.webhooks.post_json", no_delivery)
