"""Reading the environment, and the two values every other part starts from.

``DEBUG`` comes first because the other parts' defaults depend on it
(development defaults apply only while it is on); ``BASE_DIR`` is the
checkout, where the embedded database, broker folder and static files live.
"""

from __future__ import annotations

import os
from pathlib import Path

# atlas/settings/env.py -> the checkout.
BASE_DIR = Path(__file__).resolve().parent.parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


DEBUG = env_bool("DEBUG", default=True)
