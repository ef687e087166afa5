"""Atlas settings, all from the environment (the table under "Configuration" in README.md).

This is Atlas's own project's settings module (``DJANGO_SETTINGS_MODULE=
atlas.settings``). The apps never assume it: a host project has its own, and
the apps read every ``ATLAS_*`` setting through ``atlas.conf``, which
supplies the defaults (docs/embedding.md).

Development defaults apply only while ``DEBUG`` is on; with ``DEBUG`` off a
missing ``SECRET_KEY`` is an error rather than a silently insecure default.

The settings live in one module per concern, gathered here. Each part reads
the environment itself and imports what it needs of another only from
``env``, so no part depends on the order they are gathered in:

- ``env``: the environment readers, ``BASE_DIR`` and ``DEBUG``;
- ``security``: secret key, hosts, HTTPS and proxies, CSP, development-only switches;
- ``base``: Django itself (apps, middleware, templates, auth, static, DRF, logging);
- ``database``: the connection, pooling, session options, read replicas;
- ``limits``: request size limits, Idempotency-Key lifetimes;
- ``celery``: Celery, the journal relay and sweep, webhooks;
- ``archive``: archive signing, segments and retention.

A project that extends these settings imports them as one module
(``from atlas.settings import *``, as ``bench/settings.py`` does).
"""

from __future__ import annotations

from atlas.settings.archive import *  # noqa: F403
from atlas.settings.base import *  # noqa: F403
from atlas.settings.celery import *  # noqa: F403
from atlas.settings.database import *  # noqa: F403
from atlas.settings.env import *  # noqa: F403
from atlas.settings.limits import *  # noqa: F403
from atlas.settings.security import *  # noqa: F403
