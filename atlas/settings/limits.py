"""Atlas's limits on what a request may carry, and how long an Idempotency-Key lasts."""

from __future__ import annotations

from atlas.settings.env import env_float, env_int

ATLAS_MAX_CONTENT_BYTES = env_int("ATLAS_MAX_CONTENT_BYTES", 1024 * 1024)
ATLAS_MAX_BATCH_OPS = env_int("ATLAS_MAX_BATCH_OPS", 10_000)
# A whole request body may carry many contents (a batch), so its cap is separate.
ATLAS_MAX_BODY_BYTES = env_int("ATLAS_MAX_BODY_BYTES", 64 * 1024 * 1024)
ATLAS_IDEMPOTENCY_TTL_HOURS = env_int("ATLAS_IDEMPOTENCY_TTL_HOURS", 24)
# Under transaction pooling an Idempotency-Key's attempt holds a lease, not a session
# lock (atlas.api.idempotency): a retry within this long of a killed attempt is "in
# progress" (409). Longer than a request can run (gunicorn's default timeout is 30 s);
# a slower attempt is not unsafe, only superseded: its write rolls back.
ATLAS_IDEMPOTENCY_LEASE_SECONDS = env_float("ATLAS_IDEMPOTENCY_LEASE_SECONDS", 60)

# Django's own body cap answers 400; Atlas enforces ATLAS_MAX_BODY_BYTES itself to answer 413.
DATA_UPLOAD_MAX_MEMORY_SIZE = None
