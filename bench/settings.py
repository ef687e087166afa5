"""Benchmark settings: Atlas's, plus the plain baseline model and (when installed) the peers.

Only the benchmark database (``atlas_bench``, see bench/_setup.py) is ever
migrated with these settings, so the peers' tables never reach a real one.
``pip install -r bench/requirements.txt`` installs the peers; without them (CI)
the suite runs Atlas, the plain baseline and raw psycopg only.
"""

from __future__ import annotations

import importlib.util
import os

from atlas.settings import *  # noqa: F403
from atlas.settings import INSTALLED_APPS as _ATLAS_APPS

PEER_MODULES = ("simple_history", "reversion", "pgtrigger", "pghistory")
PEERS_INSTALLED = all(importlib.util.find_spec(name) is not None for name in PEER_MODULES)
# ATLAS_BENCH_PEERS=0 leaves them out even when installed.
BENCH_PEERS = PEERS_INSTALLED and os.environ.get("ATLAS_BENCH_PEERS", "1") != "0"

INSTALLED_APPS = [*_ATLAS_APPS, "bench.plain"]
if BENCH_PEERS:
    INSTALLED_APPS += ["simple_history", "reversion", "pgtrigger", "pghistory", "bench.peers"]

ROOT_URLCONF = "bench.urls"
