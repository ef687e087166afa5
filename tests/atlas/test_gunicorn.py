"""What gunicorn refuses itself answers problem+json, against the real server.

Starts ``gunicorn -c atlas/deploy/gunicorn.conf.py atlas.wsgi`` (the command
line of ``make run``, the image and compose) on a free loopback port, like
tests/reliability/harness.py does, and sends it requests over raw HTTP.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from atlas import devrun
from tests.atlas.test_errors import PROBLEM_JSON

BASE_DIR = Path(__file__).resolve().parents[2]
CONFIG = "atlas/deploy/gunicorn.conf.py"
LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[int]:
    port = free_port()
    log = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    env = {
        **os.environ,
        "DEBUG": "0",
        "SECRET_KEY": "atlas-gunicorn-test-secret",
        "ALLOWED_HOSTS": LOOPBACK,
        # Settings need a server named; these requests never reach the database.
        "DATABASE_URL": os.environ.get("DATABASE_URL") or "postgres://unused@127.0.0.1/unused",
    }
    argv = [sys.executable, "-m", "gunicorn", "-c", CONFIG, "atlas.wsgi"]
    argv += ["--bind", f"{LOOPBACK}:{port}", "--workers", "1", "--log-level", "warning"]
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
                if get(port, "/healthz").status == 200:
                    break
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


class Answer:
    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.content_type = response.getheader("Content-Type")
        self.body = response.read()


def get(port: int, target: str, headers: dict[str, str] | None = None) -> Answer:
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
    try:
        connection.request("GET", target, headers=headers or {})
        return Answer(connection.getresponse())
    finally:
        connection.close()


def assert_gunicorn_problem(answer: Answer, status: int) -> dict:
    assert answer.status == status, answer.body
    assert answer.content_type == PROBLEM_JSON
    body = json.loads(answer.body)
    assert set(body) == {"type", "title", "status", "detail", "instance"}
    assert body["status"] == status
    assert body["type"].startswith("https://atlas.dev/problems/")
    return body


def test_a_6000_byte_query_string_answers_414_problem_json(server):
    body = assert_gunicorn_problem(get(server, "/api/v1/entities?q=" + "x" * 6000), 414)
    assert body["type"].endswith("/uri-too-long")


def test_a_100_kb_header_answers_431_problem_json(server):
    answer = get(server, "/api/v1/entities", {"X-Padding": "a" * 100_000})
    body = assert_gunicorn_problem(answer, 431)
    assert body["type"].endswith("/request-header-fields-too-large")


def test_a_malformed_request_line_answers_400_problem_json(server):
    with socket.create_connection((LOOPBACK, server), timeout=10) as s:
        s.sendall(b"NOT A REQUEST\r\n\r\n")
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"Content-Type: application/problem+json" in head
    assert json.loads(body)["type"].endswith("/bad-request")


def test_requests_within_the_limits_still_reach_django(server):
    answer = get(server, "/api/v1/entities?q=" + "x" * 3000, {"X-Padding": "a" * 8000})
    assert answer.status == 401  # Django's answer: no credentials
    assert answer.content_type == PROBLEM_JSON
    assert get(server, "/healthz").status == 200


def test_every_way_atlas_starts_gunicorn_loads_the_config():
    web = devrun.commands("127.0.0.1", "8000")["web"]
    assert web[web.index("-c") + 1] == CONFIG
    dockerfile = (BASE_DIR / "atlas/deploy/Dockerfile").read_text()
    assert f'"-c", "{CONFIG}"' in dockerfile
    compose = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
    assert f"gunicorn -c {CONFIG} atlas.wsgi" in " ".join(compose["services"]["web"]["command"])
