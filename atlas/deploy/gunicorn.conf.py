"""gunicorn's settings for Atlas: request limits, and errors as problem+json.

    gunicorn -c atlas/deploy/gunicorn.conf.py atlas.wsgi --bind ...

Used by ``make run`` (atlas/devrun.py), the Docker image and docker-compose.yml.
gunicorn refuses an over-long request line (414) or header (431), and a
malformed request (400), before Django sees it, and answered with an HTML
page. API.md says errors are problem+json, never an HTML page; so this file
replaces the one function gunicorn writes those answers with
(``gunicorn.util.write_error``, called by every worker class's
``handle_error``) with one that writes RFC 9457 problem+json. It is loaded
in the master before the workers fork, so every worker uses it.

The limits stay where gunicorn puts them, and are what the API accepts: the
longest legitimate request line (a path of namespace/kind/slug plus filters
and a page token) is well under 4,094 bytes, and Atlas uses no large
headers. Raising them so that Django could answer instead would let every
connection make gunicorn buffer that much more. ``instance`` is empty in
these answers: the request was refused before its target was read.
``tests/atlas/test_gunicorn.py`` runs the real server with this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gunicorn import util

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project, for atlas.*

from atlas.exceptions import PROBLEM_BASE  # noqa: E402 - needs the path above

limit_request_line = 4094  # bytes of "GET /path?query HTTP/1.1"
limit_request_fields = 100  # header fields
limit_request_field_size = 8190  # bytes of one header field

# The problem type of each status gunicorn answers itself; others use its reason phrase.
PROBLEM_TYPES = {400: "bad-request", 403: "forbidden", 500: "internal-error"}


def problem_bytes(status_int: int, reason: str, mesg: str) -> bytes:
    """The whole HTTP response gunicorn sends for a request it refused."""
    kind = PROBLEM_TYPES.get(status_int) or reason.lower().replace(" ", "-")
    body = json.dumps(
        {
            "type": PROBLEM_BASE + kind,
            "title": reason,
            "status": status_int,
            "detail": mesg or reason,
            "instance": "",
        }
    ).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("latin-1") + body


def write_problem(sock, status_int: int, reason: str, mesg: str) -> None:
    """Drop-in for ``gunicorn.util.write_error`` (same arguments)."""
    util.write_nonblock(sock, problem_bytes(status_int, reason, mesg))


util.write_error = write_problem
