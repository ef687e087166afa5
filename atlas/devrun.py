"""Run the web server and a Celery worker (with embedded beat) together: ``make run``.

Why a module rather than shell job control: both children must stop when
either dies, and Ctrl-C or SIGTERM must reach each exactly once so that each
shuts down gracefully (a second SIGINT would make Celery do a cold shutdown).
So the children get their own sessions, out of reach of the terminal's
signals, and this supervisor forwards SIGTERM to them:

1. start gunicorn (``atlas.wsgi``) on ``HOST:PORT`` and ``celery worker -B``;
2. wait until a signal arrives or a child exits;
3. send SIGTERM to whatever still runs, wait up to ``GRACE_SECONDS`` (a second
   Ctrl-C cuts that short), then SIGKILL what is left.

Exits 0 after a requested shutdown, else with the status of the child that died.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

BASE_DIR = Path(__file__).resolve().parent.parent
GRACE_SECONDS = 20.0
# Request limits and problem+json for what gunicorn refuses itself (docs/deploy.md).
GUNICORN_CONFIG = "atlas/deploy/gunicorn.conf.py"


def commands(host: str, port: str) -> dict[str, list[str]]:
    """The child command lines, by name."""
    bind = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    state_dir = Path(os.environ.get("ATLAS_STATE_DIR", BASE_DIR / ".atlas"))
    state_dir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    web = [py, "-m", "gunicorn", "-c", GUNICORN_CONFIG, "atlas.wsgi", "--bind", bind]
    web += ["--workers", "2"]
    web += ["--access-logfile", "-", "--graceful-timeout", "10"]
    worker = [py, "-m", "celery", "-A", "atlas", "worker", "-B", "--loglevel=INFO"]
    worker += ["--schedule", str(state_dir / "celerybeat-schedule")]
    return {"web": web, "worker": worker}


class Supervisor:
    """Owns the children and the shutdown state."""

    def __init__(self) -> None:
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.signals: list[int] = []  # appended by the handler, acted on by run()
        self.stopping = False
        self.deadline = 0.0

    def start(self, cmds: dict[str, list[str]]) -> None:
        for name, argv in cmds.items():
            print(f"devrun: starting {name}: {' '.join(argv)}", flush=True)
            self.children[name] = subprocess.Popen(argv, cwd=BASE_DIR, start_new_session=True)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Only record it: signalling children from here could race run()'s poll().
        self.signals.append(signum)

    def stop(self) -> None:
        self.stopping = True
        self.deadline = time.monotonic() + GRACE_SECONDS
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def sweep(self) -> None:
        """Kill what a child left behind in its process group (after a SIGKILL, say)."""
        for child in self.children.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)

    def run(self) -> int:
        status = 0
        while True:
            running = [c for c in self.children.values() if c.poll() is None]
            if not running:
                self.sweep()
                return status
            if self.signals and not self.stopping:
                print(f"devrun: {signal.Signals(self.signals[0]).name}, stopping", flush=True)
                self.stop()
            if len(self.signals) > 1:  # asked twice: stop waiting
                self.deadline = 0.0
            if not self.stopping:
                for name, child in self.children.items():
                    if child.returncode is not None:
                        print(f"devrun: {name} exited ({child.returncode}), stopping", flush=True)
                        code = child.returncode
                        status = 128 - code if code < 0 else code or 1
                        self.stop()
                        break
            elif time.monotonic() >= self.deadline:
                for name, child in self.children.items():
                    if child.returncode is None:
                        print(f"devrun: {name} still running, killing it", flush=True)
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(child.pid, signal.SIGKILL)  # with its own children
                self.deadline = float("inf")  # killed once; now just wait for them
            time.sleep(0.2)


def main() -> int:
    host = os.environ.get("HOST") or "127.0.0.1"
    port = os.environ.get("PORT") or "8000"
    supervisor = Supervisor()
    signal.signal(signal.SIGINT, supervisor.on_signal)
    signal.signal(signal.SIGTERM, supervisor.on_signal)
    signal.signal(signal.SIGHUP, supervisor.on_signal)
    try:
        supervisor.start(commands(host, port))
    except OSError:  # a child could not start: take down any that did
        supervisor.stop()
        supervisor.run()
        raise
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
