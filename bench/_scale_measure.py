"""bench/scale.py's timing: every page at every size, interleaved, in-process and over gunicorn.

**Sizes interleaved.** Each size is served in-process by a child process of its own
(``scale.py --serve <size>``: Django binds one database per process), and the parent
drives them in lockstep: page P at 100k, then at 1M, then at 10M (the order rotating
each round), then the next page. A load spike from whoever else shares the machine
then hits every size alike, so the ratio between sizes is not the difference between
two runs made minutes apart. The same over HTTP: one gunicorn per size (``make run``'s
command line: 2 sync workers, atlas.settings), requests interleaved the same way.

**Warm**, here: before anything is timed, one pass requests every page once at every
size as each user (over HTTP twice: once per gunicorn worker, roughly), so whatever a
page reads is in PostgreSQL's shared buffers or in the operating system's page cache
(the databases share both, as they would share a server); then ``runs`` rounds. The
warm pass's request is kept as "first" (after a fresh connection).

In-process, each request is split into SQL time (every statement timed at the client,
bench/_sqltime.py), rendering (templates or DRF's JSON renderer, less SQL run while
rendering: :class:`RenderTimer`) and the rest of Python (middleware, auth, view, ORM
and serializers); and the database's buffer counters say how many blocks the timed
request found in shared buffers and how many it read from outside them (the OS page
cache or the disk).
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from _sqltime import buffer_counts, slowest_plan, sql_timer

Key = tuple[str, str]  # user, page label


def rows_shown(content_type: str, body: bytes) -> int | None:
    """Entries on the page: an API page's ``results``, an admin changelist's rows."""
    if content_type.startswith("application/json"):
        data = json.loads(body)
        return len(data["results"]) if isinstance(data, dict) and "results" in data else None
    html = body.decode(errors="replace")
    start = html.find('id="result_list"')
    if start < 0:
        return None
    body_at = html.find("<tbody", start)
    end = html.find("</table>", start)
    return html.count("<tr", body_at, end) if body_at >= 0 else 0


# --- the child: one size, in-process ---------------------------------------------------


class RenderTimer:
    """Time spent rendering responses: Django templates (the outermost
    ``Template.render``: includes nest inside it) and the API's JSON renderer
    (``atlas.api.renderers``, and DRF's, which it falls back to: the outermost
    call counts), less any SQL run while rendering (a lazy queryset a template
    iterates is SQL time)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.depth = 0
        self.sql: Any = None

    def install(self) -> None:
        from django.template import base
        from rest_framework import renderers

        from atlas.api import renderers as atlas_renderers

        base.Template.render = self.wrap(base.Template.render)  # type: ignore[method-assign]
        for json_renderer in (renderers.JSONRenderer, atlas_renderers.JSONRenderer):
            json_renderer.render = self.wrap(json_renderer.render)  # type: ignore[method-assign]

    def wrap(self, render: Callable[..., Any]) -> Callable[..., Any]:
        timer = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if timer.depth:
                return render(*args, **kwargs)
            timer.depth += 1
            sql0 = timer.sql.ms if timer.sql is not None else 0.0
            started = time.perf_counter()
            try:
                return render(*args, **kwargs)
            finally:
                took = (time.perf_counter() - started) * 1000
                sql1 = timer.sql.ms if timer.sql is not None else 0.0
                timer.ms += took - (sql1 - sql0)
                timer.depth -= 1

        return timed


RENDER = RenderTimer()


_PROTOCOL: list[TextIO] = []


def claim_stdout() -> TextIO:
    """The protocol stream: this process's original stdout, from now on written only by
    :func:`serve`; whatever else prints (a population's progress, Django, PostgreSQL
    notices) goes to stderr. A size server calls it first thing, before it populates."""
    if not _PROTOCOL:
        _PROTOCOL.append(os.fdopen(os.dup(1), "w"))
        sys.stdout.flush()
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    return _PROTOCOL[0]


def serve(
    urls: dict[Key, str],
    get: Callable[[str, str], Any],
    hello: dict[str, Any],
    describe: Callable[[Any], dict[str, Any]] | None = None,
) -> None:
    """Answer the parent's requests on the protocol stream until told to stop.

    ``get(user, url)`` makes one request and returns its response; ``describe(response)``
    says what the page showed (default: rows and bytes of a Django response). The
    protocol is the process's original stdout; everything printed after this point
    (Django, PostgreSQL notices) goes to stderr instead.
    """
    RENDER.install()
    proto = claim_stdout()
    send = lambda message: (proto.write(json.dumps(message) + "\n"), proto.flush())  # noqa: E731
    send(hello)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["op"] == "quit":
            return
        key = (msg["user"], msg["page"])
        if msg["op"] == "time":
            send(time_one(get, key, urls[key]))
        else:
            send(final(get, key, urls[key], describe or shown))


def time_one(get: Callable[[str, str], Any], key: Key, url: str) -> dict[str, Any]:
    hit0, read0 = buffer_counts()
    with sql_timer() as timer:
        RENDER.ms, RENDER.sql = 0.0, timer
        started = time.perf_counter()
        response = get(key[0], url)
        wall = (time.perf_counter() - started) * 1000
        RENDER.sql = None
    hit1, read1 = buffer_counts()
    return {
        "wall": wall,
        "sql": timer.ms,
        "render": RENDER.ms,
        "hit": hit1 - hit0,
        "read": read1 - read0,
        "status": response.status_code,
    }


def shown(response: Any) -> dict[str, Any]:
    """What a Django response showed: its rows (:func:`rows_shown`) and bytes."""
    return {
        "rows": rows_shown(response.get("Content-Type", ""), response.content),
        "bytes": len(response.content),
    }


def final(
    get: Callable[[str, str], Any],
    key: Key,
    url: str,
    describe: Callable[[Any], dict[str, Any]],
) -> dict[str, Any]:
    """One more request: what the page showed, its statements, its slowest plan."""
    with sql_timer() as timer:
        response = get(key[0], url)
    slowest, plan = slowest_plan(timer.statements)
    return {
        "url": url,
        "status": response.status_code,
        "queries": len(timer.statements),
        "slowest_query_ms": slowest.ms if slowest else 0.0,
        **describe(response),
        "plan": plan if len(plan) <= 4000 else plan[:4000] + "\n… (truncated)",
    }


# --- the parent ------------------------------------------------------------------------


class SizeServer:
    """The parent's handle on one size's child (``argv`` starts it)."""

    def __init__(self, size: str, argv: list[str]) -> None:
        self.size = size
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.process.stdout.readline() if self.process.stdout else ""
        if not line:
            raise RuntimeError(f"the {size} server did not start (exit {self.process.wait()})")
        hello = json.loads(line)
        self.urls: dict[Key, str] = {(u, p): url for u, p, url in hello["pages"]}
        self.headers: dict[str, dict[str, dict[str, str]]] = hello["headers"]
        self.facts: dict[str, Any] = hello["facts"]
        self.database_url: str = hello["database_url"]

    def call(self, op: str, key: Key) -> dict[str, Any]:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"op": op, "user": key[0], "page": key[1]}) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        if self.process.poll() is None and self.process.stdin:
            self.process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.process.stdin.close()
            self.process.wait(30)


def rotated(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return items[by:] + items[:by]


def in_process(
    servers: list[SizeServer], keys: list[Key], runs: int, *, seconds: float | None = None
) -> dict[str, dict[Key, dict]]:
    """Every page at every size: the warm pass, ``runs`` interleaved rounds, the final
    request; per size, per page, the record bench/_scale_report.py reads.

    ``seconds``: a page whose timed requests (all sizes) have taken that long gets no
    more rounds once it has three (a request that takes seconds at the largest size
    is not timed thirty times).
    """
    first: dict[str, dict[Key, dict]] = {}
    for key in keys:  # the warm pass, size by size within each page
        for s in servers:
            first.setdefault(s.size, {})[key] = s.call("time", key)
    samples: dict[str, dict[Key, list[dict]]] = {s.size: {k: [] for k in keys} for s in servers}
    spent = dict.fromkeys(keys, 0.0)
    for r in range(runs):
        for key in keys:
            if seconds is not None and r >= 3 and spent[key] > seconds * 1000:
                continue
            for s in rotated(servers, r):
                got = s.call("time", key)
                samples[s.size][key].append(got)
                spent[key] += got["wall"]
    out: dict[str, dict[Key, dict]] = {}
    for s in servers:
        out[s.size] = {}
        for key in keys:
            got = samples[s.size][key]
            wall = [g["wall"] for g in got]
            out[s.size][key] = {
                "page": key[1],
                "user": key[0],
                "first": first[s.size][key]["wall"],
                "p50": statistics.median(wall),
                "samples": wall,
                "sql_ms": statistics.median(g["sql"] for g in got),
                "python_ms": statistics.median(g["wall"] - g["sql"] for g in got),
                "render_ms": statistics.median(g["render"] for g in got),
                "buffers_hit": statistics.median(g["hit"] for g in got),
                "buffers_read": statistics.median(g["read"] for g in got),
                "buffers_read_max": max(g["read"] for g in got),
                "first_buffers_read": first[s.size][key]["read"],
                **s.call("final", key),
            }
    return out


def over_http(
    servers: list[SizeServer], keys: list[Key], runs: int, *, seconds: float | None = None
) -> dict[str, dict[Key, dict]]:
    """The same pages over one gunicorn per size (``make run``'s command line), interleaved
    as in-process (``seconds`` as there); no Celery worker (a read enqueues nothing)."""
    from contextlib import ExitStack

    from _stack import Broker, Stack

    with ExitStack() as stack:
        ports = {}
        for s in servers:
            broker = Broker("memory://", f"atlas-bench-scale-{os.getpid()}-{s.size}", False)
            web = Stack(
                broker,
                settings="atlas.settings",
                worker=False,
                extra_env={"DATABASE_URL": s.database_url},
            )
            ports[s.size] = stack.enter_context(web).port
        print(f"gunicorn per size: {web.shown('web')}", flush=True)
        return _interleave_http(servers, keys, runs, ports, seconds)


def _interleave_http(
    servers: list[SizeServer],
    keys: list[Key],
    runs: int,
    ports: dict[str, int],
    seconds: float | None,
) -> dict[str, dict[Key, dict]]:
    def get(s: SizeServer, key: Key) -> tuple[int, float]:
        url = s.urls[key]
        auth = s.headers[key[0]]["api" if url.startswith("/api/") else "admin"]
        started = time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", ports[s.size], timeout=60)
        try:
            conn.request("GET", url, headers={"Host": "127.0.0.1", **auth})
            response = conn.getresponse()
            response.read()
        finally:
            conn.close()
        return response.status, (time.perf_counter() - started) * 1000

    first: dict[str, dict[Key, float]] = {s.size: {} for s in servers}
    for _ in range(2):  # the warm pass, once per worker (roughly: the kernel picks)
        for key in keys:
            for s in servers:
                first[s.size].setdefault(key, get(s, key)[1])
    samples: dict[str, dict[Key, list[float]]] = {s.size: {k: [] for k in keys} for s in servers}
    status: dict[str, dict[Key, int]] = {s.size: {} for s in servers}
    spent = dict.fromkeys(keys, 0.0)
    for r in range(runs):
        for key in keys:
            if seconds is not None and r >= 3 and spent[key] > seconds * 1000:
                continue
            for s in rotated(servers, r):
                code, took = get(s, key)
                samples[s.size][key].append(took)
                status[s.size][key] = code
                spent[key] += took
    return {
        s.size: {
            key: {
                "http_p50": statistics.median(samples[s.size][key]),
                "http_first": first[s.size][key],
                "http_status": status[s.size][key],
                "http_samples": samples[s.size][key],
            }
            for key in keys
        }
        for s in servers
    }
